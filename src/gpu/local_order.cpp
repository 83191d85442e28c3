// Finding the ranks that share hardware queues (two allgathers and a barrier when a gpu
// communicator is made), and the points they pass in order (local_order.hpp).
#include "gpu/local_order.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace tutti::gpu::detail {

namespace {

// This process among all: a random number drawn once (a pid and a host name can repeat across
// containers; two processes drawing the same 64 bits cannot be told apart, and would find no
// order below, since the registry is the process's own).
std::uint64_t process_identity() {
  static const std::uint64_t identity = [] {
    std::random_device random;
    return (std::uint64_t{random()} << 32) ^ random();
  }();
  return identity;
}

// Orders being handed from their first member to the others while the communicator is made.
std::mutex registry_mutex;
std::map<std::uint64_t, std::shared_ptr<LocalOrder>> registry;
std::uint64_t registry_next = 0;

}  // namespace

std::shared_ptr<LocalOrder> LocalOrder::join(tutti::Communicator& host, std::uintptr_t domain) {
  const int p = host.size(), me = host.rank();
  std::array<std::uint64_t, 2> mine{process_identity(), domain};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(p));
  host.allgather(mine.data(), all.data(), 2, DataType::u64);
  auto shares = [&](int a, int b) {
    const auto i = 2 * static_cast<std::size_t>(a), j = 2 * static_cast<std::size_t>(b);
    return all[i + 1] != 0 && all[i] == all[j] && all[i + 1] == all[j + 1];
  };
  // Every rank sees every identity, so all decide alike whether the hand-over below runs.
  bool any = false, member = false;
  int first = me;  // the lowest rank sharing with this one
  for (int a = 0; a < p; ++a)
    for (int b = a + 1; b < p; ++b)
      if (shares(a, b)) {
        any = true;
        if (a == me || b == me) member = true;
        if (b == me) first = std::min(first, a);
      }
  if (!any) return nullptr;
  std::uint64_t key = 0;
  std::shared_ptr<LocalOrder> order;
  if (member && first == me) {
    order = std::make_shared<LocalOrder>();
    std::lock_guard lock(registry_mutex);
    key = ++registry_next;
    registry.emplace(key, order);
  }
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(p));
  host.allgather(&key, keys.data(), 1, DataType::u64);
  if (member && first != me) {
    std::lock_guard lock(registry_mutex);
    if (auto it = registry.find(keys[static_cast<std::size_t>(first)]); it != registry.end()) order = it->second;
  }
  if (order) {
    std::lock_guard lock(order->mutex_);
    order->passed_.emplace(me, 0);
  }
  host.barrier();  // every member has its order (and is counted in it) before the first forgets it
  if (key != 0) {
    std::lock_guard lock(registry_mutex);
    registry.erase(key);
  }
  return order;
}

std::optional<Error> LocalOrder::pass(int rank, std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  const std::uint64_t point = ++passed_[rank];
  moved_.notify_all();
  const auto arrived = [&](const auto& member) { return member.second >= point; };
  if (moved_.wait_for(lock, limit, [&] { return std::all_of(passed_.begin(), passed_.end(), arrived); }))
    return std::nullopt;
  std::string late;
  for (const auto& member : passed_)
    if (!arrived(member)) late += (late.empty() ? "" : ", ") + std::to_string(member.first);
  return Error(ErrorCode::timeout, "rank(s) " + late +
                                       " (threads of this process on the same device) did not issue it within " +
                                       std::to_string(limit.count()) + " ms of rank " + std::to_string(rank));
}

void LocalOrder::leave(int rank) {
  std::lock_guard lock(mutex_);
  passed_[rank] = std::numeric_limits<std::uint64_t>::max();
  moved_.notify_all();
}

void LocalOrder::sent(int from, int to, int tag) {
  std::lock_guard lock(mutex_);
  ++sent_[{from, to, tag}];
  moved_.notify_all();
}

std::optional<Error> LocalOrder::await_sent(int from, int to, int tag, std::uint64_t nth,
                                            std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  const auto member = passed_.find(from);
  if (member == passed_.end()) return std::nullopt;  // its queues are not this rank's
  const auto submitted = [&] {
    return member->second == std::numeric_limits<std::uint64_t>::max() || sent_[{from, to, tag}] >= nth;
  };
  if (moved_.wait_for(lock, limit, submitted)) return std::nullopt;
  return Error(ErrorCode::timeout,
               "rank " + std::to_string(from) + " (a thread of this process on the same device) did not issue send " +
                   std::to_string(nth) + " to rank " + std::to_string(to) + " with tag " + std::to_string(tag) +
                   " within " + std::to_string(limit.count()) + " ms of the receive that matches it");
}

}  // namespace tutti::gpu::detail
