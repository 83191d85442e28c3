// The emulated device's memory: device, pinned and shared allocations, registered and adopted
// ranges, and the checks that a range is device memory (EmulatedDevice, emulated.hpp).
#include "device/emulated.hpp"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include <unistd.h>

#include "core/shared_memory.hpp"
#include "device/emulated_errors.hpp"

namespace tutti::device {

using detail::address;
using detail::invalid;

namespace {

constexpr std::size_t alignment = 256;  // as cudaMalloc

}  // namespace

// ---- memory ----

void* EmulatedDevice::allocate_as(std::size_t bytes, Memory memory, const char* function) {
  if (bytes == 0) invalid(function, "0 bytes requested");
  if (bytes > SIZE_MAX - alignment)
    throw Error(ErrorCode::system, std::string("tutti::device::") + function + ": out of memory");
  void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p == nullptr)
    throw Error(ErrorCode::system, std::string("tutti::device::") + function + " (emulated): out of memory (" +
                                       std::to_string(bytes) + " bytes)");
  if (memory == Memory::pinned) std::memset(p, 0, bytes);
  if (context_ && memory == Memory::device) {
    try {
      raise_if_faulted(function);
    } catch (...) {
      std::free(p);
      throw;
    }
    make_pool_stream();
  }
  std::lock_guard lock(mutex_);
  allocations_.emplace(address(p), Allocation{bytes, memory});
  return p;
}

void EmulatedDevice::free_as(void* pointer, Memory memory, const char* function) {
  if (pointer == nullptr) return;
  Allocation allocation{};
  {
    std::lock_guard lock(mutex_);
    const auto it = allocations_.find(address(pointer));
    if (it == allocations_.end() || it->second.memory != memory)
      invalid(function, "the pointer is not one this device's " +
                            std::string(memory == Memory::device ? "allocate" : "allocate_pinned") + " returned");
    allocation = it->second;
  }
  // As the CUDA device: IPC-shared memory is cudaMalloc'd and cudaFree'd (a wait for every
  // stream); the rest goes back to the stream-ordered pool on the pool stream, which carries no
  // work a held queue could block (its synchronize returns at once).
  if (context_ && memory == Memory::device && allocation.mapping != nullptr)
    context_->wait_for_device(std::string(function) + ": cudaFree (memory from allocate_shared)");
  {
    std::lock_guard lock(mutex_);
    allocations_.erase(address(pointer));
  }
  if (context_)
    quarantine(address(pointer), allocation, function);
  else
    release(address(pointer), allocation);
}

namespace {

struct SharedName {  // what an emulated IpcHandle holds
  std::int64_t pid;
  std::uint64_t bytes;  // as allocated
  core::SharedLocation where;
};
static_assert(sizeof(SharedName) <= sizeof(IpcHandle::bytes));

}  // namespace

void* EmulatedDevice::allocate_shared(std::size_t bytes, IpcHandle& handle) {
  if (bytes == 0) invalid("allocate_shared", "0 bytes requested");
  std::shared_ptr<tutti::core::SharedRegion> region;
  try {
    region = tutti::core::SharedRegion::create(bytes);
  } catch (const Error& e) {
    throw Error(e.code(), std::string("tutti::device::allocate_shared (emulated): ") + e.what());
  }
  SharedName name{getpid(), bytes, core::location_of(*region)};
  handle = {};
  std::memcpy(handle.bytes, &name, sizeof(name));
  void* p = region->base();
  std::lock_guard lock(mutex_);
  allocations_.emplace(address(p), Allocation{bytes, Memory::device, std::move(region)});
  return p;
}

void* EmulatedDevice::open_shared(const IpcHandle& handle, std::size_t bytes) {
  SharedName name{};
  std::memcpy(&name, handle.bytes, sizeof(name));
  if (bytes == 0 || bytes > name.bytes || name.bytes > name.where.region_bytes)
    invalid("open_shared", std::to_string(bytes) + " bytes of a shared allocation of " + std::to_string(name.bytes));
  std::shared_ptr<core::PeerRegion> region;
  try {
    region = core::open_peer_region(static_cast<int>(name.pid), name.where, core::PeerAccess::read_write);
  } catch (const Error& e) {
    throw Error(e.code(), std::string("tutti::device::open_shared (emulated): ") + e.what());
  }
  void* p = region->base();
  std::lock_guard lock(mutex_);
  allocations_.emplace(address(p), Allocation{bytes, Memory::opened, std::move(region), name.pid != getpid()});
  return p;
}

void EmulatedDevice::close_shared(void* pointer) {
  if (pointer == nullptr) return;
  Allocation allocation{};
  {
    std::lock_guard lock(mutex_);
    const auto it = allocations_.find(address(pointer));
    if (it == allocations_.end() || it->second.memory != Memory::opened)
      invalid("close_shared", "the pointer is not one open_shared returned");
    allocation = it->second;
  }
  // CUDA answers this process's own handle with the owner's pointer, and closes nothing then.
  if (context_ && allocation.peer) context_->wait_for_device("close_shared: cudaIpcCloseMemHandle");
  {
    std::lock_guard lock(mutex_);
    allocations_.erase(address(pointer));
  }
  if (context_)
    quarantine(address(pointer), allocation, "close_shared");
  else
    release(address(pointer), allocation);
}

void EmulatedDevice::register_pinned(void* pointer, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  registered_[address(pointer)] = bytes;
}

void EmulatedDevice::unregister_pinned(void* pointer) {
  if (context_) context_->wait_for_device("unregister_pinned: cudaHostUnregister");
  std::lock_guard lock(mutex_);
  registered_.erase(address(pointer));
}

bool EmulatedDevice::pageable(const void* p) const {
  auto inside = [a = address(p)](const auto& ranges, auto bytes_of) {
    auto it = ranges.upper_bound(a);
    if (it == ranges.begin()) return false;
    --it;
    return a < it->first + bytes_of(it->second);
  };
  std::lock_guard lock(mutex_);
  return !inside(allocations_, [](const Allocation& allocation) { return allocation.bytes; }) &&
         !inside(registered_, [](std::size_t bytes) { return bytes; });
}

void* EmulatedDevice::allocate(std::size_t bytes) { return allocate_as(bytes, Memory::device, "allocate"); }
void EmulatedDevice::free(void* pointer) { free_as(pointer, Memory::device, "free"); }
void* EmulatedDevice::allocate_pinned(std::size_t bytes) {
  return allocate_as(bytes, Memory::pinned, "allocate_pinned");
}
void EmulatedDevice::free_pinned(void* pointer) { free_as(pointer, Memory::pinned, "free_pinned"); }

void EmulatedDevice::adopt(void* pointer, std::size_t bytes) {
  if (pointer == nullptr || bytes == 0) invalid("adopt", "a null pointer or 0 bytes");
  std::lock_guard lock(mutex_);
  auto next = allocations_.lower_bound(address(pointer));
  const bool overlaps_next = next != allocations_.end() && next->first < address(pointer) + bytes;
  const bool overlaps_previous = next != allocations_.begin() && [&] {
    const auto previous = std::prev(next);
    return previous->first + previous->second.bytes > address(pointer);
  }();
  if (overlaps_next || overlaps_previous) invalid("adopt", "the range overlaps memory this device knows");
  allocations_.emplace(address(pointer), Allocation{bytes, Memory::adopted});
}

void EmulatedDevice::forget(void* pointer) {
  std::lock_guard lock(mutex_);
  const auto it = allocations_.find(address(pointer));
  if (it == allocations_.end() || it->second.memory != Memory::adopted)
    invalid("forget", "the pointer is not one adopt was given");
  allocations_.erase(it);
}

bool EmulatedDevice::is_device_pointer(const void* pointer) const {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address(pointer));
  if (it == allocations_.begin()) return false;
  --it;
  return it->second.memory != Memory::pinned && address(pointer) < it->first + it->second.bytes;
}

void EmulatedDevice::check_device_range(const void* p, std::size_t bytes, const char* what,
                                        const char* function) const {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address(p));
  if (it != allocations_.begin()) {
    --it;
    const std::size_t offset = address(p) - it->first;
    if (it->second.memory != Memory::pinned && offset < it->second.bytes && bytes <= it->second.bytes - offset) return;
  }
  invalid(function, std::string(what) + " is not device memory (or the " + std::to_string(bytes) +
                        " bytes from it run past its allocation)");
}

}  // namespace tutti::device
