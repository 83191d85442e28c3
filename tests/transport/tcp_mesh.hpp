// A mesh of TCP transports over 127.0.0.1 whose ranks are threads of this process, rendezvousing
// through an in-memory store (tcp_test and the transport conformance suite).
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memory_store.hpp"
#include "transport/tcp/tcp.hpp"

namespace tutti::testing {

inline constexpr std::chrono::milliseconds connect_timeout{30000};
inline const std::string tcp_token = "tcp-test-secret";

using Transports = std::vector<std::unique_ptr<transport::Transport>>;

/// Connects ranks `ranks` (all by default) of a p-rank mesh of communicator 7, each on its own
/// thread; `errors` gets each rank's error ("" where it connected).
inline Transports connect_ranks(MemoryStore& store, int p, std::vector<std::string>* errors,
                                std::chrono::milliseconds timeout = connect_timeout, std::vector<int> ranks = {},
                                const std::string& secret = tcp_token) {
  if (ranks.empty())
    for (int r = 0; r < p; ++r) ranks.push_back(r);
  Transports transports(static_cast<std::size_t>(p));
  errors->assign(static_cast<std::size_t>(p), "");
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      try {
        transports[static_cast<std::size_t>(r)] = transport::tcp::connect(store, secret, r, p, 7, "127.0.0.1", timeout);
      } catch (const std::exception& e) {
        (*errors)[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return transports;
}

}  // namespace tutti::testing
