#include "core/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tutti::core {

namespace {

// The live regions of this process by base address, for locate_shared.
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, SharedRegion*> regions;
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: regions may outlive static destruction
  return *instance;
}

std::atomic<std::uint64_t> next_id{1};

Error system_error(const std::string& what, int error) {
  return Error(ErrorCode::system, what + ": " + std::strerror(error));
}

}  // namespace

std::shared_ptr<SharedRegion> SharedRegion::create(std::size_t bytes) {
  if (bytes == 0) throw Error(ErrorCode::invalid_argument, "allocate: 0 bytes");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > (std::size_t{1} << 46))
    throw Error(ErrorCode::invalid_argument, "allocate: " + std::to_string(bytes) + " bytes is more than 64 TiB");
  const std::size_t mapped = (bytes + page - 1) / page * page;
  std::shared_ptr<SharedRegion> region(new SharedRegion);
  region->bytes_ = bytes;
  region->fd_ = ::memfd_create("tutti-buffer", MFD_CLOEXEC);
  if (region->fd_ < 0) throw system_error("allocate: memfd_create", errno);
  if (::ftruncate(region->fd_, static_cast<off_t>(mapped)) != 0)
    throw system_error("allocate: sizing " + std::to_string(mapped) + " bytes of shared memory", errno);
  struct stat st {};
  if (::fstat(region->fd_, &st) != 0) throw system_error("allocate: fstat", errno);
  // Faulted in now, not by the first collective that uses it.
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, region->fd_, 0);
  if (base == MAP_FAILED) throw system_error("allocate: mapping " + std::to_string(mapped) + " bytes", errno);
  region->base_ = static_cast<std::byte*>(base);
  region->mapped_ = mapped;
  region->inode_ = static_cast<std::uint64_t>(st.st_ino);
  region->id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(registry().mutex);
  registry().regions[reinterpret_cast<std::uintptr_t>(base)] = region.get();
  return region;
}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr) {
    {
      std::lock_guard lock(registry().mutex);
      registry().regions.erase(reinterpret_cast<std::uintptr_t>(base_));
    }
    ::munmap(base_, mapped_);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace tutti::core

namespace tutti::core {

SharedLocation location_of(const core::SharedRegion& region, std::size_t offset) {
  SharedLocation where;
  where.id = region.id();
  where.inode = region.inode();
  where.offset = offset;
  where.region_bytes = region.mapped();
  where.fd = region.fd();
  return where;
}

std::optional<SharedLocation> locate_shared(const void* address, std::size_t bytes) {
  if (bytes == 0 || address == nullptr) return std::nullopt;
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.regions.upper_bound(begin);
  if (it == reg.regions.begin()) return std::nullopt;
  --it;
  const core::SharedRegion& region = *it->second;
  const std::uintptr_t offset = begin - it->first;
  if (offset >= region.mapped() || bytes > region.mapped() - offset) return std::nullopt;
  return location_of(region, offset);
}

PeerRegion::~PeerRegion() { ::munmap(base_, bytes_); }

namespace {

struct PeerCache {
  std::mutex mutex;
  // Most recently used first.
  std::list<std::pair<std::pair<int, std::uint64_t>, std::shared_ptr<const PeerRegion>>> entries;
};

PeerCache& peer_cache() {
  static PeerCache* instance = new PeerCache;
  return *instance;
}

}  // namespace

std::shared_ptr<PeerRegion> open_peer_region(int pid, const SharedLocation& where, PeerAccess access) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(where.fd);
  const std::string what = "mapping process " + std::to_string(pid) + "'s shared buffer (" + path + ")";
  const bool write = access == PeerAccess::read_write;
  const int fd = ::open(path.c_str(), (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw system_error(what, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw system_error(what, error);
  }
  if (static_cast<std::uint64_t>(st.st_ino) != where.inode || st.st_size < 0 ||
      static_cast<std::uint64_t>(st.st_size) < where.region_bytes) {
    ::close(fd);
    throw Error(ErrorCode::system, what + ": it is not the buffer the peer described (inode " +
                                       std::to_string(st.st_ino) + ", " + std::to_string(st.st_size) +
                                       " bytes; expected inode " + std::to_string(where.inode) + ", " +
                                       std::to_string(where.region_bytes) + " bytes)");
  }
  void* base =
      ::mmap(nullptr, where.region_bytes, write ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (base == MAP_FAILED) throw system_error(what, error);
  return std::make_shared<PeerRegion>(static_cast<std::byte*>(base), where.region_bytes);
}

std::shared_ptr<const PeerRegion> map_peer_region(int pid, const SharedLocation& where) {
  auto& cache = peer_cache();
  const std::pair<int, std::uint64_t> key{pid, where.id};
  {
    std::lock_guard lock(cache.mutex);
    for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it) {
      if (it->first != key) continue;
      if (it->second->bytes() < where.region_bytes) break;  // a stale entry: map again
      cache.entries.splice(cache.entries.begin(), cache.entries, it);
      return it->second;
    }
  }
  // Outside the lock: it may take milliseconds.
  std::shared_ptr<const PeerRegion> region = open_peer_region(pid, where, PeerAccess::read);
  std::lock_guard lock(cache.mutex);
  std::erase_if(cache.entries, [&](const auto& entry) { return entry.first == key; });
  cache.entries.emplace_front(key, region);
  while (cache.entries.size() > peer_regions_kept) cache.entries.pop_back();
  return region;
}

std::size_t peer_regions_mapped() {
  std::lock_guard lock(peer_cache().mutex);
  return peer_cache().entries.size();
}

void forget_peer_regions() {
  decltype(peer_cache().entries) dropped;
  std::lock_guard lock(peer_cache().mutex);
  dropped.swap(peer_cache().entries);
}

}  // namespace tutti::core
