// tutti::init(KeyValueStore&, rank, size): joining through the caller's store (what the
// torch.distributed backend does with c10d's Store). Ranks are threads of this process; they
// connect over shared memory, as ranks of one host do.
#include <gtest/gtest.h>

#include <vector>

#include "memory_store.hpp"
#include "threads.hpp"
#include "tutti/rendezvous.hpp"

namespace {

// The test's in-memory store is a KeyValueStore (the bootstrap layer's Store is the public interface).
using Store = tutti::testing::MemoryStore;

TEST(Rendezvous, RanksJoinThroughTheCallersStore) {
  for (int p : {1, 2, 3}) {
    Store store;
    const std::string failures = tutti::testing::on_threads(p, [&](int rank) {
      tutti::Communicator comm = tutti::init(store, rank, p, std::chrono::seconds(30));
      ASSERT_EQ(comm.rank(), rank);
      ASSERT_EQ(comm.size(), p);
      std::vector<std::int64_t> data(5, -7);
      for (int i = 0; i < 5; ++i) data[static_cast<std::size_t>(i)] = rank * 10 + i;
      comm.allreduce(std::span<std::int64_t>(data), tutti::ReduceOp::sum);
      for (int i = 0; i < 5; ++i) EXPECT_EQ(data[static_cast<std::size_t>(i)], 10 * p * (p - 1) / 2 + p * i);
    });
    EXPECT_EQ(failures, "") << "p = " << p;
  }
}

TEST(Rendezvous, BadRankOrSizeIsRejected) {
  Store store;
  for (auto [rank, size] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    try {
      tutti::init(store, rank, size);
      ADD_FAILURE() << "rank " << rank << " size " << size << " accepted";
    } catch (const tutti::Error& e) {
      EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument) << e.what();
    }
  }
}

TEST(Rendezvous, MissingRankTimesOut) {
  Store store;  // rank 1 of 2 never comes
  try {
    tutti::init(store, 0, 2, std::chrono::milliseconds(300));
    ADD_FAILURE() << "joined without rank 1";
  } catch (const tutti::Error& e) {
    EXPECT_EQ(e.code(), tutti::ErrorCode::timeout) << e.what();
  }
}

}  // namespace
