// A Python object with torch.distributed.Store's methods as Tutti's rendezvous store: how
// tutti.init() and hvd.init() join a job through torchrun's store (python/tutti/_launcher.py), and
// how tutti.init(store=..., rank=..., size=...) joins through any store a caller has. Every call
// takes the GIL; the rendezvous runs with it released otherwise.
#pragma once

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tutti/rendezvous.hpp"
#include "tutti/tutti.hpp"
#include "tutti/types.hpp"

namespace tutti_python {

/// set(key, bytes), wait([key], timedelta), get(key) -> bytes, add(key, int) -> int: the methods
/// of torch.distributed.Store (TCPStore, FileStore, PrefixStore, HashStore).
class PyStore final : public tutti::KeyValueStore {
 public:
  explicit PyStore(pybind11::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    pybind11::gil_scoped_acquire gil;
    store_ = pybind11::object();
  }
  PyStore(const PyStore&) = delete;
  PyStore& operator=(const PyStore&) = delete;

  void set(const std::string& key, const std::string& value) override {
    call("set", [&] { store_.attr("set")(key, pybind11::bytes(value)); });
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string value;
    call("get", [&] {
      try {
        store_.attr("wait")(std::vector<std::string>{key}, timeout);
      } catch (const pybind11::error_already_set& e) {
        throw tutti::Error(tutti::ErrorCode::timeout, "tutti: joining the job: key '" + key + "' was not set within " +
                                                          std::to_string(timeout.count()) +
                                                          " ms (a rank did not arrive?): " + e.what());
      }
      value = store_.attr("get")(key).cast<std::string>();
    });
    return value;
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t total = 0;
    call("add", [&] { total = store_.attr("add")(key, delta).cast<std::int64_t>(); });
    return total;
  }

 private:
  // Python's errors (a store whose server went away) as tutti::Error, which the rendezvous expects.
  template <class Body>
  void call(const char* what, Body&& body) {
    pybind11::gil_scoped_acquire gil;
    try {
      body();
    } catch (const pybind11::error_already_set& e) {
      throw tutti::Error(tutti::ErrorCode::system,
                         std::string("tutti: the rendezvous store's ") + what + " failed: " + e.what());
    } catch (const pybind11::cast_error& e) {
      throw tutti::Error(tutti::ErrorCode::invalid_argument, std::string("tutti: the rendezvous store's ") + what +
                                                                 " returned the wrong type: " + e.what());
    }
  }

  pybind11::object store_;
};

/// tutti::init() when `store` is None (rank, size and timeout must be too), else tutti::init over
/// the Python store as `rank` of `size`. Called with the GIL held; waits without it.
inline tutti::Communicator join(const pybind11::object& store, std::optional<int> rank, std::optional<int> size,
                                std::optional<std::chrono::milliseconds> timeout) {
  if (store.is_none()) {
    if (rank || size)
      throw tutti::Error(tutti::ErrorCode::invalid_argument,
                         "init: rank and size are given with a store only (the launcher's variables say them)");
    pybind11::gil_scoped_release release;
    return tutti::init();
  }
  if (!rank || !size)
    throw tutti::Error(tutti::ErrorCode::invalid_argument, "init(store=...): rank and size are required");
  PyStore rendezvous(store);
  pybind11::gil_scoped_release release;
  return tutti::init(rendezvous, *rank, *size, timeout.value_or(std::chrono::milliseconds(0)));
}

}  // namespace tutti_python
