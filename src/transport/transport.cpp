#include "transport/transport.hpp"

#include "transport/cost.hpp"
#include "transport/shm/direct.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace tutti::transport {

std::unique_ptr<NativeCollective> Transport::start_native(Algorithm algorithm, const NativeCall& call,
                                                          std::chrono::milliseconds /*timeout*/) {
  throw Error(ErrorCode::unsupported, std::string(to_string(call.collective)) + ": the " + std::string(name()) +
                                          " transport does not run Algorithm::" + std::string(to_string(algorithm)));
}

void finish(NativeCollective& run, Transport& transport, const Signature& signature,
            std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  // Native collectives check their peers' liveness when progressed: never sleep longer than this.
  constexpr auto longest_nap = std::chrono::milliseconds(100);
  // One step of `run`; an error aborts the communicator first (the first error wins, on every rank).
  const auto step = [&](bool spinning) {
    try {
      return spinning ? run.poll() : run.progress();
    } catch (const Error& error) {
      transport.abort(error, signature.seq);
      throw;
    }
  };
  // Catch a small collective's peers spinning on `poll` (finish_spins).
  for (int i = 0; i < finish_spins; ++i) {
    if (step(true)) return;
    transport.relax();
  }
  const auto start = clock::now(), deadline = start + timeout;
  for (;;) {
    const std::uint64_t seen = transport.generation();  // read first: no wake-up is lost
    if (step(false)) return;
    const auto now = clock::now();
    if (now >= deadline) {
      std::string peers;
      for (int peer : run.waiting_for()) peers += (peers.empty() ? "" : ", ") + std::to_string(peer);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
      Error error(ErrorCode::timeout, "rank " + std::to_string(transport.rank()) + ": " + signature.describe() +
                                          " timed out after " + std::to_string(waited.count()) + " ms" +
                                          (peers.empty() ? "" : "; still waiting for rank(s) " + peers));
      transport.abort(error, signature.seq);
      throw error;
    }
    const auto nap = run.poll_period() ? std::min<clock::duration>(*run.poll_period(), longest_nap) : longest_nap;
    transport.wait(seen, std::min(deadline, now + nap));
  }
}

// ---- costs by kind (transport/cost.hpp) ----

CostParams default_cost(Kind kind) {
  switch (kind) {
    case Kind::inproc:
      return {2.0e-6, 1.5e-10, 2.0e-10};
    case Kind::shm:
      return {3.0e-6, 3.0e-10, 2.0e-10};
    case Kind::mpi:
      return {2.0e-6, 3.0e-10, 2.0e-10};
    case Kind::tcp:
    case Kind::routed:
      break;
  }
  return {50.0e-6, 6.5e-10, 2.0e-10};  // tcp, the routed transport's slowest link, and any other
}

std::vector<Algorithm> native_candidates(Kind kind, Collective collective) {
  if (kind == Kind::shm && shm::serves(collective)) return {Algorithm::direct};
  return {};
}

std::optional<double> native_price(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes,
                                   const CostParams& cost) {
  if (algorithm == Algorithm::direct && shm::serves(collective))
    return shm::direct_price(collective, ranks, bytes, cost);
  return std::nullopt;
}

}  // namespace tutti::transport
