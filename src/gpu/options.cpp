// gpu::Options: the tutti::Options conversion, and the rules that tie Options::backend to
// Options::algorithm (include/tutti/gpu.hpp), checked before any backend sees the call.
#include <string>

#include "gpu/backend.hpp"
#include "tutti/gpu.hpp"

namespace tutti::gpu {

namespace {

bool in_range(Backend backend) { return backend >= Backend::automatic && backend <= Backend::nccl; }

}  // namespace

Options::Options(const tutti::Options& options) : algorithm(options.algorithm), timeout(options.timeout) {}

namespace detail {

void check_backend_options(const DeviceCall& call) {
  const auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::invalid_argument,
                "tutti::gpu: " + std::string(to_string(call.call.collective)) + ": " + why);
  };
  if (!in_range(call.backend))
    refuse("options.backend is not a valid gpu::Backend (" + std::to_string(static_cast<int>(call.backend)) + ")");
  const Algorithm algorithm = call.call.options.algorithm;
  const std::string asked = "options.backend " + std::string(to_string(call.backend));
  if (algorithm != Algorithm::automatic && (call.backend == Backend::ipc || call.backend == Backend::nccl))
    refuse(asked + " runs no host algorithm, but options.algorithm is " + std::string(to_string(algorithm)) +
           " (host_transfer's host collective)");
}

}  // namespace detail

}  // namespace tutti::gpu
