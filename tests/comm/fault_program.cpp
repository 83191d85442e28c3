// A rank program for the fault tests (tests/comm/fault_test.sh runs it under tutti-run):
//
//   fault_program kill             rank 1 kills itself (SIGKILL) during a large allreduce loop
//   fault_program stop             rank 1 stops itself (SIGSTOP) during the loop
//   fault_program exit             rank 1 leaves the loop early and exits normally (status 0),
//                                  closing its communicator, while the others wait for it
//   fault_program mismatch-count   rank 1 passes another count (also -type, -op, -root)
//   fault_program bad-token        rank 0 connects to rank 1's TCP port with a wrong token, then
//                                  the job runs collectives as usual
//
// Every rank prints one line "rank R: <code>: <message>" for the error it got (or "rank R: ok").
// It exits 3 when it got the error the mode expects (non-zero, so that tutti-run ends the job),
// 0 when the mode expects success and it succeeded, else 1.
#include <glob.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "tutti/tutti.hpp"

namespace {

using namespace tutti;

int report(int rank, const std::string& what, bool as_expected) {
  std::printf("rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  return as_expected ? 3 : 1;
}

// Large allreduces until something fails; `victim` raises `sig` at iteration 3.
int loop_until_failure(Communicator& world, int victim, int sig, ErrorCode expected) {
  std::vector<float> data(std::size_t{1} << 22, 1.0f);
  try {
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && world.rank() == victim) ::raise(sig);
      world.allreduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum);
    }
  } catch (const Error& e) {
    return report(world.rank(), std::string(to_string(e.code())) + ": " + e.what(), e.code() == expected);
  }
  return report(world.rank(), "ok", false);
}

// Rank 1 stops after 3 allreduces and returns (its caller destroys the communicator and exits 0);
// the others go on and must fail at once, naming it, instead of waiting out the timeout.
int leave_early(Communicator& world) {
  std::vector<float> data(std::size_t{1} << 16, 1.0f);
  try {
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && world.rank() == 1) {
        report(world.rank(), "leaving", false);
        return 0;
      }
      world.allreduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum);
    }
  } catch (const Error& e) {
    return report(world.rank(), std::string(to_string(e.code())) + ": " + e.what(),
                  e.code() == ErrorCode::peer_failure);
  }
  return report(world.rank(), "ok", false);
}

// 20000 elements: above what a direct collective carries inline over shared memory (inline_bytes)
// and what a rooted call over TCP runs ahead with (exec::Plan::run_ahead_bytes), where a rooted
// call's ranks that return first learn of a mismatch from their next call.
int mismatch(Communicator& world, const std::string& what) {
  constexpr std::size_t n = 20000;
  std::vector<std::int32_t> data(n, 1);
  const bool odd = world.rank() == 1;
  std::size_t count = n;
  DataType type = DataType::i32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  if (odd && what == "count") count = n - 1;
  if (odd && what == "type") type = DataType::u32;
  if (odd && what == "op") op = ReduceOp::max;
  if (odd && what == "root") root = 1;
  try {
    if (what == "root")
      world.reduce(data.data(), data.data(), count, type, op, root);
    else
      world.allreduce(data.data(), data.data(), count, type, op);
  } catch (const Error& e) {
    return report(world.rank(), std::string(to_string(e.code())) + ": " + e.what(), e.code() == ErrorCode::mismatch);
  }
  return report(world.rank(), "ok", false);
}

// Connects to `host:port` and runs the handshake with a wrong token: it must be refused.
bool rogue_connection_refused(const std::string& address) {
  const auto colon = address.rfind(':');
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints, &found) != 0)
    return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const bool connected = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  ::freeaddrinfo(found);
  std::string why;
  const bool accepted =
      connected &&
      bootstrap::handshake(fd, "not-the-token", true, std::chrono::steady_clock::now() + std::chrono::seconds(5), &why);
  ::close(fd);
  return !accepted;  // once the mesh is complete the port is closed: refused before the handshake
}

// Rank 1's listening address in tutti-run's file store, read from the file of the key
// "tutti/<job>/<run>/tcp/1/1" (the run id is known only to the ranks; the store escapes '/' as %2F).
std::string rank_one_address() {
  const std::string dir = std::string(std::getenv("TUTTI_STORE")).substr(std::strlen("file://"));
  glob_t found{};
  const bool one = ::glob((dir + "/tutti%2F*%2Ftcp%2F1%2F1").c_str(), 0, nullptr, &found) == 0 && found.gl_pathc == 1;
  std::string address;
  if (one) std::getline(std::ifstream(found.gl_pathv[0]), address);
  ::globfree(&found);
  return address;
}

int bad_token(Communicator& world) {
  bool refused = true;
  if (world.rank() == 0) {
    const std::string address = rank_one_address();
    refused = !address.empty() && rogue_connection_refused(address);
  }
  try {
    std::vector<double> data(100000, world.rank());
    for (int i = 0; i < 5; ++i) world.allreduce(data.data(), data.data(), data.size(), DataType::f64, ReduceOp::max);
    world.barrier();
    const bool ok = refused && data[0] == world.size() - 1;
    report(world.rank(), ok ? "ok" : "rogue connection accepted or wrong result", ok);
    return ok ? 0 : 1;
  } catch (const Error& e) {
    return report(world.rank(), std::string(to_string(e.code())) + ": " + e.what(), false);
  }
}

// Every rank adds JOB_TAG (its job's number): a rank that joined another job's ranks gets a sum
// that is not size × tag, or a size that is not TUTTI_SIZE.
int job_sum(Communicator& world) {
  const char* tag_text = std::getenv("JOB_TAG");
  const char* size_text = std::getenv("JOB_SIZE") ? std::getenv("JOB_SIZE") : std::getenv("TUTTI_SIZE");
  const std::int64_t tag = tag_text ? std::atoll(tag_text) : 0;
  bool ok = size_text && world.size() == std::atoi(size_text);
  for (int i = 0; i < 3 && ok; ++i) {
    std::vector<std::int64_t> data(1000, tag);
    world.allreduce(data.data(), data.data(), data.size(), DataType::i64, ReduceOp::sum);
    ok = std::all_of(data.begin(), data.end(), [&](std::int64_t v) { return v == tag * world.size(); });
  }
  report(world.rank(), ok ? "ok job " + std::to_string(tag) : "wrong size or sum: another job's ranks joined", ok);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  Communicator world;
  try {
    world = init();
  } catch (const Error& e) {
    // With the code, as report() prints it: a rank still finishing init's barrier can receive the
    // abort of a later collective first (over TCP another peer's abort may overtake the barrier's
    // last message) and raises that error from init, which is the job's error all the same.
    std::printf("rank ?: init failed: %s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    return 1;
  }
  if (mode == "kill") return loop_until_failure(world, 1, SIGKILL, ErrorCode::peer_failure);
  if (mode == "stop") return loop_until_failure(world, 1, SIGSTOP, ErrorCode::timeout);
  if (mode == "exit") return leave_early(world);
  if (mode.rfind("mismatch-", 0) == 0) return mismatch(world, mode.substr(9));
  if (mode == "bad-token") return bad_token(world);
  if (mode == "job-sum") return job_sum(world);
  std::fprintf(stderr, "fault_program: unknown mode '%s'\n", mode.c_str());
  return 2;
}
