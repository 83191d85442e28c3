#include "gpu/verdict.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <vector>

#include <signal.h>

#include <cerrno>

#include "comm/topology.hpp"

namespace tutti::gpu::detail {

namespace {

struct Descriptor {
  std::int32_t kind = 0, collective = 0, type = 0, op = -1, root = -1, peer = -1;
  std::uint64_t count = 0;
  friend bool operator==(const Descriptor&, const Descriptor&) = default;
};

Descriptor describe(const DeviceCall& dc) {
  const auto& c = dc.call;
  return {static_cast<std::int32_t>(dc.kind),
          static_cast<std::int32_t>(c.collective),
          static_cast<std::int32_t>(c.type),
          c.op ? static_cast<std::int32_t>(*c.op) : -1,
          c.root,
          dc.peer,
          c.count};
}

std::string text_of(const Descriptor& d) {
  const char* names[] = {"", "send", "recv"};
  std::string s =
      d.kind != 0 ? std::string(names[d.kind]) : std::string(to_string(static_cast<Collective>(d.collective)));
  s += "(count=" + std::to_string(d.count) + ", " + std::string(to_string(static_cast<DataType>(d.type)));
  if (d.op >= 0) s += ", " + std::string(to_string(static_cast<ReduceOp>(d.op)));
  if (d.root >= 0) s += ", root=" + std::to_string(d.root);
  if (d.peer >= 0) s += ", peer=" + std::to_string(d.peer);
  return s + ")";
}

}  // namespace

std::optional<Error> check_same_call(tutti::Communicator& host, const DeviceCall& call, const std::string& what) {
  const Descriptor mine = describe(call);
  std::vector<Descriptor> all(static_cast<std::size_t>(host.size()));
  const auto started = std::chrono::steady_clock::now();
  try {
    tutti::Request request = host.iallgather(&mine, all.data(), sizeof(Descriptor), DataType::u8,
                                             {Algorithm::automatic, call.call.options.timeout});
    request.wait_for(std::chrono::hours(1), started);  // its own timeout, from `started`, ends it
  } catch (const Error& error) {
    return Error(error.code(), what + ": " + error.what());
  }
  // Point-to-point operations pair with one peer, which calls the other kind: only collectives
  // must agree with every rank.
  if (call.kind != DeviceCall::Kind::collective) return std::nullopt;
  const int me = host.rank();
  for (int j = 0; j < host.size(); ++j)
    if (all[static_cast<std::size_t>(j)] != mine) {
      const int a = std::min(j, me), b = std::max(j, me);
      return Error(ErrorCode::mismatch, what + ": mismatched collective: rank " + std::to_string(a) + " called " +
                                            text_of(all[static_cast<std::size_t>(a)]) + " but rank " +
                                            std::to_string(b) + " called " + text_of(all[static_cast<std::size_t>(b)]));
    }
  return std::nullopt;
}

bool process_dead(std::int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(") ");
  return close != std::string::npos && close + 2 < text.size() && (text[close + 2] == 'Z' || text[close + 2] == 'X');
}

std::string host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return tutti::comm::topology_host_name().substr(0, 120) + "/" + boot;
}

}  // namespace tutti::gpu::detail
