// Argument checks shared by the implementations, and the choice of device (TUTTI_DEVICE).
#include "device/device.hpp"

#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include "core/env.hpp"
#include "device/checks.hpp"
#include "device/emulated.hpp"
#if defined(TUTTI_WITH_CUDA)
#include "device/cuda/cuda_device.hpp"
#endif

namespace tutti::device {

std::string Device::held_streams(std::chrono::milliseconds grace) const {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    std::string held = held_streams_now();
    if (held.empty() || std::chrono::steady_clock::now() >= deadline) return held;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
namespace detail {
namespace {

[[noreturn]] void invalid(const char* function, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, std::string("tutti::device::") + function + ": " + what);
}

bool overlap(std::uintptr_t x, std::uintptr_t y, std::size_t bytes) { return x != y && x < y + bytes && y < x + bytes; }

}  // namespace

void check_flag(const void* flag, const char* function) {
  if (flag == nullptr) invalid(function, "the flag is null");
  if (reinterpret_cast<std::uintptr_t>(flag) % alignof(std::uint32_t) != 0)
    invalid(function, "the flag is not 4-byte aligned");
}

void check_copy(const void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst == nullptr || src == nullptr) invalid("copy", std::string(dst == nullptr ? "dst" : "src") + " is null");
  if (overlap(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes))
    invalid("copy", "dst and src overlap (" + std::to_string(bytes) + " bytes)");
}

std::size_t checked_bytes(DataType type, const ReduceOp* op, std::size_t count, const char* function) {
  if (static_cast<unsigned>(type) > static_cast<unsigned>(DataType::f64))
    invalid(function, "invalid DataType value " + std::to_string(static_cast<int>(type)));
  if (op != nullptr && static_cast<unsigned>(*op) > static_cast<unsigned>(ReduceOp::avg))
    invalid(function, "invalid ReduceOp value " + std::to_string(static_cast<int>(*op)));
  const std::size_t element = size_of(type);
  if (count > std::numeric_limits<std::size_t>::max() / element)
    invalid(function, "count " + std::to_string(count) + " of " + std::string(to_string(type)) + " overflows");
  return count * element;
}

void check_element_pointer(const void* p, DataType type, const char* what, const char* function) {
  if (p == nullptr) invalid(function, std::string(what) + " is null");
  if (reinterpret_cast<std::uintptr_t>(p) % size_of(type) != 0)
    invalid(function, std::string(what) + " is not aligned to " + std::string(to_string(type)));
}

void check_overlap(const void* dst, const void* src, std::size_t bytes, const char* what, const char* function) {
  if (overlap(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes))
    invalid(function, std::string("dst and ") + what + " overlap without being equal");
}

}  // namespace detail

std::string_view to_string(Kind kind) { return kind == Kind::cuda ? "cuda" : "emulated"; }

bool built_with_cuda() {
#if defined(TUTTI_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Device> make_device(Kind kind, int ordinal) {
  if (kind == Kind::emulated) return std::make_unique<EmulatedDevice>(detail::strict_from_env(), ordinal);
  if (ordinal < 0)
    throw Error(ErrorCode::invalid_argument,
                "tutti::device: CUDA device " + std::to_string(ordinal) + " does not exist");
#if defined(TUTTI_WITH_CUDA)
  return cuda::make_cuda_device(ordinal);
#else
  throw Error(ErrorCode::unsupported, "tutti::device: this Tutti was built without CUDA (the toolkit was not found)");
#endif
}

Kind kind_from_env(Kind fallback) {
  const auto text = core::env("TUTTI_DEVICE");
  if (!text) return fallback;
  if (*text == "emulated") return Kind::emulated;
  if (*text == "cuda") return Kind::cuda;
  throw Error(ErrorCode::invalid_argument, "TUTTI_DEVICE: expected emulated or cuda, got '" + *text + "'");
}

std::unique_ptr<Device> open_device(Kind fallback, int ordinal) {
  return make_device(kind_from_env(fallback), ordinal);
}

}  // namespace tutti::device
