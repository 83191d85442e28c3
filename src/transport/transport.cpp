#include "transport/transport.hpp"

#include <string>

namespace tutti::transport {

std::unique_ptr<NativeCollective> Transport::start_native(Algorithm algorithm, const NativeCall& call,
                                                          std::chrono::steady_clock::time_point /*deadline*/) {
  throw Error(ErrorCode::unsupported, std::string(to_string(call.collective)) + ": the " + std::string(name()) +
                                          " transport does not run Algorithm::" + std::string(to_string(algorithm)));
}

}  // namespace tutti::transport
