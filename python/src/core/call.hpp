// One path for every collective's blocking and nonblocking form: a binding prepares the call (its
// buffers checked, its arguments converted) with the GIL held, then runs it with the GIL released,
// either waiting (blocking) or handing back a Request that keeps the buffers alive.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "tutti/tutti.hpp"

namespace tutti_python {

namespace py = pybind11;

/// A call ready to start: `owners` keep its buffers alive; `start` issues it (nonblocking: as the
/// i… twin, returning its request; else blocking, returning an empty request). `start` touches no
/// Python object, so it runs without the GIL.
struct PreparedCall {
  std::vector<py::object> owners;
  std::function<tutti::Request(tutti::Communicator&, bool nonblocking)> start;
};

/// The handle of a nonblocking call, as Python sees it: the C++ request and the call, whose owners
/// keep the buffers alive (and whose `start` holds the v-collectives' counts), released once the
/// call completed (or, if the handle is dropped before, once a later sweep sees it complete).
class PyRequest {
 public:
  PyRequest(tutti::Request request, PreparedCall call);
  ~PyRequest();
  PyRequest(const PyRequest&) = delete;
  PyRequest& operator=(const PyRequest&) = delete;
  PyRequest(PyRequest&& other) noexcept;
  PyRequest& operator=(PyRequest&&) = delete;

  /// Blocks, without the GIL, until complete (true) or until `timeout` seconds passed (false);
  /// None waits for the operation's own deadline (from this call). With a timeout, that deadline
  /// counts from when the call was issued. Raises the operation's error.
  bool wait(const py::object& timeout);
  /// True when complete; raises the operation's error.
  bool test();

 private:
  void complete();  // drops the call and its owners (GIL held)
  tutti::Request request_;
  std::optional<PreparedCall> call_;  // empty once complete (or moved from)
  // When the call was issued: the operation's deadline counts from here in wait(timeout), so that
  // polling in short slices still ends in Timeout.
  std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

/// Runs `call` blocking, the GIL released while Tutti works.
void run_blocking(tutti::Communicator& comm, PreparedCall call);
/// Starts `call` nonblocking (GIL released while it is issued) and returns its handle.
PyRequest run_nonblocking(tutti::Communicator& comm, PreparedCall call);

/// A timeout in seconds (float, int or datetime.timedelta) as milliseconds, rounded up; None: 0
/// (the communicator's default). Raises invalid_argument when negative or not a number.
std::chrono::milliseconds milliseconds_of(const py::handle& timeout, const char* operation);

}  // namespace tutti_python
