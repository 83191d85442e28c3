// libtorch glue: the byte layout of a checkpoint's files (docs/training.md, "Checkpoints"), parsed
// without libtorch, so that the fuzz build (which has none) covers every check on these outside
// bytes: tests/fuzz/fuzz_checkpoint.cpp. checkpoint_format.hpp turns the parsed entries
// into tensors. Private to Tutti::torch (checkpoint_bytes.cpp).
//
// Shard: "TUTTICKS", u32 version, u32 rank, u32 world size, u32 entries; per entry u32 name
// length, name, i32 scalar type (c10::ScalarType), u32 dimensions, i64 sizes, u64 bytes, bytes;
// then u64 FNV-1a of everything before it. Host byte order (little-endian machines).
//
// The checksums find accidental damage (a torn or flipped file, a shard of another attempt),
// not forgery: anyone who can write the directory can write a consistent checkpoint
// (docs/security.md, "Checkpoint directory"). What a forged file cannot do is make a reader
// allocate more than the file holds, read out of bounds, or crash: every count and length below
// is checked against the bytes that are left before it is used.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::libtorch::detail {

inline constexpr std::string_view shard_magic = "TUTTICKS";
inline constexpr std::uint32_t checkpoint_version = 1;
inline constexpr const char* manifest_name = "MANIFEST";
inline constexpr std::uint32_t max_checkpoint_dims = 16;
// The least bytes an entry takes: name length, type, dimensions, byte count.
inline constexpr std::size_t min_entry_bytes = 4 + 4 + 4 + 8;

/// The files' checksum: FNV-1a, 64 bits (tutti::detail::fnv1a).
std::uint64_t checkpoint_checksum(const void* data, std::size_t bytes);
std::uint64_t checkpoint_checksum(std::string_view bytes);

std::string shard_name(int rank, int world);

std::string hex64(std::uint64_t v);

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

/// The start of a shard file: magic, version, rank, world size, entry count.
std::string shard_header(int rank, int world, std::size_t entries);

/// Appends one entry: its name, type, shape and `data`.
void put_shard_entry(std::string& out, std::string_view name, std::int32_t type, const std::vector<std::int64_t>& sizes,
                     std::string_view data);

/// Appends the checksum trailer: the shard is complete.
void seal_shard(std::string& out);

/// Reads a shard's bytes with every length checked against what is left, so that a damaged or
/// hostile file can only be refused.
class ShardReader {
 public:
  ShardReader(std::string_view bytes, std::string path) : bytes_(bytes), path_(std::move(path)) {}

  template <class T>
  T take() {
    T value;
    std::memcpy(&value, need(sizeof value), sizeof value);
    return value;
  }
  const char* need(std::size_t n) {
    if (n > left()) fail("ends early");
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  std::size_t left() const { return bytes_.size() - at_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::invalid_argument, "checkpoint: shard " + path_ + " is damaged: " + why);
  }

 private:
  std::string_view bytes_;
  std::string path_;
  std::size_t at_ = 0;
};

/// One entry of a shard as parsed: `data` points into the shard's bytes.
struct ShardEntryView {
  std::string name;
  std::int32_t type = 0;
  std::vector<std::int64_t> sizes;
  std::string_view data;
};

/// Bytes of one element of scalar type `type`, 0 for a type a checkpoint may not hold.
using ElementSize = std::size_t (*)(std::int32_t type);

ShardEntryView parse_shard_entry(ShardReader& in, ElementSize element_size);

/// The entries of a shard file, verified (checksum, every count and length bounded by the bytes
/// left) before anything is allocated for them. Throws Error(invalid_argument) naming `path` for
/// a damaged file, Error(mismatch) when it is not the shard `rank` of `world`.
std::vector<ShardEntryView> parse_shard(std::string_view bytes, const std::string& path, int rank, int world,
                                        ElementSize element_size);

/// What the MANIFEST says (text, one record a line, the last line the checksum of the others).
struct Manifest {
  int world_size = 0;
  std::string optimizer;                                    // the optimizer's type
  std::map<std::string, std::string> metadata;              // user's and the optimizer's step count
  std::vector<std::pair<std::string, std::string>> params;  // name, "type[d0,d1,...]"
  struct Shard {
    std::uint64_t bytes = 0, checksum = 0;
  };
  std::vector<Shard> shards;  // by rank
};

std::string encode_manifest(const Manifest& m);

/// One line of a MANIFEST into `m`; throws std::logic_error (from std::stoi and friends) for a
/// malformed number, returns false for a line it does not know.
bool parse_manifest_line(Manifest& m, const std::string& line);

/// Parses a MANIFEST; Error(invalid_argument) naming `path` and the line for anything malformed.
/// Everything it holds is bounded by the text: a line adds at most one record.
Manifest decode_manifest(const std::string& text, const std::string& path);

}  // namespace tutti::libtorch::detail
