// gpu::Communicator beyond the first four collectives, on the emulated device (label emulated):
// reduce, alltoall, barrier, send/recv, the pipelined (chunked) path of large elementwise
// collectives, and the backend choice through gpu::Options. Results are checked exactly on
// every element of every rank; stream order is checked with flags, never with timings.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/tuning.hpp"
#include "device/device.hpp"
#include "gpu/access.hpp"
#include "gpu/host_transfer.hpp"
#include "gpu_harness.hpp"
#include "tutti/cuda.hpp"

namespace {

using namespace tutti::testing::gpu;
using tutti::Algorithm;
using tutti::gpu::Backend;
using tutti::testing::error_code_of;
using tutti::testing::input_value;
using tutti::testing::reference_reduction;

const Bytes& poison_of(std::size_t bytes) {
  static thread_local Bytes poison;
  if (poison.size() < bytes) poison.assign(bytes, std::byte{tutti::testing::poison});
  return poison;
}

// Every root and op; the result only on the root, and a non-root's recv left untouched.
void reduce_case(tutti::gpu::Communicator& gpu, Stream stream, DataType type, ReduceOp op, std::size_t count) {
  const int p = gpu.size(), r = gpu.rank();
  const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, op, r, i); });
  const Bytes expected = values(type, count, [&](std::size_t i) { return reference_reduction(type, op, p, i); });
  DeviceBuffer send(gpu, input.size()), recv(gpu, input.size());
  for (int root = 0; root < p; ++root) {
    Bytes result(input.size());
    gpu.copy(send.data, input.data(), input.size(), stream);
    gpu.copy(recv.data, poison_of(input.size()).data(), input.size(), stream);
    gpu.reduce(send.data, recv.data, count, type, op, root, stream, options);
    gpu.copy(result.data(), recv.data, result.size(), stream);
    synchronize_checked(gpu, stream);
    const std::string what = "reduce " + std::string(tutti::to_string(type)) + " " + std::string(tutti::to_string(op)) +
                             " root " + std::to_string(root) + " count " + std::to_string(count);
    if (r == root)
      expect_equal(result, expected, type, what);
    else if (result != Bytes(input.size(), std::byte{tutti::testing::poison}))
      throw std::runtime_error(what + ": a non-root's recv was written");
  }
}

TEST(GpuCollectives, ReduceEveryRootTypeAndOp) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int) {
      const Stream stream = gpu.create_stream();
      for (DataType type : all_types)
        for (ReduceOp op : all_ops) reduce_case(gpu, stream, type, op, static_cast<std::size_t>(p + 2));
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{100003}})
        reduce_case(gpu, stream, DataType::f32, ReduceOp::sum, count);
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuCollectives, AlltoallInAndOutOfPlace) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::i32;
      const auto ps = static_cast<std::size_t>(p);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, ps + 1, std::size_t{30011}})
        for (bool in_place : {false, true}) {
          // Block j of rank r's input holds (r, j, i) in a form every rank can compute.
          auto element = [&](int from, std::size_t to, std::size_t i) {
            return static_cast<double>((from * 131 + static_cast<int>(to) * 17 + static_cast<int>(i % 1000)) % 100000);
          };
          const Bytes input = values(type, ps * count, [&](std::size_t k) { return element(r, k / count, k % count); });
          const Bytes expected = values(type, ps * count, [&](std::size_t k) {
            return element(static_cast<int>(k / count), static_cast<std::size_t>(r), k % count);
          });
          DeviceBuffer send(gpu, input.size()), recv(gpu, in_place ? 0 : input.size());
          void* out = in_place ? send.data : recv.data;
          Bytes result(input.size());
          gpu.copy(send.data, input.data(), input.size(), stream);
          if (!in_place) gpu.copy(out, poison_of(input.size()).data(), input.size(), stream);
          gpu.alltoall(send.data, out, count, type, stream, options);
          gpu.copy(result.data(), out, result.size(), stream);
          synchronize_checked(gpu, stream);
          expect_equal(result, expected, type,
                       "alltoall count " + std::to_string(count) + (in_place ? " in place" : ""));
        }
      gpu.destroy_stream(stream);
    });
  }
}

// Allgather in place as MPI_IN_PLACE (send == recv): this rank's block is already at its place.
TEST(GpuCollectives, AllgatherInPlaceWithSendEqualToRecv) {
  for (int p : {2, 3}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::u32;
      const std::size_t count = 1001, es = tutti::size_of(type);
      const auto total = count * static_cast<std::size_t>(p);
      const Bytes expected = values(type, total, [&](std::size_t i) {
        return input_value(type, ReduceOp::sum, static_cast<int>(i / count), i % count);
      });
      DeviceBuffer recv(gpu, expected.size());
      Bytes staged = poison_of(expected.size());
      staged.resize(expected.size());
      const std::size_t mine = static_cast<std::size_t>(r) * count * es;
      std::copy(expected.begin() + static_cast<std::ptrdiff_t>(mine),
                expected.begin() + static_cast<std::ptrdiff_t>(mine + count * es),
                staged.begin() + static_cast<std::ptrdiff_t>(mine));
      Bytes result(expected.size());
      gpu.copy(recv.data, staged.data(), staged.size(), stream);
      gpu.allgather(recv.data, recv.data, count, type, stream, options);
      gpu.copy(result.data(), recv.data, result.size(), stream);
      synchronize_checked(gpu, stream);
      expect_equal(result, expected, type, "allgather with send == recv");
      gpu.destroy_stream(stream);
    });
  }
}

// Work after a barrier on a rank's stream waits until every rank's stream reached the barrier:
// rank 0's stream is held before it, so every other rank's marker stays unwritten (a bounded wait
// on their streams runs out) until rank 0 is released.
TEST(GpuCollectives, BarrierHoldsEveryStreamUntilAllReachIt) {
  for (int p : {2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    std::atomic<int> checked{0};
    std::atomic<std::uint32_t*> hold{nullptr};
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      auto& device = device_of(gpu);
      const Stream stream = gpu.create_stream();
      auto* flags = static_cast<std::uint32_t*>(device.allocate_pinned(2 * sizeof(std::uint32_t)));
      if (r == 0) {
        device.wait_value(flags, 1, {stream});
        hold = flags;
      }
      gpu.barrier(stream, options);
      device.write_value(flags + 1, 1, {stream});
      if (r != 0) {
        if (error_code_of([&] { gpu.synchronize(stream, 100ms); }) != ErrorCode::timeout)
          throw std::runtime_error("rank " + std::to_string(r) + " passed the barrier while rank 0 was held");
        if (device.load_flag(flags + 1) != 0) throw std::runtime_error("the marker after the barrier was written");
        checked.fetch_add(1);
      } else {
        if (!tutti::testing::eventually([&] { return checked.load() == p - 1; }, deadline))
          throw std::runtime_error("the other ranks did not check");
        device.set_flag(hold.load(), 1);
      }
      gpu.synchronize(stream, deadline);
      if (device.load_flag(flags + 1) != 1) throw std::runtime_error("the marker after the barrier is unwritten");
      gpu.check();
      gpu.destroy_stream(stream);
      device.free_pinned(flags);
    });
  }
}

// A ring: every rank sends to its right, then receives from its left, on one stream, with
// messages above any eager limit. Both are posted before either completes, as on the host.
TEST(GpuCollectives, SendThenRecvAroundARing) {
  for (int p : {2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::f64;
      const int right = (r + 1) % p, left = (r + p - 1) % p;
      for (std::size_t count : {std::size_t{1}, std::size_t{1} << 20}) {
        const Bytes mine = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
        const Bytes expected =
            values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, left, i); });
        DeviceBuffer out(gpu, mine.size()), in(gpu, mine.size());
        Bytes result(mine.size());
        gpu.copy(out.data, mine.data(), mine.size(), stream);
        gpu.copy(in.data, poison_of(mine.size()).data(), mine.size(), stream);
        gpu.send(out.data, count, type, right, stream, 7);
        gpu.recv(in.data, count, type, left, stream, 7);
        gpu.copy(result.data(), in.data, result.size(), stream);
        synchronize_checked(gpu, stream);
        expect_equal(result, expected, type, "recv from rank " + std::to_string(left));
      }
      gpu.check();
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuCollectives, PointToPointArgumentsAreChecked) {
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int) {
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 64);
    std::vector<std::byte> host(64);
    const auto expect_invalid = [&](const std::string& what, const std::function<void()>& call) {
      std::string message;
      if (error_code_of(call, &message) != ErrorCode::invalid_argument)
        throw std::runtime_error(what + ": not invalid_argument: " + message);
    };
    expect_invalid("peer", [&] { gpu.send(data.data, 4, DataType::f32, 2, stream); });
    expect_invalid("negative peer", [&] { gpu.recv(data.data, 4, DataType::f32, -1, stream); });
    expect_invalid("tag", [&] { gpu.send(data.data, 4, DataType::f32, 0, stream, -3); });
    expect_invalid("host memory", [&] { gpu.send(host.data(), 4, DataType::f32, 0, stream); });
    expect_invalid("null", [&] { gpu.recv(nullptr, 4, DataType::f32, 0, stream); });
    expect_invalid("too long", [&] { gpu.recv(data.data, 17, DataType::f32, 0, stream); });
    gpu.check();  // nothing was enqueued, nothing failed
    gpu.destroy_stream(stream);
  });
}

TEST(GpuCollectives, ChunksOfAPipelinedOperation) {
  using tutti::gpu::detail::chunks_of;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  std::size_t chunk = 0;
  EXPECT_EQ(chunks_of(8 * MiB - 4, 4, chunk), 1u);
  EXPECT_EQ(chunk, 8 * MiB - 4);
  EXPECT_EQ(chunks_of(8 * MiB, 4, chunk), 2u);
  EXPECT_EQ(chunk, 4 * MiB);
  EXPECT_EQ(chunks_of(12 * MiB + 8, 8, chunk), 4u);  // 3 of 4 MiB and one of 8 bytes
  EXPECT_EQ(chunk, 4 * MiB);
  EXPECT_EQ(chunks_of(1024 * MiB, 2, chunk), 64u);  // at most 64: 16 MiB each
  EXPECT_EQ(chunk, 16 * MiB);
  EXPECT_EQ(chunks_of(1024 * MiB + 6, 6, chunk), 64u);  // a multiple of the element size
  EXPECT_EQ(chunk % 6, 0u);
  EXPECT_GE(chunk * 64, 1024 * MiB + 6);
}

// 3 Mi elements of f32 (12 MiB, three chunks) and of f64 (24 MiB): allreduce in and out of
// place, broadcast from the last rank, reduce to rank 0, on one stream back to back.
TEST(GpuCollectives, PipelinedLargeElementwiseCollectives) {
  for (int p : {2, 3}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      for (DataType type : {DataType::f32, DataType::f64}) {
        const std::size_t count = std::size_t{3} << 20;
        const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
        const Bytes sum =
            values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, p, i); });
        const Bytes root_input =
            values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, p - 1, i); });
        DeviceBuffer a(gpu, input.size()), b(gpu, input.size()), c(gpu, input.size());
        Bytes out_of_place(input.size()), in_place(input.size()), broadcast(input.size()), reduced(input.size());
        gpu.copy(a.data, input.data(), input.size(), stream);
        gpu.copy(b.data, poison_of(input.size()).data(), input.size(), stream);
        gpu.allreduce(a.data, b.data, count, type, ReduceOp::sum, stream, options);
        gpu.copy(out_of_place.data(), b.data, input.size(), stream);
        gpu.allreduce(a.data, a.data, count, type, ReduceOp::sum, stream, options);
        gpu.copy(in_place.data(), a.data, input.size(), stream);
        gpu.copy(c.data, (r == p - 1 ? root_input : poison_of(input.size())).data(), input.size(), stream);
        gpu.broadcast(c.data, count, type, p - 1, stream, options);
        gpu.copy(broadcast.data(), c.data, input.size(), stream);
        gpu.copy(a.data, input.data(), input.size(), stream);
        gpu.reduce(a.data, b.data, count, type, ReduceOp::sum, 0, stream, options);
        gpu.copy(reduced.data(), b.data, input.size(), stream);
        gpu.synchronize(stream, deadline);
        gpu.check();
        const std::string what(tutti::to_string(type));
        expect_equal(out_of_place, sum, type, what + " allreduce out of place");
        expect_equal(in_place, sum, type, what + " allreduce in place");
        expect_equal(broadcast, root_input, type, what + " broadcast");
        if (r == 0) expect_equal(reduced, sum, type, what + " reduce");
      }
      gpu.destroy_stream(stream);
    });
  }
}

// gpu::Options::backend (automatic, host_transfer or ipc), and a host algorithm for
// host_transfer's host collective (backend automatic or host_transfer), all run exactly; so does
// a tutti::Options. A backend this build lacks (nccl), or ipc for a collective it does not have,
// is Error(unsupported) from the call, and enqueues nothing
// (the next operation's numbering is intact on every rank). A host algorithm the host collective
// refuses (bruck has no allreduce) fails there, with backend automatic or host_transfer (so the
// algorithm reaches the host collective): the stream is released and check() raises it.
TEST(GpuCollectives, BackendFromOptions) {
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    const Stream stream = gpu.create_stream();
    const DataType type = DataType::i32;
    const std::size_t count = 300;
    const auto timeout = options.timeout;
    const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
    const Bytes expected =
        values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, 2, i); });
    DeviceBuffer data(gpu, input.size());
    const tutti::gpu::Options runs[] = {
        {Backend::automatic, timeout},
        {Backend::host_transfer, timeout},
        {Backend::ipc, timeout},
        {Backend::automatic, Algorithm::ring, timeout},
        {Backend::host_transfer, Algorithm::ring, timeout},
        {Backend::host_transfer, Algorithm::recursive_doubling, timeout},
        tutti::Options{Algorithm::ring, timeout},
    };
    const auto expect_unsupported = [](const std::function<void()>& call, const std::string& names,
                                       const std::string& what) {
      std::string message;
      if (error_code_of(call, &message) != ErrorCode::unsupported || message.find(names) == std::string::npos)
        throw std::runtime_error(what + ": " + message);
    };
    for (const tutti::gpu::Options& run : runs) {
      const std::string what = std::string(tutti::gpu::to_string(run.backend)) + " with host algorithm " +
                               std::string(tutti::to_string(run.algorithm));
      expect_unsupported(
          [&] {
            gpu.allreduce(data.data, data.data, count, type, ReduceOp::sum, stream, {Backend::nccl, timeout});
          },
          "nccl backend", "nccl");
      expect_unsupported(
          [&] {
            gpu.alltoall(data.data, data.data, 1, type, stream, {Backend::ipc, timeout});
          },
          "the ipc backend cannot run this alltoall", "alltoall on ipc");
      Bytes result(input.size());
      gpu.copy(data.data, input.data(), input.size(), stream);
      gpu.allreduce(data.data, data.data, count, type, ReduceOp::sum, stream, run);
      gpu.copy(result.data(), data.data, result.size(), stream);
      synchronize_checked(gpu, stream);
      expect_equal(result, expected, type, what);
    }
    gpu.check();
    gpu.destroy_stream(stream);
  });
  // The failure is recorded for good: one pair of communicators per backend.
  for (Backend backend : {Backend::automatic, Backend::host_transfer}) {
    run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int) {
      const Stream stream = gpu.create_stream();
      DeviceBuffer data(gpu, 64 * sizeof(std::int32_t));
      gpu.allreduce(data.data, data.data, 64, DataType::i32, ReduceOp::sum, stream,
                    {backend, Algorithm::bruck, options.timeout});
      gpu.synchronize(stream, deadline);  // released
      std::string message;
      if (error_code_of([&] { gpu.check(); }, &message) != ErrorCode::unsupported ||
          message.find("bruck") == std::string::npos)
        throw std::runtime_error("bruck on " + std::string(tutti::gpu::to_string(backend)) + ": " + message);
      gpu.destroy_stream(stream);
    });
  }
}

// The rules of gpu::Options, each broken on one rank only: Error(invalid_argument) from the call,
// naming what it refuses, before a backend is chosen (so also where the backend could not run the
// call anyway: nccl here, ipc's alltoall). Nothing is enqueued: the rank's stream is idle at once
// (an operation waiting for its peer would hold it), check() raises nothing, and the collective
// both ranks then call is exact.
TEST(GpuCollectives, OptionRulesRefusedBeforeAnythingIsEnqueued) {
  std::atomic<bool> refused{false};
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    const Stream stream = gpu.create_stream();
    const DataType type = DataType::i32;
    const std::size_t count = 300;
    const auto timeout = options.timeout;
    DeviceBuffer data(gpu, count * sizeof(std::int32_t));
    if (r == 1) {
      struct Rule {
        tutti::gpu::Options options;
        std::vector<std::string> names;  // what the message must name
      };
      const Rule rules[] = {
          {{Backend::ipc, Algorithm::ring, timeout}, {"options.backend ipc", "ring"}},
          {{Backend::nccl, Algorithm::direct, timeout}, {"options.backend nccl", "direct"}},
          {{Backend::ipc, Algorithm::recursive_doubling, timeout}, {"options.backend ipc", "recursive_doubling"}},
          {{static_cast<Backend>(4), timeout}, {"gpu::Backend (4)"}},
          {{static_cast<Backend>(-1), timeout}, {"gpu::Backend (-1)"}},
      };
      for (const Rule& rule : rules) {
        const std::function<void()> calls[] = {
            [&] { gpu.allreduce(data.data, data.data, count, type, ReduceOp::sum, stream, rule.options); },
            [&] { gpu.alltoall(data.data, data.data, 1, type, stream, rule.options); },
            [&] { gpu.broadcast(data.data, count, type, 0, stream, rule.options); },
            [&] { gpu.barrier(stream, rule.options); },
        };
        for (const auto& call : calls) {
          std::string message;
          const ErrorCode code = error_code_of(call, &message);
          bool named = true;
          for (const std::string& name : rule.names) named = named && message.find(name) != std::string::npos;
          if (code != ErrorCode::invalid_argument || !named)
            throw std::runtime_error(std::string("raised ") + std::string(tutti::to_string(code)) + ": " + message);
        }
      }
      gpu.synchronize(stream, std::chrono::milliseconds(2000));  // Error(timeout) if anything was enqueued
      gpu.check();
      refused = true;
    } else if (!tutti::testing::eventually([&] { return refused.load(); }, deadline)) {
      throw std::runtime_error("rank 1 did not finish its refused calls");
    }
    const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
    Bytes result(input.size());
    gpu.copy(data.data, input.data(), input.size(), stream);
    gpu.allreduce(data.data, data.data, count, type, ReduceOp::sum, stream, options);
    gpu.copy(result.data(), data.data, result.size(), stream);
    synchronize_checked(gpu, stream);
    gpu.check();
    expect_equal(result,
                 values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, 2, i); }),
                 type, "the allreduce after the refused calls");
    gpu.destroy_stream(stream);
  });
}

// A tutti::Options converts to gpu::Options: its algorithm is the host algorithm, the backend
// automatic, the timeout kept. to_string and backend_from_name are each other's inverse.
TEST(GpuOptions, TuttiOptionsConvertToTheHostAlgorithm) {
  const auto timeout = std::chrono::milliseconds(1234);
  for (int a = 0; a <= static_cast<int>(Algorithm::mpi); ++a) {
    const auto algorithm = static_cast<Algorithm>(a);
    const tutti::gpu::Options converted = tutti::Options{algorithm, timeout};
    SCOPED_TRACE(std::string(tutti::to_string(algorithm)));
    EXPECT_EQ(converted.timeout, timeout);
    EXPECT_EQ(converted.backend, Backend::automatic);
    EXPECT_EQ(converted.algorithm, algorithm);
  }
  for (Backend backend : {Backend::automatic, Backend::host_transfer, Backend::ipc, Backend::nccl})
    EXPECT_EQ(tutti::gpu::backend_from_name(tutti::gpu::to_string(backend)), backend);
  EXPECT_EQ(tutti::gpu::to_string(Backend::host_transfer), "host_transfer");
  EXPECT_EQ(tutti::gpu::to_string(static_cast<Backend>(9)), "invalid");
  EXPECT_EQ(tutti::gpu::backend_from_name("ring"), std::nullopt);
  for (const char* backend : {"host_transfer", "ipc", "nccl"})
    EXPECT_EQ(tutti::algorithm_from_name(backend), std::nullopt) << backend;
  EXPECT_EQ(tutti::gpu::backend_from_name("invalid"), std::nullopt);
}

// ipc: every rank called the collective, but rank 1's stream never reaches it (held by a flag
// the test raises only at the end). Rank 0's watchdog times out after the operation's timeout,
// counted from when its own stream reached it, names rank 1, and releases every rank's stream;
// rank 1 learns the failure from the shared failure word. Both raise timeout.
TEST(GpuCollectives, IpcStreamThatNeverArrivesTimesOutOnEveryRank) {
  std::atomic<bool> rank0_done{false};
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    auto& device = device_of(gpu);
    const Stream stream = gpu.create_stream();
    auto* hold = static_cast<std::uint32_t*>(device.allocate_pinned(sizeof(std::uint32_t)));
    DeviceBuffer data(gpu, 64 * 4);
    if (r == 1) device.wait_value(hold, 1, {stream});
    gpu.allreduce(data.data, data.data, 64, DataType::f32, ReduceOp::sum, stream,
                  {Backend::ipc, std::chrono::milliseconds(300)});
    std::string message;
    if (r == 0) {
      gpu.synchronize(stream, deadline);  // released: Error(timeout) from synchronize itself if not
      const ErrorCode code = error_code_of([&] { gpu.check(); }, &message);
      rank0_done = true;
      if (code != ErrorCode::timeout || message.find("rank(s) 1") == std::string::npos)
        throw std::runtime_error("rank 0: " + message);
    } else {
      if (!tutti::testing::eventually([&] { return rank0_done.load(); }, deadline))
        throw std::runtime_error("rank 0 did not finish");
      // Its watchdog learns it from the shared failure word within a few naps: poll check().
      const auto raised_timeout = [&] {
        try {
          gpu.check();
          return false;
        } catch (const tutti::Error& error) {
          return error.code() == ErrorCode::timeout;
        }
      };
      if (!tutti::testing::eventually(raised_timeout, deadline))
        throw std::runtime_error("rank 1 did not learn the failure");
      device.set_flag(hold, 1);
      gpu.synchronize(stream, deadline);
    }
    gpu.destroy_stream(stream);
    device.free_pinned(hold);
  });
}

// tutti::cuda::Communicator always asks for CUDA. Without a GPU (or a CUDA build) the constructor
// raises unsupported on every rank; with one, an allreduce on it is exact.
TEST(GpuCollectives, CudaCommunicator) {
  bool have_gpu = true;
  try {
    tutti::device::make_device(tutti::device::Kind::cuda);
  } catch (const tutti::Error& error) {
    if (error.code() != ErrorCode::unsupported) throw;
    have_gpu = false;
  }
  if (!have_gpu) std::printf("no CUDA device: checking that tutti::cuda::Communicator refuses\n");
  auto hosts = tutti::local_group(2);
  const std::string failures = tutti::testing::on_threads(2, [&](int r) {
    if (!have_gpu) {
      if (error_code_of([&] { tutti::cuda::Communicator gpu(hosts[static_cast<std::size_t>(r)]); }) !=
          ErrorCode::unsupported)
        throw std::runtime_error("not unsupported without a GPU");
      return;
    }
    tutti::cuda::Communicator gpu(hosts[static_cast<std::size_t>(r)]);
    const Stream stream = gpu.create_stream();
    const std::size_t count = 4099;
    const Bytes input =
        values(DataType::f32, count, [&](std::size_t i) { return input_value(DataType::f32, ReduceOp::sum, r, i); });
    const Bytes expected = values(
        DataType::f32, count, [&](std::size_t i) { return reference_reduction(DataType::f32, ReduceOp::sum, 2, i); });
    DeviceBuffer data(gpu, input.size());
    Bytes result(input.size());
    gpu.copy(data.data, input.data(), input.size(), stream);
    gpu.allreduce(data.data, data.data, count, DataType::f32, ReduceOp::sum, stream, options);
    gpu.copy(result.data(), data.data, result.size(), stream);
    synchronize_checked(gpu, stream);
    gpu.check();
    expect_equal(result, expected, DataType::f32, "cuda allreduce");
    gpu.destroy_stream(stream);
  });
  EXPECT_EQ(failures, "");
}

// host_transfer: a burst of more operations than its staging pool holds (8), enqueued while the
// stream is held, returns at once (a later operation waits on the stream for a busy buffer, never
// on the host) and is exact: 20 in-place sums on 2 ranks multiply every element by 2^20.
TEST(GpuCollectives, HostTransferBurstLargerThanItsStagingPool) {
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    auto& device = device_of(gpu);
    const Stream stream = gpu.create_stream();
    auto* hold = static_cast<std::uint32_t*>(device.allocate_pinned(sizeof(std::uint32_t)));
    const std::size_t count = 5000;
    constexpr int rounds = 20;
    const Bytes input = values(DataType::i64, count, [&](std::size_t i) { return static_cast<double>(i % 7 + r); });
    const Bytes expected = values(DataType::i64, count, [&](std::size_t i) {
      return static_cast<double>(2 * (i % 7) + 1) * static_cast<double>(1 << (rounds - 1));
    });
    DeviceBuffer data(gpu, input.size());
    Bytes result(input.size());
    device.wait_value(hold, 1, {stream});
    gpu.copy(data.data, input.data(), input.size(), stream);
    for (int k = 0; k < rounds; ++k)
      gpu.allreduce(data.data, data.data, count, DataType::i64, ReduceOp::sum, stream,
                    {Backend::host_transfer, options.timeout});
    gpu.copy(result.data(), data.data, result.size(), stream);
    device.set_flag(hold, 1);
    synchronize_checked(gpu, stream);
    gpu.check();
    expect_equal(result, expected, DataType::i64, "20 chained allreduces");
    gpu.destroy_stream(stream);
    device.free_pinned(hold);
  });
}

// automatic follows the tuning table's entries for the device "transports" (gpu:emulated here)
// where the backend they name ("backend", or "algorithm" as earlier files have it) runs the call,
// else ipc where it serves, else host_transfer; GPU backends are refused for host transports and
// host algorithms for device ones.
TEST(GpuCollectives, AutomaticTakesTheTuningTablesBackend) {
  namespace choice = tutti::comm::choice;
  const std::string head = R"({"version": 1, "entries": [)";
  const auto entry = [](const char* collective, const char* transport, const char* algorithm, int max) {
    return std::string(R"({"collective": ")") + collective + R"(", "transport": ")" + transport +
           R"(", "ranks": 2, "min_bytes": 0, "max_bytes": )" + std::to_string(max) + R"(, "algorithm": ")" + algorithm +
           R"("})";
  };
  const auto refused = [&](const std::string& one) {
    try {
      choice::Table::parse(head + one + "]}", "test");
    } catch (const tutti::Error& error) {
      return error.code() == ErrorCode::invalid_argument;
    }
    return false;
  };
  EXPECT_TRUE(refused(entry("allreduce", "shm", "ipc", 100)));
  EXPECT_TRUE(refused(entry("allreduce", "gpu:emulated", "ring", 100)));
  EXPECT_TRUE(refused(entry("allreduce", "gpu:emulated", "automatic", 100)));
  // The entries are the test device's (gpu:emulated, or gpu:cuda with TUTTI_TEST_GPU_DEVICE=cuda).
  const std::string device = "gpu:" + std::string(tutti::device::to_string(test_device_kind()));
  std::string alltoall = entry("alltoall", device.c_str(), "ipc", 1 << 20);
  alltoall.replace(alltoall.find("\"algorithm\""), 11, "\"backend\"");
  const choice::Table table =
      choice::Table::parse(head + entry("allreduce", device.c_str(), "host_transfer", 1000) + "," +
                               entry("broadcast", device.c_str(), "nccl", 1 << 20) + "," + alltoall + "]}",
                           "test");
  EXPECT_TRUE(table.entries.empty());
  ASSERT_EQ(table.backend_entries.size(), 3u);
  EXPECT_EQ(table.backend_entries[2].backend, Backend::ipc);
  EXPECT_EQ(choice::Table::parse(table.to_json(), "written").backend_entries.size(), 3u);
  choice::set_active(table);
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int) {
    DeviceBuffer data(gpu, 4096 * 4);
    auto call = [&](tutti::Collective collective, std::size_t count) {
      return tutti::gpu::detail::DeviceCall{
          .call = tutti::comm::make_call(
              collective, data.data, data.data, count, DataType::f32,
              collective == tutti::Collective::allreduce ? std::optional<ReduceOp>(ReduceOp::sum) : std::nullopt,
              collective == tutti::Collective::broadcast ? 0 : -1, {})};
    };
    auto& impl = *tutti::gpu::detail::Access::impl(gpu);
    const auto expect = [&](Backend got, Backend want, const std::string& what) {
      if (got != want)
        throw std::runtime_error(what + ": " + std::string(tutti::gpu::to_string(got)) + ", expected " +
                                 std::string(tutti::gpu::to_string(want)));
    };
    expect(impl.automatic_backend(call(tutti::Collective::allreduce, 250)), Backend::host_transfer,
           "1000 bytes, the table's host_transfer");
    expect(impl.automatic_backend(call(tutti::Collective::allreduce, 251)), Backend::ipc, "past the entry: ipc");
    expect(impl.automatic_backend(call(tutti::Collective::broadcast, 100)), Backend::ipc,
           "nccl cannot run here (the emulated device, or two ranks on one GPU): ipc");
    expect(impl.automatic_backend(call(tutti::Collective::alltoall, 10)), Backend::host_transfer,
           "ipc has no alltoall: host_transfer");
  });
  choice::set_active(choice::Table{});
}

}  // namespace
