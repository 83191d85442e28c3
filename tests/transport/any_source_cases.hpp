// Receives from any source (Communicator::recv with tutti::any_source) through a Communicator,
// the same over every transport: each message taken exactly once, each sender's messages in
// order, the sender reported, named receives mixed in, the deadline, a message of another size.
// Each case runs on one rank's thread and throws what it found wrong.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tutti/tutti.hpp"

namespace tutti::testing::any_source_cases {

inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

inline constexpr int messages_per_sender = 40;
inline std::int32_t value_of(int sender, int k) { return sender * 1000 + k; }

// Every rank but 0 sends messages_per_sender messages with tag 5 to rank 0, which takes them all
// with receives from any source: half blocking, half four outstanding at a time.
inline void senders_to_one_receiver(Communicator& comm) {
  constexpr int tag = 5;
  const int p = comm.size();
  if (comm.rank() != 0) {
    std::vector<std::int32_t> out(messages_per_sender);
    std::vector<Request> sent;
    for (int k = 0; k < messages_per_sender; ++k) {
      out[static_cast<std::size_t>(k)] = value_of(comm.rank(), k);
      sent.push_back(comm.isend(&out[static_cast<std::size_t>(k)], 1, DataType::i32, 0, tag));
    }
    for (Request& r : sent) r.wait();
    return;
  }
  const int total = (p - 1) * messages_per_sender;
  std::map<int, int> next;  // sender -> next k expected
  const auto take = [&](int source, std::int32_t value) {
    require(source >= 1 && source < p, "source " + std::to_string(source) + " out of range");
    require(value == value_of(source, next[source]), "from rank " + std::to_string(source) + ": got " +
                                                         std::to_string(value) + ", expected " +
                                                         std::to_string(value_of(source, next[source])));
    ++next[source];
  };
  int got = 0;
  for (; got < total / 2; ++got) {
    std::int32_t value = -1;
    const int source = comm.recv(&value, 1, DataType::i32, any_source, tag);
    take(source, value);
  }
  while (got < total) {
    const int batch = std::min(4, total - got);
    std::vector<std::int32_t> in(static_cast<std::size_t>(batch), -1);
    std::vector<Request> pending;
    for (int i = 0; i < batch; ++i)
      pending.push_back(comm.irecv(&in[static_cast<std::size_t>(i)], 1, DataType::i32, any_source, tag));
    for (int i = 0; i < batch; ++i) {
      pending[static_cast<std::size_t>(i)].wait();
      take(pending[static_cast<std::size_t>(i)].source(), in[static_cast<std::size_t>(i)]);
    }
    got += batch;
  }
  for (int s = 1; s < p; ++s)
    require(next[s] == messages_per_sender,
            "rank " + std::to_string(s) + ": " + std::to_string(next[s]) + " messages taken");
}

// Ranks 1 and 2 send 10 messages each (tag 2) before rank 0 receives, so that a receive from any
// source finds both peers' messages there (one taken, the other kept for that peer); rank 0 mixes
// named receives (blocking and outstanding) with receives from any source. Per sender, the values
// taken, in the order the receives were issued, are that sender's messages in order.
inline void mixed_with_named_receives(Communicator& comm) {
  constexpr int tag = 2, n = 10;
  if (comm.rank() == 1 || comm.rank() == 2) {
    std::vector<std::int32_t> out(n);
    std::vector<Request> sent;
    for (int k = 0; k < n; ++k) {
      out[static_cast<std::size_t>(k)] = value_of(comm.rank(), k);
      sent.push_back(comm.isend(&out[static_cast<std::size_t>(k)], 1, DataType::i32, 0, tag));
    }
    for (Request& r : sent) r.wait();
    return;
  }
  if (comm.rank() != 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // a: any source; 1, 2: that rank. 4 named from each, early enough that they cannot starve.
  const std::string plan = "a12a12a12a12aaaaaaaa";
  std::vector<std::int32_t> in(plan.size(), -1);
  std::vector<Request> requests;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const int peer = plan[i] == 'a' ? any_source : plan[i] - '0';
    if (i % 3 == 0) {  // blocking
      const int source = comm.recv(&in[i], 1, DataType::i32, peer, tag);
      require(peer == any_source || source == peer, "a named receive reported source " + std::to_string(source));
      requests.emplace_back();
      continue;
    }
    requests.push_back(comm.irecv(&in[i], 1, DataType::i32, peer, tag));
  }
  std::map<int, int> next;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    requests[i].wait();
    const int sender = in[i] / 1000;
    if (plan[i] != 'a')
      require(sender == plan[i] - '0', "receive " + std::to_string(i) + " took " + std::to_string(in[i]));
    if (requests[i].source() >= 0)
      require(requests[i].source() == sender, "receive " + std::to_string(i) + ": source " +
                                                  std::to_string(requests[i].source()) + " for value " +
                                                  std::to_string(in[i]));
    require(in[i] == value_of(sender, next[sender]), "receive " + std::to_string(i) + " (" + plan[i] + ") took " +
                                                         std::to_string(in[i]) + ", expected " +
                                                         std::to_string(value_of(sender, next[sender])));
    ++next[sender];
  }
  require(next[1] == n && next[2] == n, "not every message taken");
}

// A message to itself is taken too.
inline void from_itself(Communicator& comm) {
  const std::int32_t mine = comm.rank() + 7;
  Request sent = comm.isend(&mine, 1, DataType::i32, comm.rank(), 9);
  std::int32_t in = -1;
  const int source = comm.recv(&in, 1, DataType::i32, any_source, 9);
  sent.wait();
  require(source == comm.rank() && in == mine,
          "from itself: source " + std::to_string(source) + ", value " + std::to_string(in));
}

}  // namespace tutti::testing::any_source_cases
