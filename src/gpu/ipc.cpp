// The ipc backend (the protocol is in ipc.hpp): set-up and teardown, the watchdog and failures;
// the streams' side of each step is in ipc_steps.cpp.
#include "gpu/ipc.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/env.hpp"
#include "gpu/verdict.hpp"

namespace tutti::gpu::detail {

namespace {

constexpr std::size_t block_bytes = 256;        // one rank's flags (each on its own 64-byte line)
constexpr std::size_t words_per_line = 64 / 4;  // uint32 words
constexpr std::uint32_t release_lead = 1u << 30;
constexpr std::size_t failure_text_bytes = 256;  // the published failure's text, after its word
constexpr std::uint32_t being_written = 0xffffffffu;

// What every rank tells the others at setup.
struct Entry {
  char host[192] = {};  // hostname and boot id: equal on one host only
  std::int64_t pid = 0;
  device::IpcHandle staging;
  char control[64] = {};  // the flag segment's name (rank 0's)
  std::uint32_t ok = 0;
};

}  // namespace

std::size_t Ipc::default_capacity() {
  static const std::size_t capacity = [] {
    const auto text = core::env("TUTTI_GPU_IPC_BYTES");
    if (!text) return std::size_t{32} << 20;
    const long long bytes = core::parse_count(*text, "TUTTI_GPU_IPC_BYTES");
    if (bytes < 4096) throw Error(ErrorCode::invalid_argument, "TUTTI_GPU_IPC_BYTES: at least 4096 bytes");
    return static_cast<std::size_t>(bytes);
  }();
  return capacity;
}

Ipc::Ipc(std::shared_ptr<device::Device> device, tutti::Communicator host, std::size_t capacity,
         std::shared_ptr<LocalOrder> order)
    : device_(std::move(device)),
      host_(std::move(host)),
      order_(std::move(order)),
      rank_(host_.rank()),
      size_(host_.size()),
      capacity_(capacity) {
  const auto p = static_cast<std::size_t>(size_);
  control_bytes_ = p * block_bytes + 64 + failure_text_bytes;
  Entry mine;
  std::string why;
  std::snprintf(mine.host, sizeof(mine.host), "%s", host_identity().c_str());
  mine.pid = getpid();
  try {
    mine_ = device_->allocate_shared(capacity_, mine.staging);
    mine.ok = 1;
  } catch (const Error& error) {
    why = error.what();
  }
  int control_fd = -1;
  if (rank_ == 0 && mine.ok) {
    std::random_device random;
    std::snprintf(mine.control, sizeof(mine.control), "/tutti-gpu-ipc-%lld-%08x", static_cast<long long>(getpid()),
                  random());
    control_fd = shm_open(mine.control, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (control_fd < 0 || ftruncate(control_fd, static_cast<off_t>(control_bytes_)) != 0) {
      why = std::string("shm_open ") + mine.control + ": " + std::strerror(errno);
      mine.ok = 0;
    }
  }
  std::vector<Entry> all(p);
  host_.allgather(&mine, all.data(), sizeof(Entry), DataType::u8);
  std::string refusal;
  for (int r = 0; r < size_ && refusal.empty(); ++r) {
    if (!all[static_cast<std::size_t>(r)].ok)
      refusal = "rank " + std::to_string(r) + " could not share its memory" + (r == rank_ ? " (" + why + ")" : "");
    else if (std::strncmp(all[static_cast<std::size_t>(r)].host, all[0].host, sizeof(Entry::host)) != 0)
      refusal = "ranks 0 and " + std::to_string(r) + " are on different hosts";
  }
  // Map the flags and the peers' staging; then agree that every rank did.
  std::uint8_t ok = refusal.empty() ? 1 : 0;
  if (ok) {
    try {
      if (control_fd < 0) control_fd = shm_open(all[0].control, O_RDWR, 0600);
      if (control_fd < 0) throw Error(ErrorCode::system, std::string("shm_open: ") + std::strerror(errno));
      void* m = mmap(nullptr, control_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, control_fd, 0);
      if (m == MAP_FAILED) throw Error(ErrorCode::system, std::string("mmap: ") + std::strerror(errno));
      control_ = static_cast<std::byte*>(m);
      device_->register_pinned(control_, control_bytes_);
      staging_.assign(p, nullptr);
      for (std::size_t r = 0; r < p; ++r)
        staging_[r] = static_cast<int>(r) == rank_
                          ? static_cast<std::byte*>(mine_)
                          : static_cast<std::byte*>(device_->open_shared(all[r].staging, capacity_));
    } catch (const Error& error) {
      refusal = std::string("rank ") + std::to_string(rank_) + ": " + error.what();
      ok = 0;
    }
  }
  if (control_fd >= 0) close(control_fd);
  std::uint8_t all_ok = 0;
  host_.allreduce(&ok, &all_ok, 1, DataType::u8, ReduceOp::min);
  if (rank_ == 0 && all[0].control[0] != '\0') shm_unlink(all[0].control);
  if (!all_ok) {
    for (std::size_t r = 0; r < staging_.size(); ++r)
      if (staging_[r] != nullptr && static_cast<int>(r) != rank_) device_->close_shared(staging_[r]);
    if (control_ != nullptr) {
      if (ok) device_->unregister_pinned(control_);
      munmap(control_, control_bytes_);
    }
    device_->free(mine_);
    throw Error(ErrorCode::unsupported, "tutti::gpu: the ipc backend is not available: " +
                                            (refusal.empty() ? "a peer could not map" : refusal));
  }
  for (const Entry& e : all) pids_.push_back(e.pid);
  done_ = static_cast<std::uint32_t*>(device_->allocate_pinned(2 * sizeof(std::uint32_t)));
  validated_ = done_ + 1;
  watchdog_ = std::make_unique<Watchdog>(static_cast<Watchdog::Watched&>(*this), host_, pids_);
}

Ipc::~Ipc() {
  if (order_) order_->leave(rank_);
  watchdog_->stop();
  const std::uint32_t last = last_issued_.load();
  const bool idle = device::Device::reached(device::Device::load_flag(done_), issued_);
  if (!idle && !watchdog_->recorded())
    fail(Error(ErrorCode::aborted,
               "ipc: rank " + std::to_string(rank_) + " destroyed its gpu::Communicator with operations in flight"));
  // The peers may still read this rank's staging: wait for them (bounded, and not for the dead).
  bool peers_done = true;
  if (idle && !watchdog_->recorded()) {
    const auto deadline = std::chrono::steady_clock::now() + core::default_timeout();
    for (int j = 0; j < size_; ++j)
      while (!device::Device::reached(device::Device::load_flag(flag(j, consumed)), last)) {
        if (noticed(nullptr) || std::chrono::steady_clock::now() > deadline ||
            process_dead(pids_[static_cast<std::size_t>(j)])) {
          peers_done = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
  }
  // Memory a stream of this rank may still touch (operations in flight, or a failure) stays: the
  // device frees its own allocations when it goes (after its streams' queued work). So does all
  // of it while a stream of the device is busy (held by the caller's flag, another backend's
  // operation): each free below waits for every stream of the context on CUDA, for ever behind a
  // held one, and the device's destructor leaves its memory allocated if that stream still is.
  if (!idle || !device_->held_streams(std::chrono::milliseconds(0)).empty()) return;
  for (std::size_t r = 0; r < staging_.size(); ++r)
    if (static_cast<int>(r) != rank_) device_->close_shared(staging_[r]);
  if (peers_done) device_->free(mine_);
  device_->unregister_pinned(control_);
  munmap(control_, control_bytes_);
}

std::uint32_t* Ipc::flag(int rank, Flag f) const {
  return reinterpret_cast<std::uint32_t*>(control_ + static_cast<std::size_t>(rank) * block_bytes) +
         static_cast<std::size_t>(f) * words_per_line;
}

void Ipc::check() { watchdog_->check(); }

std::string Ipc::describe(const Operation& op) const {
  return "ipc " + std::string(to_string(op.call.call.collective)) + " (operation " + std::to_string(op.n) + ")";
}

bool Ipc::stream_reached(const Operation& op) const {
  return device::Device::reached(device::Device::load_flag(flag(rank_, reached)), op.first);
}

bool Ipc::stream_done(const Operation& op) const {
  return device::Device::reached(device::Device::load_flag(done_), op.n);
}

void Ipc::compared(const Operation& op, bool failed) {
  // Once a failure is known the verdict goes past every operation: a stream must not wait for the
  // comparison of an operation that a failed peer never issued. After a failure recorded
  // meanwhile too: keep it there.
  if (!failed) device_->set_flag(validated_, op.n);
  if (failed || watchdog_->recorded()) device_->set_flag(validated_, last_issued_.load() + release_lead);
}

std::string Ipc::late(const Operation&) const {
  const std::uint32_t at = device::Device::load_flag(flag(rank_, reached));
  std::string late;
  for (int j = 0; j < size_; ++j)
    if (!device::Device::reached(device::Device::load_flag(flag(j, reached)), at))
      late += (late.empty() ? "" : ", ") + std::to_string(j);
  return late.empty() ? "" : "; the streams of rank(s) " + late + " had not reached it";
}

std::optional<Error> Ipc::noticed(const Operation*) {
  const auto* word = reinterpret_cast<std::uint32_t*>(control_ + static_cast<std::size_t>(size_) * block_bytes);
  const std::uint32_t packed =
      std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(word)).load(std::memory_order_acquire);
  if (packed == 0 || packed == being_written) return std::nullopt;  // being written: the next look sees it
  const auto code = static_cast<ErrorCode>((packed & 0xff) - 1);
  const auto by = static_cast<int>(packed >> 8);
  if (by == rank_) return std::nullopt;
  const char* text = reinterpret_cast<const char*>(word) + 64;
  return Error(code,
               "ipc: rank " + std::to_string(by) + " failed: " + std::string(text, strnlen(text, failure_text_bytes)));
}

void Ipc::release(const Error& error) {
  // The first rank to fail publishes its code, its rank and its text (so that every rank names
  // the dead peer or the late ones): it claims the word, writes the text, then the word's value
  // (code + 1) | rank << 8. All before the release, so a rank whose stream was released by it
  // finds the failure published.
  auto* word = reinterpret_cast<std::uint32_t*>(control_ + static_cast<std::size_t>(size_) * block_bytes);
  std::uint32_t expected = 0;
  if (std::atomic_ref<std::uint32_t>(*word).compare_exchange_strong(expected, being_written,
                                                                    std::memory_order_acq_rel)) {
    char* text = reinterpret_cast<char*>(word) + 64;
    const std::string what = error.what();
    const std::size_t n = std::min(what.size(), failure_text_bytes - 1);
    std::memcpy(text, what.data(), n);
    text[n] = '\0';
    const auto packed = (static_cast<std::uint32_t>(error.code()) + 1) | static_cast<std::uint32_t>(rank_) << 8;
    std::atomic_ref<std::uint32_t>(*word).store(packed, std::memory_order_release);
  }
  release_all();
}

void Ipc::release_all() {
  const std::uint32_t value = last_issued_.load() + release_lead;
  for (int j = 0; j < size_; ++j)
    for (int f = 0; f < flags; ++f) device_->set_flag(flag(j, static_cast<Flag>(f)), value);
  // And this rank's verdict: a stream must not wait for the exchange of an operation that a
  // failed peer never issued (that exchange ends only at the host communicator's timeout).
  device_->set_flag(validated_, value);
}

}  // namespace tutti::gpu::detail
