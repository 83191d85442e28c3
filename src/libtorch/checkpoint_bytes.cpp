// The checkpoint_bytes.hpp functions.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "libtorch/checkpoint_bytes.hpp"
#include "tutti/types.hpp"

namespace tutti::libtorch::detail {

std::uint64_t checkpoint_checksum(const void* data, std::size_t bytes) { return tutti::detail::fnv1a(data, bytes); }

std::uint64_t checkpoint_checksum(std::string_view bytes) { return checkpoint_checksum(bytes.data(), bytes.size()); }

std::string shard_name(int rank, int world) { return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world); }

std::string hex64(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

std::string shard_header(int rank, int world, std::size_t entries) {
  std::string out(shard_magic);
  put<std::uint32_t>(out, checkpoint_version);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(rank));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(world));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(entries));
  return out;
}

void put_shard_entry(std::string& out, std::string_view name, std::int32_t type, const std::vector<std::int64_t>& sizes,
                     std::string_view data) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(name.size()));
  out += name;
  put<std::int32_t>(out, type);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(sizes.size()));
  for (auto d : sizes) put<std::int64_t>(out, d);
  put<std::uint64_t>(out, data.size());
  out += data;
}

void seal_shard(std::string& out) { put<std::uint64_t>(out, checkpoint_checksum(out)); }

ShardEntryView parse_shard_entry(ShardReader& in, ElementSize element_size) {
  ShardEntryView e;
  const auto length = in.take<std::uint32_t>();
  e.name.assign(in.need(length), length);
  e.type = in.take<std::int32_t>();
  const std::size_t element = element_size(e.type);
  if (element == 0) in.fail("bad type in " + e.name);
  const auto dims = in.take<std::uint32_t>();
  if (dims > max_checkpoint_dims) in.fail("too many dimensions in " + e.name);
  if (dims > in.left() / 8) in.fail("ends early");  // before the vector is made
  e.sizes.resize(dims);
  std::uint64_t elements = 1;
  for (auto& d : e.sizes) {
    d = in.take<std::int64_t>();
    if (d < 0 || (d > 0 && elements > (std::uint64_t{1} << 48) / static_cast<std::uint64_t>(d)))
      in.fail("bad size in " + e.name);
    elements *= static_cast<std::uint64_t>(d);
  }
  const auto nbytes = in.take<std::uint64_t>();
  if (nbytes != elements * element) in.fail("byte count of " + e.name + " does not match its shape");
  if (nbytes > in.left()) in.fail("ends early: " + e.name + " needs " + std::to_string(nbytes) + " bytes");
  e.data = std::string_view(in.need(nbytes), nbytes);
  return e;
}

std::vector<ShardEntryView> parse_shard(std::string_view bytes, const std::string& path, int rank, int world,
                                        ElementSize element_size) {
  ShardReader whole(bytes, path);
  if (bytes.size() < shard_magic.size() + 8) whole.fail("too short");
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (checkpoint_checksum(bytes.data(), bytes.size() - 8) != stored) whole.fail("checksum mismatch");
  ShardReader in(bytes.substr(0, bytes.size() - 8), path);
  if (std::string_view(in.need(shard_magic.size()), shard_magic.size()) != shard_magic) in.fail("not a shard");
  if (in.take<std::uint32_t>() != checkpoint_version) in.fail("unknown version");
  const auto r = in.take<std::uint32_t>(), p = in.take<std::uint32_t>();
  if (r != static_cast<std::uint32_t>(rank) || p != static_cast<std::uint32_t>(world))
    throw Error(ErrorCode::mismatch, "checkpoint: " + path + " is shard " + std::to_string(r) + " of " +
                                         std::to_string(p) + ", expected " + std::to_string(rank) + " of " +
                                         std::to_string(world));
  const auto count = in.take<std::uint32_t>();
  if (count > in.left() / min_entry_bytes)
    in.fail(std::to_string(count) + " entries cannot fit in its " + std::to_string(bytes.size()) + " bytes");
  std::vector<ShardEntryView> entries;
  entries.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) entries.push_back(parse_shard_entry(in, element_size));
  if (in.left() != 0) in.fail("bytes after the last entry");
  return entries;
}

std::string encode_manifest(const Manifest& m) {
  std::string text = "tutti-checkpoint " + std::to_string(checkpoint_version) + "\nworld_size " +
                     std::to_string(m.world_size) + "\noptimizer " + m.optimizer + "\n";
  for (const auto& [key, value] : m.metadata) text += "meta " + key + " " + value + "\n";
  for (const auto& [name, shape] : m.params) text += "param " + name + " " + shape + "\n";
  for (std::size_t r = 0; r < m.shards.size(); ++r)
    text += "shard " + std::to_string(r) + " " + std::to_string(m.shards[r].bytes) + " " + hex64(m.shards[r].checksum) +
            "\n";
  return text + "checksum " + hex64(checkpoint_checksum(text)) + "\n";
}

bool parse_manifest_line(Manifest& m, const std::string& line) {
  const auto space = line.find(' ');
  const std::string key = line.substr(0, space), rest = space == std::string::npos ? "" : line.substr(space + 1);
  const auto split = rest.find(' ');
  const std::string first = rest.substr(0, split), second = split == std::string::npos ? "" : rest.substr(split + 1);
  if (key == "world_size") {
    m.world_size = std::stoi(rest);
  } else if (key == "optimizer") {
    m.optimizer = rest;
  } else if (key == "meta" && !second.empty()) {
    m.metadata[first] = second;
  } else if (key == "param" && !second.empty()) {
    m.params.emplace_back(first, second);
  } else if (key == "shard" && std::stoul(first) == m.shards.size()) {
    const auto gap = second.find(' ');
    if (gap == std::string::npos) return false;
    m.shards.push_back({std::stoull(second.substr(0, gap)), std::stoull(second.substr(gap + 1), nullptr, 16)});
  } else {
    return false;
  }
  return true;
}

Manifest decode_manifest(const std::string& text, const std::string& path) {
  auto fail = [&](const std::string& why) -> void {
    throw Error(ErrorCode::invalid_argument, "checkpoint: " + path + " is damaged: " + why);
  };
  if (text.empty()) fail("empty");
  const auto last = text.rfind("checksum ", text.size() >= 2 ? text.size() - 2 : 0);
  if (last == std::string::npos || (last > 0 && text[last - 1] != '\n') || text.back() != '\n') fail("no checksum");
  if (text.substr(last + 9, text.size() - last - 10) !=
      hex64(checkpoint_checksum(std::string_view(text).substr(0, last))))
    fail("checksum mismatch");
  Manifest m;
  std::size_t at = 0, line_number = 0;
  while (at < last) {
    const auto end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const std::string where = "line " + std::to_string(++line_number);
    if (line_number == 1) {
      if (line != "tutti-checkpoint " + std::to_string(checkpoint_version)) fail(where + ": not a version 1 MANIFEST");
      continue;
    }
    try {
      if (!parse_manifest_line(m, line)) fail(where + ": unexpected '" + line + "'");
    } catch (const std::logic_error&) {  // std::stoi and friends
      fail(where + ": malformed number in '" + line + "'");
    }
  }
  if (m.world_size < 1 || m.shards.size() != static_cast<std::size_t>(m.world_size))
    fail("world_size " + std::to_string(m.world_size) + " with " + std::to_string(m.shards.size()) + " shards");
  return m;
}

}  // namespace tutti::libtorch::detail
