// libtorch glue: the on-disk format of a checkpoint (docs/training.md, "Checkpoints"), and the
// POSIX file steps that make publishing it atomic. Part of <tutti/torch.hpp>; header-only.
//
// A checkpoint is a directory holding one shard per rank (`shard-R-of-P`, binary) and a
// `MANIFEST` (text) that rank 0 writes last, once every shard is known to be on disk. Every file
// is written under a temporary name, fsynced, renamed and its directory fsynced, so a directory
// without a MANIFEST is a checkpoint that never completed, and a MANIFEST names only shards that
// were complete (it records their sizes and checksums).
//
// Shard: "TUTTICKS", u32 version, u32 rank, u32 world size, u32 entries; per entry u32 name
// length, name, i32 scalar type (c10::ScalarType), u32 dimensions, i64 sizes, u64 bytes, bytes;
// then u64 FNV-1a of everything before it. Host byte order (little-endian machines).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "tutti/torch_broadcast.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch::detail {

inline constexpr std::string_view shard_magic = "TUTTICKS";
inline constexpr std::uint32_t checkpoint_version = 1;
inline constexpr const char* manifest_name = "MANIFEST";

/// One named tensor of a checkpoint (a parameter, a field of its optimizer state, a group's options).
struct CheckpointEntry {
  std::string name;
  ::torch::Tensor tensor;  // contiguous, CPU
};

inline std::string shard_name(int rank, int world) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world);
}

inline std::string hex64(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

[[noreturn]] inline void throw_system(const std::string& what, const std::string& path, int error) {
  throw Error(ErrorCode::system, what + " " + path + ": " + std::strerror(error));
}

inline void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_system("checkpoint: cannot open", path, errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) throw_system("checkpoint: cannot fsync", path, error);
}

/// Writes `bytes` to dir/name atomically: a temporary file, fsync, rename, fsync of dir. A crash
/// at any point leaves dir/name either absent (or as it was) or complete.
/// Throws Error(system) naming the path and the cause (a missing or unwritable dir, a full disk).
inline void write_file_atomically(const std::string& dir, const std::string& name, std::string_view bytes) {
  const std::string path = dir + "/" + name, temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_system("checkpoint: cannot create", temporary, errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw_system("checkpoint: cannot write", temporary, error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw_system("checkpoint: cannot flush", temporary, error);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) throw_system("checkpoint: cannot rename", temporary, errno);
  fsync_path(dir);
}

/// The whole file at `path`. Throws Error(invalid_argument) if it cannot be read.
inline std::string read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw Error(ErrorCode::invalid_argument,
                "checkpoint: cannot read " + path + ": " + std::strerror(errno) + " (an incomplete checkpoint?)");
  std::string bytes;
  char buffer[1 << 16];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw Error(ErrorCode::invalid_argument, "checkpoint: cannot read " + path);
  return bytes;
}

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

/// The shard file's bytes, its checksum trailer included.
inline std::string encode_shard(int rank, int world, const std::vector<CheckpointEntry>& entries) {
  std::string out(shard_magic);
  put<std::uint32_t>(out, checkpoint_version);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(rank));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(world));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(entries.size()));
  for (const auto& e : entries) {
    put<std::uint32_t>(out, static_cast<std::uint32_t>(e.name.size()));
    out += e.name;
    put<std::int32_t>(out, static_cast<std::int32_t>(e.tensor.scalar_type()));
    put<std::uint32_t>(out, static_cast<std::uint32_t>(e.tensor.dim()));
    for (auto d : e.tensor.sizes()) put<std::int64_t>(out, d);
    put<std::uint64_t>(out, e.tensor.nbytes());
    out.append(static_cast<const char*>(e.tensor.data_ptr()), e.tensor.nbytes());
  }
  put<std::uint64_t>(out, fnv1a(out.data(), out.size()));
  return out;
}

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
    if (n > bytes_.size() - at_) fail("ends early");
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  bool done() const { return at_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::invalid_argument, "checkpoint: shard " + path_ + " is damaged: " + why);
  }

 private:
  std::string_view bytes_;
  std::string path_;
  std::size_t at_ = 0;
};

/// The entries of a shard file, verified (checksum, every length) and copied out of `bytes`.
/// Throws Error(invalid_argument) naming `path` for a damaged file, Error(mismatch) when it is
/// not the shard `rank` of `world`.
inline std::vector<CheckpointEntry> decode_shard(std::string_view bytes, const std::string& path, int rank, int world) {
  ShardReader body(bytes, path);
  if (bytes.size() < shard_magic.size() + 8) body.fail("too short");
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (fnv1a(bytes.data(), bytes.size() - 8) != stored) body.fail("checksum mismatch");
  ShardReader in(bytes.substr(0, bytes.size() - 8), path);
  if (std::string_view(in.need(shard_magic.size()), shard_magic.size()) != shard_magic) in.fail("not a shard");
  if (in.take<std::uint32_t>() != checkpoint_version) in.fail("unknown version");
  const auto r = in.take<std::uint32_t>(), p = in.take<std::uint32_t>();
  if (r != static_cast<std::uint32_t>(rank) || p != static_cast<std::uint32_t>(world))
    throw Error(ErrorCode::mismatch, "checkpoint: " + path + " is shard " + std::to_string(r) + " of " +
                                         std::to_string(p) + ", expected " + std::to_string(rank) + " of " +
                                         std::to_string(world));
  std::vector<CheckpointEntry> entries(in.take<std::uint32_t>());
  for (auto& e : entries) {
    const auto length = in.take<std::uint32_t>();
    e.name.assign(in.need(length), length);
    const auto type = in.take<std::int32_t>();
    if (type < 0 || type >= static_cast<std::int32_t>(c10::ScalarType::NumOptions)) in.fail("bad type in " + e.name);
    const auto dims = in.take<std::uint32_t>();
    if (dims > 16) in.fail("too many dimensions in " + e.name);
    std::vector<std::int64_t> sizes(dims);
    std::uint64_t elements = 1;
    for (auto& d : sizes) {
      d = in.take<std::int64_t>();
      if (d < 0 || (d > 0 && elements > (std::uint64_t{1} << 48) / static_cast<std::uint64_t>(d)))
        in.fail("bad size in " + e.name);
      elements *= static_cast<std::uint64_t>(d);
    }
    const auto scalar = static_cast<c10::ScalarType>(type);
    const auto nbytes = in.take<std::uint64_t>();
    if (nbytes != elements * c10::elementSize(scalar)) in.fail("byte count of " + e.name + " does not match its shape");
    e.tensor = ::torch::empty(sizes, ::torch::TensorOptions().dtype(scalar));
    std::memcpy(e.tensor.data_ptr(), in.need(nbytes), nbytes);
  }
  if (!in.done()) in.fail("bytes after the last entry");
  return entries;
}

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

inline std::string encode_manifest(const Manifest& m) {
  std::string text = "tutti-checkpoint " + std::to_string(checkpoint_version) + "\nworld_size " +
                     std::to_string(m.world_size) + "\noptimizer " + m.optimizer + "\n";
  for (const auto& [key, value] : m.metadata) text += "meta " + key + " " + value + "\n";
  for (const auto& [name, shape] : m.params) text += "param " + name + " " + shape + "\n";
  for (std::size_t r = 0; r < m.shards.size(); ++r)
    text += "shard " + std::to_string(r) + " " + std::to_string(m.shards[r].bytes) + " " + hex64(m.shards[r].checksum) +
            "\n";
  return text + "checksum " + hex64(fnv1a(text)) + "\n";
}

/// Parses a MANIFEST; Error(invalid_argument) naming `path` and the line for anything malformed.
inline Manifest decode_manifest(const std::string& text, const std::string& path) {
  auto fail = [&](const std::string& why) -> void {
    throw Error(ErrorCode::invalid_argument, "checkpoint: " + path + " is damaged: " + why);
  };
  const auto last = text.rfind("checksum ", text.size() >= 2 ? text.size() - 2 : 0);
  if (last == std::string::npos || (last > 0 && text[last - 1] != '\n') || text.back() != '\n') fail("no checksum");
  if (text.substr(last + 9, text.size() - last - 10) != hex64(fnv1a(std::string_view(text).substr(0, last))))
    fail("checksum mismatch");
  Manifest m;
  std::size_t at = 0, line_number = 0;
  while (at < last) {
    const auto end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    const auto space = line.find(' ');
    const std::string key = line.substr(0, space), rest = space == std::string::npos ? "" : line.substr(space + 1);
    const auto split = rest.find(' ');
    const std::string first = rest.substr(0, split), second = split == std::string::npos ? "" : rest.substr(split + 1);
    const std::string where = "line " + std::to_string(line_number);
    try {
      if (line_number == 1) {
        if (line != "tutti-checkpoint " + std::to_string(checkpoint_version))
          fail(where + ": not a version 1 MANIFEST");
      } else if (key == "world_size") {
        m.world_size = std::stoi(rest);
      } else if (key == "optimizer") {
        m.optimizer = rest;
      } else if (key == "meta" && !second.empty()) {
        m.metadata[first] = second;
      } else if (key == "param" && !second.empty()) {
        m.params.emplace_back(first, second);
      } else if (key == "shard" && std::stoul(first) == m.shards.size()) {
        const auto gap = second.find(' ');
        if (gap == std::string::npos) fail(where + ": shard without a checksum");
        m.shards.push_back({std::stoull(second.substr(0, gap)), std::stoull(second.substr(gap + 1), nullptr, 16)});
      } else {
        fail(where + ": unexpected '" + line + "'");
      }
    } catch (const std::logic_error&) {  // std::stoi and friends
      fail(where + ": malformed number in '" + line + "'");
    }
  }
  if (m.world_size < 1 || m.shards.size() != static_cast<std::size_t>(m.world_size))
    fail("world_size " + std::to_string(m.world_size) + " with " + std::to_string(m.shards.size()) + " shards");
  return m;
}

}  // namespace tutti::torch::detail
