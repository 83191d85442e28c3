// gpu::Options: the backend's names, the tutti::Options spelling, and the rules that tie
// Options::backend to Options::algorithm (include/tutti/gpu.hpp), checked before any backend sees
// the call.
#include <iterator>
#include <string>

#include "gpu/backend.hpp"
#include "tutti/gpu.hpp"

namespace tutti::gpu {

namespace {

constexpr std::string_view backend_names[] = {"automatic", "host_transfer", "ipc", "nccl"};
static_assert(std::size(backend_names) == static_cast<std::size_t>(Backend::nccl) + 1);

bool in_range(Backend backend) { return static_cast<std::size_t>(backend) < std::size(backend_names); }

}  // namespace

std::string_view to_string(Backend backend) {
  return in_range(backend) ? backend_names[static_cast<std::size_t>(backend)] : "invalid";
}

std::optional<Backend> backend_from_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(backend_names); ++i)
    if (backend_names[i] == name) return static_cast<Backend>(i);
  return std::nullopt;
}

Options::Options(const tutti::Options& options) : algorithm(options.algorithm), timeout(options.timeout) {
  if (const auto named = detail::backend_of(options.algorithm)) {
    backend = *named;
    algorithm = Algorithm::automatic;
  }
}

namespace detail {

std::optional<Backend> backend_of(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::host_transfer:
      return Backend::host_transfer;
    case Algorithm::ipc:
      return Backend::ipc;
    case Algorithm::nccl:
      return Backend::nccl;
    default:
      return std::nullopt;
  }
}

void resolve_backend(DeviceCall& call) {
  const auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::invalid_argument,
                "tutti::gpu: " + std::string(to_string(call.call.collective)) + ": " + why);
  };
  if (!in_range(call.backend))
    refuse("options.backend is not a valid gpu::Backend (" + std::to_string(static_cast<int>(call.backend)) + ")");
  Algorithm& algorithm = call.call.options.algorithm;
  const std::string asked = "options.backend " + std::string(to_string(call.backend));
  if (const auto named = backend_of(algorithm)) {
    if (call.backend != Backend::automatic && call.backend != *named)
      refuse("options.algorithm " + std::string(to_string(algorithm)) + " names another backend than " + asked);
    call.backend = *named;
    algorithm = Algorithm::automatic;
  } else if (algorithm != Algorithm::automatic && (call.backend == Backend::ipc || call.backend == Backend::nccl)) {
    refuse(asked + " runs no host algorithm, but options.algorithm is " + std::string(to_string(algorithm)) +
           " (host_transfer's host collective)");
  }
}

}  // namespace detail

}  // namespace tutti::gpu
