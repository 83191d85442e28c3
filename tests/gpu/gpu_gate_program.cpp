// A rank program of the GPU process gate (tests/gpu/gpu_gate_test.sh runs it under tutti-run): ranks
// as processes that share one device, as real jobs run (one process per GPU; on a machine with one
// GPU, every rank on GPU 0).
//
//   gpu_gate_program BACKEND   (host_transfer, ipc or nccl)
//
// The device is TUTTI_TEST_GPU_DEVICE (cuda or emulated; emulated when unset), device 0 for every
// rank. Each rank makes two streams and, for every count of {0, 1, p+1, 1000003}, enqueues every
// collective the backend serves, alternating between the two streams without synchronising in
// between (allreduce of every type and op at the small counts, and f32 sum, i32 max in place at
// every count; reduce to every root; broadcast; allgather in and out of place; reduce_scatter;
// alltoall and a send/recv ring where the backend has them; a barrier), then the pipelined 24 MiB
// f64 allreduce beside a 12 MiB f32 one on the other stream. Outputs are poisoned before each call;
// after both streams are synchronised, check() must raise nothing, and then every element of every
// output is compared exactly (a non-root's reduce output must still hold the poison).
// nccl where it cannot run (the emulated device, or p >= 2 ranks on one GPU) must refuse, by name,
// with Error(unsupported) on every rank. Prints
//   rank R: job J
//   rank R: PASS N results checked (BACKEND, DEVICE, p = P)      or
//   rank R: REFUSED unsupported: MESSAGE                          or
//   rank R: FAIL WHY
// and exits 0 on a pass or an expected refusal, 1 otherwise.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tutti/gpu.hpp"
#include "tutti/tutti.hpp"

namespace {

using namespace std::chrono_literals;
using tutti::DataType;
using tutti::ErrorCode;
using tutti::ReduceOp;
using tutti::gpu::Stream;
using tutti::testing::input_value;
using tutti::testing::reference_reduction;
using Bytes = std::vector<std::byte>;

constexpr auto sync_limit = 120s;  // only a hang reaches it
constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                  DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

tutti::gpu::DeviceKind device_kind() {
  const char* name = std::getenv("TUTTI_TEST_GPU_DEVICE");
  if (name == nullptr || *name == '\0' || std::string(name) == "emulated") return tutti::gpu::DeviceKind::emulated;
  if (std::string(name) == "cuda") return tutti::gpu::DeviceKind::cuda;
  throw std::invalid_argument(std::string("TUTTI_TEST_GPU_DEVICE: unknown device ") + name);
}

Bytes values(DataType type, std::size_t count, const std::function<double(std::size_t)>& value) {
  const std::size_t es = tutti::size_of(type);
  Bytes out(count * es);
  for (std::size_t i = 0; i < count; ++i) tutti::testing::store(type, out.data() + i * es, value(i));
  return out;
}

// One output of a batch: what the stream copies back into `result`, and what it must equal.
struct Expectation {
  std::string what;
  DataType type;
  Bytes result;
  Bytes expected;
};

// The calls of one batch, on two streams: device buffers and host copies stay alive until the
// streams are synchronised, then every expectation is compared.
class Batch {
 public:
  Batch(tutti::gpu::Communicator& gpu, const Stream (&streams)[2], tutti::gpu::Options options)
      : gpu_(gpu), streams_(streams), options_(options) {}
  ~Batch() {
    for (void* p : buffers_) gpu_.free(p);
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  const tutti::gpu::Options& options() const { return options_; }
  // The stream of the next call: the two alternate.
  Stream next() { return streams_[turn_++ % 2]; }
  // A device buffer holding `host` (nullptr for none), copied in on `stream`.
  void* upload(const Bytes& host, Stream stream) {
    if (host.empty()) return nullptr;
    void* d = gpu_.allocate(host.size());
    buffers_.push_back(d);
    inputs_.push_back(host);
    gpu_.copy(d, inputs_.back().data(), host.size(), stream);
    return d;
  }
  // A device buffer of `bytes` poisoned on `stream`.
  void* poisoned(std::size_t bytes, Stream stream) {
    return upload(Bytes(bytes, std::byte{tutti::testing::poison}), stream);
  }
  // Copies `bytes` of `device` back on `stream`, to be compared with `expected` after the batch.
  void expect(const std::string& what, DataType type, const void* device, Bytes expected, Stream stream) {
    Expectation& e = expectations_.emplace_back(Expectation{what, type, Bytes(expected.size()), std::move(expected)});
    if (!e.result.empty()) gpu_.copy(e.result.data(), device, e.result.size(), stream);
  }
  // Synchronises both streams, raises a recorded failure, then compares every output; returns the
  // number compared, or throws naming the first difference.
  std::size_t finish() {
    for (Stream s : streams_) gpu_.synchronize(s, sync_limit);
    gpu_.check();
    const std::size_t n = expectations_.size();
    for (const Expectation& e : expectations_) compare(e);
    expectations_.clear();
    inputs_.clear();
    return n;
  }

 private:
  static void compare(const Expectation& e) {
    const std::size_t es = tutti::size_of(e.type);
    for (std::size_t i = 0; i < e.expected.size(); i += es)
      if (std::memcmp(e.result.data() + i, e.expected.data() + i, es) != 0)
        throw std::runtime_error(e.what + ": element " + std::to_string(i / es) + " is " +
                                 std::to_string(tutti::testing::load(e.type, e.result.data() + i)) + ", expected " +
                                 std::to_string(tutti::testing::load(e.type, e.expected.data() + i)));
  }

  tutti::gpu::Communicator& gpu_;
  const Stream (&streams_)[2];
  tutti::gpu::Options options_;
  std::size_t turn_ = 0;
  std::vector<void*> buffers_;
  std::deque<Bytes> inputs_;
  std::deque<Expectation> expectations_;
};

std::string name(const char* what, DataType type, ReduceOp op, std::size_t count) {
  return std::string(what) + " " + std::string(tutti::to_string(type)) + " " + std::string(tutti::to_string(op)) +
         " count " + std::to_string(count);
}

void allreduce(Batch& b, tutti::gpu::Communicator& gpu, DataType type, ReduceOp op, std::size_t count, bool in_place) {
  const int p = gpu.size(), r = gpu.rank();
  const Stream s = b.next();
  const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, op, r, i); });
  void* send = b.upload(input, s);
  void* recv = in_place ? send : b.poisoned(input.size(), s);
  gpu.allreduce(send, recv, count, type, op, s, b.options());
  b.expect(name(in_place ? "allreduce in place" : "allreduce", type, op, count), type, recv,
           values(type, count, [&](std::size_t i) { return reference_reduction(type, op, p, i); }), s);
}

void reduce(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count, int root) {
  const int p = gpu.size(), r = gpu.rank();
  const DataType type = DataType::f32;
  const Stream s = b.next();
  const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
  void* send = b.upload(input, s);
  void* recv = b.poisoned(input.size(), s);
  gpu.reduce(send, recv, count, type, ReduceOp::sum, root, s, b.options());
  Bytes want = r == root
                   ? values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, p, i); })
                   : Bytes(input.size(), std::byte{tutti::testing::poison});
  b.expect(name("reduce", type, ReduceOp::sum, count) + " root " + std::to_string(root), type, recv, std::move(want),
           s);
}

void broadcast(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count, int root) {
  const DataType type = DataType::i32;
  const Stream s = b.next();
  const Bytes data = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, root, i); });
  void* buffer = gpu.rank() == root ? b.upload(data, s) : b.poisoned(data.size(), s);
  gpu.broadcast(buffer, count, type, root, s, b.options());
  b.expect("broadcast i32 count " + std::to_string(count) + " root " + std::to_string(root), type, buffer, data, s);
}

void allgather(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count, bool in_place) {
  const int p = gpu.size(), r = gpu.rank();
  const DataType type = DataType::f32;
  const std::size_t es = tutti::size_of(type), all = count * static_cast<std::size_t>(p);
  const Stream s = b.next();
  const auto value = [&](std::size_t k) { return input_value(type, ReduceOp::sum, static_cast<int>(k / count), k); };
  const Bytes expected = values(type, all, value);
  void* recv = nullptr;
  const void* send = nullptr;
  if (in_place) {
    // This rank's block at its place, the rest poisoned.
    Bytes start(all * es, std::byte{tutti::testing::poison});
    if (count > 0)  // no blocks: both vectors are empty, their data() may be null
      std::memcpy(start.data() + static_cast<std::size_t>(r) * count * es,
                  expected.data() + static_cast<std::size_t>(r) * count * es, count * es);
    recv = b.upload(start, s);
    send = recv == nullptr ? nullptr : static_cast<std::byte*>(recv) + static_cast<std::size_t>(r) * count * es;
  } else {
    send =
        b.upload(Bytes(expected.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count * es),
                       expected.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(r) + 1) * count * es)),
                 s);
    recv = b.poisoned(all * es, s);
  }
  gpu.allgather(send, recv, count, type, s, b.options());
  b.expect(std::string(in_place ? "allgather in place" : "allgather") + " f32 count " + std::to_string(count), type,
           recv, expected, s);
}

void reduce_scatter(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count) {
  const int p = gpu.size(), r = gpu.rank();
  const DataType type = DataType::f32;
  const Stream s = b.next();
  const std::size_t all = count * static_cast<std::size_t>(p), mine = static_cast<std::size_t>(r) * count;
  void* send = b.upload(values(type, all, [&](std::size_t k) { return input_value(type, ReduceOp::sum, r, k); }), s);
  void* recv = b.poisoned(count * tutti::size_of(type), s);
  gpu.reduce_scatter(send, recv, count, type, ReduceOp::sum, s, b.options());
  b.expect(name("reduce_scatter", type, ReduceOp::sum, count), type, recv,
           values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, p, mine + i); }),
           s);
}

// Element i of the block rank `from` sends to rank `to`.
double alltoall_value(int from, int to, std::size_t i) {
  return static_cast<double>((from * 131 + to * 17 + i) % 1000);
}

void alltoall(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count) {
  const int p = gpu.size(), r = gpu.rank();
  const DataType type = DataType::i32;
  const std::size_t all = count * static_cast<std::size_t>(p);
  const Stream s = b.next();
  void* send = b.upload(
      values(type, all, [&](std::size_t k) { return alltoall_value(r, static_cast<int>(k / count), k % count); }), s);
  void* recv = b.poisoned(all * tutti::size_of(type), s);
  gpu.alltoall(send, recv, count, type, s, b.options());
  b.expect("alltoall i32 count " + std::to_string(count), type, recv,
           values(type, all, [&](std::size_t k) { return alltoall_value(static_cast<int>(k / count), r, k % count); }),
           s);
}

// Every rank sends to the next and receives from the one before, on one stream, send first.
void ring(Batch& b, tutti::gpu::Communicator& gpu, std::size_t count) {
  const int p = gpu.size(), r = gpu.rank();
  const DataType type = DataType::i32;
  const int to = (r + 1) % p, from = (r + p - 1) % p;
  const Stream s = b.next();
  void* out = b.upload(values(type, count, [&](std::size_t i) { return alltoall_value(r, to, i); }), s);
  void* in = b.poisoned(count * tutti::size_of(type), s);
  gpu.send(out, count, type, to, s, 7);
  gpu.recv(in, count, type, from, s, 7);
  b.expect("send/recv ring i32 count " + std::to_string(count), type, in,
           values(type, count, [&](std::size_t i) { return alltoall_value(from, r, i); }), s);
}

// Every collective `backend` serves at `count`, on both streams; returns the results compared.
std::size_t sweep(tutti::gpu::Communicator& gpu, const Stream (&streams)[2], const std::string& backend,
                  tutti::gpu::Options options, std::size_t count) {
  const int p = gpu.size();
  const bool host_transfer = backend == "host_transfer", nccl = backend == "nccl";
  Batch b(gpu, streams, options);
  if (count <= static_cast<std::size_t>(p) + 1) {
    for (DataType type : all_types)
      for (ReduceOp op : all_ops) allreduce(b, gpu, type, op, count, false);
    for (int root = 0; root < p; ++root) {
      reduce(b, gpu, count, root);
      broadcast(b, gpu, count, root);
    }
  } else {
    allreduce(b, gpu, DataType::f32, ReduceOp::sum, count, false);
    reduce(b, gpu, count, p - 1);
    broadcast(b, gpu, count, p - 1);
  }
  allreduce(b, gpu, DataType::i32, ReduceOp::max, count, true);
  allgather(b, gpu, count, false);
  allgather(b, gpu, count, true);
  reduce_scatter(b, gpu, count);
  if (host_transfer || nccl) {
    alltoall(b, gpu, count);
    gpu.barrier(b.next(), options);
  }
  if (host_transfer && p > 1) ring(b, gpu, count);
  return b.finish();
}

// The pipelined 24 MiB f64 allreduce (chunks of host_transfer, steps of a smaller ipc staging)
// beside a 12 MiB f32 one on the other stream.
std::size_t pipelined(tutti::gpu::Communicator& gpu, const Stream (&streams)[2], tutti::gpu::Options options) {
  Batch b(gpu, streams, options);
  allreduce(b, gpu, DataType::f64, ReduceOp::sum, std::size_t{3} << 20, false);
  allreduce(b, gpu, DataType::f32, ReduceOp::sum, std::size_t{3} << 20, true);
  return b.finish();
}

int say(int rank, const char* verdict, const std::string& text) {
  std::printf("rank %d: %s %s\n", rank, verdict, text.c_str());
  std::fflush(stdout);
  return std::strcmp(verdict, "FAIL") == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc == 2 ? argv[1] : "";
  const auto named = tutti::gpu::backend_from_name(backend);
  if (!named || *named == tutti::gpu::Backend::automatic) {
    std::fprintf(stderr, "usage: gpu_gate_program host_transfer|ipc|nccl\n");
    return 2;
  }
  int rank = -1;
  try {
    const tutti::gpu::DeviceKind kind = device_kind();
    tutti::Communicator world = tutti::init();
    rank = world.rank();
    const char* job = std::getenv("TUTTI_JOB_ID");
    say(rank, "job", job != nullptr ? job : "unknown");
    tutti::gpu::Communicator gpu(world, kind);
    const int p = gpu.size();
    const tutti::gpu::Options options{*named, 30s};
    const Stream streams[2] = {gpu.create_stream(), gpu.create_stream()};
    // nccl cannot run on the emulated device, nor with two ranks on GPU 0: the first call refuses
    // on every rank alike, naming why, and enqueues nothing.
    const bool refused = backend == "nccl" && (kind == tutti::gpu::DeviceKind::emulated || p >= 2);
    if (refused) {
      void* data = gpu.allocate(4);
      try {
        gpu.allreduce(data, data, 1, DataType::f32, ReduceOp::sum, streams[0], options);
        gpu.synchronize(streams[0], sync_limit);
        return say(rank, "FAIL", "nccl ran where it must refuse");
      } catch (const tutti::Error& e) {
        const std::string what = e.what();
        const std::string reason = kind == tutti::gpu::DeviceKind::emulated ? "needs a CUDA device" : "share one GPU";
        if (e.code() != ErrorCode::unsupported || what.find("nccl backend is not available") == std::string::npos ||
            what.find(reason) == std::string::npos)
          return say(rank, "FAIL",
                     "nccl refused with " + std::string(tutti::to_string(e.code())) + ": " + what +
                         " (expected unsupported naming '" + reason + "')");
        gpu.free(data);
        return say(rank, "REFUSED", "unsupported: " + what);
      }
    }
    std::size_t checked = 0;
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p) + 1, std::size_t{1000003}})
      checked += sweep(gpu, streams, backend, options, count);
    checked += pipelined(gpu, streams, options);
    for (Stream s : streams) gpu.destroy_stream(s);
    return say(rank, "PASS",
               std::to_string(checked) + " results checked (" + backend + ", " +
                   (kind == tutti::gpu::DeviceKind::cuda ? "cuda" : "emulated") + ", p = " + std::to_string(p) + ")");
  } catch (const tutti::Error& e) {
    return say(rank, "FAIL", std::string(tutti::to_string(e.code())) + ": " + e.what());
  } catch (const std::exception& e) {
    return say(rank, "FAIL", e.what());
  }
}
