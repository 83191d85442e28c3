// Memory from Tutti that the other processes of a host can map (tutti::SharedBuffer, made by
// Communicator::allocate): each buffer is a memfd mapped here, found by address
// (locate_shared), and mapped read-only by a peer through /proc/<pid>/fd/<fd> (map_peer_region),
// which is what lets the shared-memory transport read its peers' buffers in place (zero copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "tutti/types.hpp"

namespace tutti::core {

/// One buffer: a memfd of `bytes` (whole pages) mapped read-write, zero-filled and faulted in.
/// Known to locate_shared for as long as it lives.
class SharedRegion {
 public:
  /// Error(system) if the memory cannot be had; Error(invalid_argument) for 0 bytes or an absurd size.
  static std::shared_ptr<SharedRegion> create(std::size_t bytes);
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  std::byte* base() const { return base_; }
  std::size_t bytes() const { return bytes_; }  // as asked for
  std::size_t mapped() const { return mapped_; }
  int fd() const { return fd_; }
  std::uint64_t id() const { return id_; }
  std::uint64_t inode() const { return inode_; }

 private:
  SharedRegion() = default;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0, mapped_ = 0;
  int fd_ = -1;
  std::uint64_t id_ = 0, inode_ = 0;
};

}  // namespace tutti::core

namespace tutti::core {

/// Where a range of this process's memory lies in a SharedRegion: what a peer needs to map it.
/// Plain data, copied through shared memory as it is.
struct SharedLocation {
  std::uint64_t id = 0;  // the region's, unique in its process; 0: not in shared memory
  std::uint64_t inode = 0;
  std::uint64_t offset = 0;  // of the range's first byte in the region
  std::uint64_t region_bytes = 0;
  std::int32_t fd = -1;
  std::int32_t unused = 0;
};

/// Where the byte at `offset` of `region` lies (offset < region.mapped()).
SharedLocation location_of(const core::SharedRegion& region, std::size_t offset = 0);

/// The region that holds all of [address, address + bytes) (bytes > 0), if one does.
std::optional<SharedLocation> locate_shared(const void* address, std::size_t bytes);

/// A peer's region mapped into this process (read-only unless opened for writing), unmapped when
/// the last reference goes.
class PeerRegion {
 public:
  PeerRegion(std::byte* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  PeerRegion(const PeerRegion&) = delete;
  PeerRegion& operator=(const PeerRegion&) = delete;
  ~PeerRegion();
  const std::byte* base() const { return base_; }
  std::byte* base() { return base_; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::byte* base_;
  std::size_t bytes_;
};

enum class PeerAccess { read, read_write };

/// Process `pid`'s region at `where` (its first `where.region_bytes` bytes), mapped here anew and
/// owned by the caller: read-write for memory both processes write (the emulated device's IPC
/// memory). Error(system) naming what failed if the region cannot be opened or is not the one
/// described (another inode, or smaller than the location says).
std::shared_ptr<PeerRegion> open_peer_region(int pid, const SharedLocation& where, PeerAccess access);

/// Process `pid`'s region at `where`, mapped here read-only (and kept: the most recently used
/// `peer_regions_kept` stay mapped, so that a buffer used call after call is mapped once). Errors
/// as open_peer_region's.
std::shared_ptr<const PeerRegion> map_peer_region(int pid, const SharedLocation& where);

inline constexpr std::size_t peer_regions_kept = 16;

/// How many peers' regions this process keeps mapped, and dropping them all (a region in use by a
/// collective stays mapped until it ends): for tests and for a program that wants the memory of
/// buffers its peers freed back at once.
std::size_t peer_regions_mapped();
void forget_peer_regions();

}  // namespace tutti::core
