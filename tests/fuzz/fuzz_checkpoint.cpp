// A checkpoint's files (src/libtorch/checkpoint_bytes.hpp, the byte-level half of the libtorch
// checkpoints: the fuzz build has no libtorch): a shard and a MANIFEST, read from a directory
// anyone with write access to it may have forged. Input: one byte of mode, then the file.
//   mode & 1: 0 a shard, 1 a MANIFEST;
//   mode & 2: the checksum is appended (a shard's u64 trailer, a MANIFEST's "checksum" line),
//             so that the fuzzer reaches the parsing behind it;
//   mode & 4: a shard is parsed as the rank and world size its header names (else as 0 of 1).
// Parsing either gives a result or throws Error(invalid_argument) (or mismatch, for a shard of
// another rank); nothing else may escape, nothing may be allocated beyond what the file holds
// (libFuzzer's malloc limit catches that). A shard that parses encodes back to the same bytes; a
// MANIFEST that parses encodes to a text that parses to the same MANIFEST.
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"
#include "libtorch/checkpoint_bytes.hpp"

namespace ck = tutti::libtorch::detail;
using tutti::fuzz::require;

namespace {

// c10::ScalarType's element sizes for the plain numeric types a checkpoint may hold (Byte, Char,
// Short, Int, Long, Half, Float, Double; ComplexHalf refused; ComplexFloat, ComplexDouble, Bool,
// BFloat16), 0 for the rest, as src/libtorch/checkpoint_format.hpp's checkpoint_element_size.
std::size_t element_size(std::int32_t type) {
  static constexpr std::size_t sizes[] = {1, 1, 2, 4, 8, 2, 4, 8, 0, 8, 16, 1, 0, 0, 0, 2};
  return type >= 0 && type < static_cast<std::int32_t>(std::size(sizes)) ? sizes[type] : 0;
}

void fuzz_shard(std::string bytes, bool seal, bool own_rank) {
  if (seal) ck::seal_shard(bytes);
  int rank = 0, world = 1;
  if (own_rank && bytes.size() >= 20) {
    std::uint32_t r, p;
    std::memcpy(&r, bytes.data() + 12, 4);
    std::memcpy(&p, bytes.data() + 16, 4);
    rank = static_cast<int>(r);
    world = static_cast<int>(p);
  }
  std::vector<ck::ShardEntryView> entries;
  try {
    entries = ck::parse_shard(bytes, "fuzz-shard", rank, world, element_size);
  } catch (const tutti::Error& error) {
    require(error.code() == tutti::ErrorCode::invalid_argument || error.code() == tutti::ErrorCode::mismatch,
            "a bad shard gave another error code");
    return;
  }
  require(entries.size() <= bytes.size() / ck::min_entry_bytes, "more entries than the bytes can hold");
  std::string again = ck::shard_header(rank, world, entries.size());
  for (const auto& e : entries) {
    std::uint64_t elements = 1;
    for (auto d : e.sizes) elements *= static_cast<std::uint64_t>(d);
    require(e.data.size() == elements * element_size(e.type), "an entry's bytes do not match its shape");
    require(e.data.data() >= bytes.data() && e.data.data() + e.data.size() <= bytes.data() + bytes.size(),
            "an entry's bytes lie outside the shard");
    ck::put_shard_entry(again, e.name, e.type, e.sizes, e.data);
  }
  ck::seal_shard(again);
  require(again == bytes, "a shard that parsed does not encode back to its bytes");
}

void fuzz_manifest(std::string text, bool seal) {
  if (seal) text += "checksum " + ck::hex64(ck::checkpoint_checksum(text)) + "\n";
  ck::Manifest m;
  try {
    m = ck::decode_manifest(text, "fuzz-MANIFEST");
  } catch (const tutti::Error& error) {
    require(error.code() == tutti::ErrorCode::invalid_argument, "a bad MANIFEST gave another error code");
    return;
  }
  require(m.world_size >= 1 && m.shards.size() == static_cast<std::size_t>(m.world_size),
          "a MANIFEST without one shard per rank was accepted");
  ck::Manifest again;
  try {
    again = ck::decode_manifest(ck::encode_manifest(m), "written-MANIFEST");
  } catch (const tutti::Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    require(false, "a MANIFEST that parsed does not parse once written back");
  }
  require(again.world_size == m.world_size && again.optimizer == m.optimizer && again.metadata == m.metadata &&
              again.params == m.params && again.shards.size() == m.shards.size(),
          "a written MANIFEST parses to another one");
  for (std::size_t r = 0; r < m.shards.size(); ++r)
    require(again.shards[r].bytes == m.shards[r].bytes && again.shards[r].checksum == m.shards[r].checksum,
            "a written MANIFEST's shard record differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode & 1)
    fuzz_manifest(std::move(file), (mode & 2) != 0);
  else
    fuzz_shard(std::move(file), (mode & 2) != 0, (mode & 4) != 0);
  return 0;
}
