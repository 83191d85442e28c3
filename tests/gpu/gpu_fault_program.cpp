// A rank program for the GPU fault test (tests/gpu/gpu_fault_test.sh runs it under tutti-run, shared
// memory, on the device TUTTI_TEST_GPU_DEVICE names: emulated, the default, or cuda, every rank on
// GPU 0): a rank killed with kill -9 must release the other ranks' streams, and their next
// check() must raise peer_failure naming it.
//
//   gpu_fault_program MODE DIR COUNT BACKEND
//
// Every rank writes DIR/rank.R (its pid) at start, then runs a few allreduces on a stream
// (checked exactly). The last rank is the victim: it writes DIR/victim (the job id) and sleeps
// until the driver kills it (at most 30 s, then it exits 1). The others, the survivors:
//   MODE waiting  enqueue an allreduce of COUNT i32 that waits for the victim (which never
//                 calls it), check that the stream is held by it, write DIR/ready.R and
//                 synchronize.
//   MODE issued   the same, but the victim issues the allreduce too, on a stream it holds for
//                 ever (so the operation is agreed on, and the victim's stream never reaches it).
//   MODE held     hold the stream (wait_value on a flag of their own) before the allreduce,
//                 write DIR/ready.R, wait for DIR/killed, and only then lift the hold: the
//                 stream reaches the collective after the victim died.
// Every allreduce asks for BACKEND (automatic, host_transfer or ipc) in gpu::Options::backend.
// The driver kills the victim (SIGKILL), then writes DIR/killed holding the kill's time
// (CLOCK_REALTIME, ns). A survivor passes when synchronize returns within its 10 s bound after the
// kill, a marker enqueued after the collective ran, check() and the next call raise peer_failure
// naming the victim, and the release came at most 5 s after the kill. It prints
//   rank R: PASS released N ms after the kill: peer_failure: MESSAGE
// (or "rank R: FAIL WHY") and exits 0 on a pass, 1 otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "gpu/access.hpp"
#include "gpu/gpu_impl.hpp"
#include "tutti/gpu.hpp"
#include "tutti/tutti.hpp"

namespace {

using namespace std::chrono_literals;
using tutti::DataType;
using tutti::ErrorCode;
using tutti::ReduceOp;

constexpr auto release_limit = 10s;     // synchronize's bound: only a stream never released reaches it
constexpr auto release_bound = 5000ms;  // from the kill to the release: hang detection, not speed
constexpr auto victim_limit = 30s;      // a victim nobody kills gives up

tutti::gpu::Options options;  // the backend (main sets it)

// TUTTI_TEST_GPU_DEVICE: cuda (every rank on GPU 0; scripts/gpu_check.sh) or emulated (the default).
tutti::gpu::DeviceKind device_kind() {
  const char* name = std::getenv("TUTTI_TEST_GPU_DEVICE");
  if (name == nullptr || *name == '\0' || std::string(name) == "emulated") return tutti::gpu::DeviceKind::emulated;
  if (std::string(name) == "cuda") return tutti::gpu::DeviceKind::cuda;
  throw std::invalid_argument(std::string("TUTTI_TEST_GPU_DEVICE: unknown device ") + name);
}

std::int64_t wall_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return std::int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

// Writes `text` to DIR/name atomically (a rename), so the driver never reads half a file.
void publish(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
}

// The kill's time from DIR/killed, waiting for it at most `limit`; 0 if it never came.
std::int64_t kill_time(const std::string& dir, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    std::ifstream in(dir + "/killed");
    std::int64_t ns = 0;
    if (in >> ns) return ns;
    if (std::chrono::steady_clock::now() >= deadline) return 0;
    std::this_thread::sleep_for(2ms);
  }
}

// The victim in mode `issued`: issues the allreduce behind a hold that nobody lifts.
void issue_held(tutti::gpu::Communicator& gpu, tutti::gpu::Stream stream, std::size_t count) {
  auto& device = tutti::gpu::detail::Access::impl(gpu)->device();
  auto* hold = static_cast<std::uint32_t*>(device.allocate_pinned(sizeof(std::uint32_t)));
  void* data = gpu.allocate(count * 4);
  device.wait_value(hold, 1, {stream});
  gpu.allreduce(data, data, count, DataType::i32, ReduceOp::sum, stream, options);
}

std::int32_t input(int rank, std::size_t i) { return (rank + 1) * static_cast<std::int32_t>(i % 7 + 1); }

// A few allreduces (one pipelined in chunks) that every rank joins, each result compared exactly.
std::string warm_up(tutti::gpu::Communicator& gpu, tutti::gpu::Stream stream) {
  const int p = gpu.size();
  for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{3000017}}) {
    std::vector<std::int32_t> host(count), result(count, -1);
    for (std::size_t i = 0; i < count; ++i) host[i] = input(gpu.rank(), i);
    void* data = gpu.allocate(count * 4);
    gpu.copy(data, host.data(), count * 4, stream);
    gpu.allreduce(data, data, count, DataType::i32, ReduceOp::sum, stream, options);
    gpu.copy(result.data(), data, count * 4, stream);
    gpu.synchronize(stream, 20s);
    gpu.free(data);
    for (std::size_t i = 0; i < count; ++i)
      if (result[i] != p * (p + 1) / 2 * static_cast<std::int32_t>(i % 7 + 1))
        return "warm-up allreduce of " + std::to_string(count) + ": element " + std::to_string(i) + " is " +
               std::to_string(result[i]);
  }
  return "";
}

int fail(int rank, const std::string& why) {
  std::printf("rank %d: FAIL %s\n", rank, why.c_str());
  std::fflush(stdout);
  return 1;
}

// A survivor: the collective that waits for the victim, the release, and the error.
int survive(tutti::gpu::Communicator& gpu, tutti::gpu::Stream stream, const std::string& mode, const std::string& dir,
            std::size_t count) {
  const int rank = gpu.rank(), victim = gpu.size() - 1;
  auto& device = tutti::gpu::detail::Access::impl(gpu)->device();
  auto* flags = static_cast<std::uint32_t*>(device.allocate_pinned(2 * sizeof(std::uint32_t)));
  std::uint32_t* hold = flags;
  std::uint32_t* marker = flags + 1;
  std::vector<std::int32_t> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = input(rank, i);
  void* data = gpu.allocate(count * 4);
  const bool held = mode == "held";
  if (held) device.wait_value(hold, 1, {stream});
  gpu.copy(data, host.data(), count * 4, stream);
  gpu.allreduce(data, data, count, DataType::i32, ReduceOp::sum, stream, options);
  device.write_value(marker, 1, {stream});
  if (!held) {
    // The stream waits for the victim, which never calls: this bounded wait must run out.
    try {
      gpu.synchronize(stream, 200ms);
      return fail(rank, "the allreduce completed without the victim");
    } catch (const tutti::Error& e) {
      if (e.code() != ErrorCode::timeout) return fail(rank, "before the kill: " + std::string(e.what()));
    }
  }
  publish(dir, "ready." + std::to_string(rank), std::to_string(getpid()));
  std::int64_t killed = 0;
  std::int64_t lifted = 0;
  if (held) {
    killed = kill_time(dir, 30s);
    if (killed == 0) return fail(rank, "no kill within 30 s");
    if (tutti::device::Device::load_flag(marker) != 0) return fail(rank, "the marker ran while the stream was held");
    lifted = wall_ns();
    device.set_flag(hold, 1);
  }
  try {
    gpu.synchronize(stream, release_limit);
  } catch (const tutti::Error& e) {
    return fail(rank, "the stream was not released: " + std::string(e.what()));
  }
  const std::int64_t released = wall_ns();
  if (!held) killed = kill_time(dir, 5s);
  if (killed == 0) return fail(rank, "released, but no kill time was written");
  if (released < killed) return fail(rank, "released before the kill");
  if (tutti::device::Device::load_flag(marker) != 1) return fail(rank, "the marker after the collective did not run");
  const auto after_kill = std::chrono::milliseconds((released - killed) / 1000000);
  std::string what;
  try {
    gpu.check();
    return fail(rank, "released, but check() raised nothing");
  } catch (const tutti::Error& e) {
    what = std::string(tutti::to_string(e.code())) + ": " + e.what();
    if (e.code() != ErrorCode::peer_failure) return fail(rank, "check() raised " + what);
    if (what.find("rank " + std::to_string(victim)) == std::string::npos)
      return fail(rank, "the error does not name rank " + std::to_string(victim) + ": " + what);
  }
  try {
    gpu.allreduce(data, data, count, DataType::i32, ReduceOp::sum, stream, options);
    return fail(rank, "the next allreduce raised nothing");
  } catch (const tutti::Error& e) {
    if (e.code() != ErrorCode::peer_failure) return fail(rank, "the next allreduce raised " + std::string(e.what()));
  }
  if (after_kill > release_bound)
    return fail(rank, "released " + std::to_string(after_kill.count()) + " ms after the kill");
  std::string lift;
  if (held) lift = " (" + std::to_string((released - lifted) / 1000000) + " ms after the hold was lifted)";
  std::printf("rank %d: PASS released %lld ms after the kill%s: %s\n", rank, static_cast<long long>(after_kill.count()),
              lift.c_str(), what.c_str());
  std::fflush(stdout);
  gpu.free(data);
  device.free_pinned(flags);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 4 ? argv[4] : "";
  const auto named = tutti::gpu::backend_from_name(backend);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc != 5 || (mode != "waiting" && mode != "issued" && mode != "held") || !named ||
      *named == tutti::gpu::Backend::nccl) {
    std::fprintf(stderr, "usage: gpu_fault_program waiting|issued|held DIR COUNT automatic|host_transfer|ipc\n");
    return 2;
  }
  options.backend = *named;
  const std::string dir = argv[2];
  const std::size_t count = std::strtoull(argv[3], nullptr, 10);
  int rank = -1;
  try {
    tutti::Communicator world = tutti::init();
    rank = world.rank();
    publish(dir, "rank." + std::to_string(rank), std::to_string(getpid()));
    tutti::gpu::Communicator gpu(world, device_kind());
    const tutti::gpu::Stream stream = gpu.create_stream();
    if (const std::string wrong = warm_up(gpu, stream); !wrong.empty()) return fail(rank, wrong);
    std::printf("rank %d: warm-up OK\n", rank);
    std::fflush(stdout);
    if (rank == world.size() - 1) {
      if (mode == "issued") issue_held(gpu, stream, count);
      const char* job = std::getenv("TUTTI_JOB_ID");
      publish(dir, "victim", job != nullptr ? job : "unknown");
      std::this_thread::sleep_for(victim_limit);
      return fail(rank, "the victim was not killed within 30 s");
    }
    return survive(gpu, stream, mode, dir, count);
  } catch (const std::exception& e) {
    return fail(rank, e.what());
  }
}
