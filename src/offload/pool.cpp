// The offload pool (tutti/offload.hpp): a table of blocks over one device and one swap stream.
//
// Every copy between a block's device memory and its host copy runs on the swap stream, which is
// in order, and each block remembers the event recorded after its latest copy (`transit` says
// which way it went). Device memory is freed, and a block handed to a caller, only once that
// event is complete: a copy never reads memory already freed or written by the caller.
#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "tutti/offload.hpp"

namespace tutti::offload {
namespace detail {
namespace {

[[noreturn]] void invalid(const char* function, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, std::string("tutti::offload::Pool::") + function + ": " + what);
}

device::Kind kind_of(const Options& options) {
  if (!options.device) return device::kind_from_env(device::Kind::emulated);
  return *options.device;
}

}  // namespace

class PoolImpl {
 public:
  PoolImpl(std::size_t budget, const Options& options)
      : budget_(budget), options_(options), device_(device::make_device(kind_of(options), options.ordinal)) {
    stream_ = device_->create_stream();
  }

  ~PoolImpl() {
    try {
      device_->synchronize(stream_, options_.timeout);
    } catch (const Error&) {
      // The copies failed or hang: the memory is freed below regardless (the emulated device's
      // destroy_stream finishes them first).
    }
    for (auto& [id, entry] : blocks_) release_memory(entry);
    device_->destroy_stream(stream_);
  }

  Block allocate(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    if (bytes == 0) invalid("allocate", "0 bytes requested");
    Entry entry{.bytes = bytes, .charge = Pool::charge(bytes)};
    make_room(entry.charge, true);
    entry.device = device_->allocate(bytes);
    entry.holds = 1;
    entry.last_use = ++tick_;
    charge(entry.charge);
    const Block block{++next_id_};
    blocks_.emplace(block.id, entry);
    return block;
  }

  void* acquire(Block block, Access access) {
    std::lock_guard lock(mutex_);
    Entry& entry = find(block, "acquire");
    if (entry.device != nullptr) {
      ++counters_.acquire_hits;
      if (entry.prefetched) ++counters_.prefetch_hits;
    } else {
      copy_in(entry);
    }
    // A copy in must land before the caller reads; a copy out must have read before it writes.
    if (entry.transit == Transit::in || access == Access::write) wait_for(entry);
    ++entry.holds;
    entry.last_use = ++tick_;
    entry.prefetched = false;
    if (access == Access::write) entry.host_valid = false;
    return entry.device;
  }

  void* data(Block block) const {
    std::lock_guard lock(mutex_);
    const Entry& entry = find(block, "data");
    if (entry.holds == 0) invalid("data", "block " + std::to_string(block.id) + " is not held");
    return entry.device;
  }

  void release(Block block) {
    std::lock_guard lock(mutex_);
    Entry& entry = find(block, "release");
    if (entry.holds == 0) invalid("release", "block " + std::to_string(block.id) + " is not held");
    --entry.holds;
    entry.last_use = ++tick_;
  }

  bool prefetch(Block block) {
    std::lock_guard lock(mutex_);
    Entry& entry = find(block, "prefetch");
    if (entry.device != nullptr) return true;
    if (!make_room(entry.charge, false)) return false;
    copy_in(entry);
    entry.prefetched = true;
    entry.last_use = ++tick_;
    return true;
  }

  bool swap_out(Block block) {
    std::lock_guard lock(mutex_);
    Entry& entry = find(block, "swap_out");
    if (!options_.swap || entry.holds > 0 || entry.device == nullptr) return false;
    if (!entry.host_valid) copy_out(entry);
    return true;
  }

  void free(Block block) {
    if (!block) return;
    std::lock_guard lock(mutex_);
    Entry& entry = find(block, "free");
    wait_for(entry);
    if (entry.device != nullptr) counters_.in_use_bytes -= entry.charge;
    release_memory(entry);
    blocks_.erase(block.id);
  }

  bool resident(Block block) const {
    std::lock_guard lock(mutex_);
    return find(block, "resident").device != nullptr;
  }

  std::size_t size(Block block) const {
    std::lock_guard lock(mutex_);
    return find(block, "size").bytes;
  }

  std::size_t budget() const { return budget_; }
  bool swapping() const { return options_.swap; }
  bool host_addressable() const { return device_->kind() == device::Kind::emulated; }
  std::string device_name() const { return device_->name(); }

  Counters counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }

 private:
  enum class Transit { none, in, out };  // the direction of the block's latest swap copy
  struct Entry {
    std::size_t bytes = 0;
    std::size_t charge = 0;   // bytes rounded up to the device's alignment: what counts
    void* device = nullptr;   // null while swapped out
    void* host = nullptr;     // pinned; made at the first swap out, kept until free
    bool host_valid = false;  // the host copy holds the current contents (or will, once the copy ends)
    Transit transit = Transit::none;
    device::Event event{};  // recorded after the latest swap copy (while transit != none)
    int holds = 0;
    std::uint64_t last_use = 0;
    bool prefetched = false;  // brought back by prefetch, not yet acquired
  };

  Entry& find(Block block, const char* function) {
    return const_cast<Entry&>(std::as_const(*this).find(block, function));
  }
  const Entry& find(Block block, const char* function) const {
    const auto it = blocks_.find(block.id);
    if (it == blocks_.end()) invalid(function, "block " + std::to_string(block.id) + " is not a block of this pool");
    return it->second;
  }

  void charge(std::size_t bytes) {
    counters_.in_use_bytes += bytes;
    counters_.peak_bytes = std::max(counters_.peak_bytes, counters_.in_use_bytes);
  }

  /// Makes `need` bytes fit under the budget by evicting unheld blocks, least recently used first.
  /// When they cannot fit, evicts nothing and raises the out-of-memory error (or returns false if
  /// `must` is false).
  bool make_room(std::size_t need, bool must) {
    if (counters_.in_use_bytes + need <= budget_) return true;
    std::vector<Entry*> candidates;
    if (options_.swap && need <= budget_) {
      for (auto& [id, entry] : blocks_)
        if (entry.device != nullptr && entry.holds == 0) candidates.push_back(&entry);
      std::sort(candidates.begin(), candidates.end(),
                [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; });
    }
    std::size_t freed = 0;
    std::size_t victims = 0;
    while (victims < candidates.size() && counters_.in_use_bytes - freed + need > budget_)
      freed += candidates[victims++]->charge;
    if (counters_.in_use_bytes - freed + need > budget_) {
      if (must) out_of_memory(need);
      return false;
    }
    // Every copy out is enqueued before the first wait, so that they run back to back.
    for (std::size_t i = 0; i < victims; ++i)
      if (!candidates[i]->host_valid) copy_out(*candidates[i]);
    for (std::size_t i = 0; i < victims; ++i) {
      Entry& victim = *candidates[i];
      wait_for(victim);
      device_->free(victim.device);
      victim.device = nullptr;
      victim.prefetched = false;
      counters_.in_use_bytes -= victim.charge;
    }
    return true;
  }

  [[noreturn]] void out_of_memory(std::size_t need) const {
    std::size_t pinned = 0;
    for (const auto& [id, entry] : blocks_)
      if (entry.device != nullptr && entry.holds > 0) pinned += entry.charge;
    throw Error(ErrorCode::system, "tutti::offload::Pool (" + device_->name() + "): out of device memory: need " +
                                       std::to_string(need) + ", budget " + std::to_string(budget_) + ", in use " +
                                       std::to_string(counters_.in_use_bytes) + " (" + std::to_string(pinned) +
                                       " pinned)" + (options_.swap ? "" : "; swapping is off"));
  }

  void copy_out(Entry& entry) {
    if (entry.host == nullptr) {
      entry.host = device_->allocate_pinned(entry.bytes);
      counters_.host_bytes += entry.bytes;
    }
    device_->copy(entry.host, entry.device, entry.bytes, stream_);
    mark(entry, Transit::out);
    entry.host_valid = true;
    counters_.swapped_out_bytes += entry.bytes;
    ++counters_.swap_outs;
  }

  /// Brings a swapped-out block back (room is made first; the copy is enqueued, not waited for).
  void copy_in(Entry& entry) {
    make_room(entry.charge, true);
    entry.device = device_->allocate(entry.bytes);
    charge(entry.charge);
    device_->copy(entry.device, entry.host, entry.bytes, stream_);
    mark(entry, Transit::in);
    counters_.swapped_in_bytes += entry.bytes;
    ++counters_.swap_ins;
  }

  void mark(Entry& entry, Transit transit) {
    if (entry.event == device::Event{}) entry.event = device_->create_event();
    device_->record(entry.event, stream_);
    entry.transit = transit;
  }

  /// Returns once the block's latest swap copy is done; the time counts as waited.
  /// Error(timeout) after Options::timeout.
  void wait_for(Entry& entry) {
    if (entry.transit == Transit::none) return;
    if (!device_->query(entry.event)) {
      const auto start = std::chrono::steady_clock::now();
      for (int polls = 0; !device_->query(entry.event); ++polls) {
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited > options_.timeout)
          throw Error(ErrorCode::timeout, "tutti::offload::Pool (" + device_->name() + "): a swap copy of " +
                                              std::to_string(entry.bytes) + " bytes did not finish within " +
                                              std::to_string(options_.timeout.count()) + " ms");
        // The device offers no blocking wait on an event: yield first (copies are short), then sleep.
        if (polls < 64) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
      counters_.waited += std::chrono::steady_clock::now() - start;
    }
    entry.transit = Transit::none;
  }

  void release_memory(Entry& entry) {
    if (entry.device != nullptr) device_->free(entry.device);
    if (entry.host != nullptr) {
      device_->free_pinned(entry.host);
      counters_.host_bytes -= entry.bytes;
    }
    if (entry.event != device::Event{}) device_->destroy_event(entry.event);
    entry = Entry{};
  }

  const std::size_t budget_;
  const Options options_;
  std::unique_ptr<device::Device> device_;
  device::Stream stream_{};
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, Entry> blocks_;
  std::uint64_t next_id_ = 0;
  std::uint64_t tick_ = 0;
  Counters counters_;
};

}  // namespace detail

Pool::Pool(std::size_t budget, Options options) {
  if (budget == 0) throw Error(ErrorCode::invalid_argument, "tutti::offload::Pool: the budget is 0 bytes");
  impl_ = std::make_unique<detail::PoolImpl>(budget, options);
}
Pool::~Pool() = default;

Block Pool::allocate(std::size_t bytes) { return impl_->allocate(bytes); }
void* Pool::acquire(Block block, Access access) { return impl_->acquire(block, access); }
void* Pool::data(Block block) const { return impl_->data(block); }
void Pool::release(Block block) { impl_->release(block); }
bool Pool::prefetch(Block block) { return impl_->prefetch(block); }
bool Pool::swap_out(Block block) { return impl_->swap_out(block); }
void Pool::free(Block block) { impl_->free(block); }
bool Pool::resident(Block block) const { return impl_->resident(block); }
std::size_t Pool::size(Block block) const { return impl_->size(block); }
std::size_t Pool::budget() const { return impl_->budget(); }
bool Pool::swapping() const { return impl_->swapping(); }
bool Pool::host_addressable() const { return impl_->host_addressable(); }
std::string Pool::device_name() const { return impl_->device_name(); }
Counters Pool::counters() const { return impl_->counters(); }

}  // namespace tutti::offload
