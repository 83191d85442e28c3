// Bruck's alltoall, for small messages: ceil(log2 p) rounds instead of p-1, at the price of
// sending each block up to log2 p times. Any p, fixed count per rank only.
//   1. rotate: tmp block i = input block (r+i) mod p, the block bound for rank r+i;
//   2. round k (distance d = 2^k < p): send every tmp block whose index has bit k set to r+d,
//      receive the same-indexed blocks from r-d into their place (packed through scratch, since
//      those blocks are not contiguous);
//   3. afterwards tmp block i came from rank r-i, so output block j = tmp block (r-j) mod p.
// Scratch: tmp (p blocks), then one send pack and one receive pack reused by every round.
#include <algorithm>
#include <utility>
#include <vector>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {
namespace {

// Tmp blocks with bit `distance` set come in runs [first, first + distance); returns the runs
// as (first block, number of blocks), clipped to p.
std::vector<std::pair<std::size_t, std::size_t>> runs_with_bit(std::size_t distance, std::size_t p) {
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t first = distance; first < p; first += 2 * distance)
    runs.emplace_back(first, std::min(distance, p - first));
  return runs;
}

std::size_t largest_round(std::size_t p) {
  std::size_t blocks = 0;
  for (std::size_t d = 1; d < p; d <<= 1) {
    std::size_t n = 0;
    for (auto [first, len] : runs_with_bit(d, p)) n += len;
    blocks = std::max(blocks, n);
  }
  return blocks;
}

}  // namespace

Schedule alltoall_bruck(const Params& params) {
  Schedule s;
  const auto p = static_cast<std::size_t>(params.size), r = static_cast<std::size_t>(params.rank);
  const std::size_t c = params.count;
  if (c == 0) return s;
  auto blocks = [c](Buffer buffer, std::size_t first, std::size_t n) { return Region{buffer, first * c, n * c}; };
  if (p == 1) {
    s.copy(blocks(Buffer::output, 0, 1), blocks(Buffer::input, 0, 1));
    return s;
  }
  const std::size_t send_pack = p * c, recv_pack = send_pack + largest_round(p) * c;
  s.scratch_count = recv_pack + largest_round(p) * c;

  std::vector<std::uint32_t> tmp_written = {s.copy(blocks(Buffer::scratch, 0, p - r), blocks(Buffer::input, r, p - r))};
  if (r > 0) tmp_written.push_back(s.copy(blocks(Buffer::scratch, p - r, r), blocks(Buffer::input, 0, r)));
  std::vector<std::uint32_t> sent, unpacked;  // the previous round's, guarding reuse of the packs
  for (std::size_t d = 1; d < p; d <<= 1) {
    const auto runs = runs_with_bit(d, p);
    std::vector<std::uint32_t> pack_deps = tmp_written, packed;
    pack_deps.insert(pack_deps.end(), sent.begin(), sent.end());
    std::size_t n = 0;
    for (auto [first, len] : runs) {
      packed.push_back(
          s.copy({Buffer::scratch, send_pack + n * c, len * c}, blocks(Buffer::scratch, first, len), pack_deps));
      n += len;
    }
    sent = {s.send(static_cast<int>((r + d) % p), {Buffer::scratch, send_pack, n * c}, packed)};
    std::vector<std::uint32_t> unpack_deps = packed;
    unpack_deps.push_back(s.recv(static_cast<int>((r + p - d) % p), {Buffer::scratch, recv_pack, n * c}, unpacked));
    unpacked.clear();
    n = 0;
    for (auto [first, len] : runs) {
      unpacked.push_back(
          s.copy(blocks(Buffer::scratch, first, len), {Buffer::scratch, recv_pack + n * c, len * c}, unpack_deps));
      n += len;
    }
    tmp_written = unpacked;
  }
  for (std::size_t j = 0; j < p; ++j)
    s.copy(blocks(Buffer::output, j, 1), blocks(Buffer::scratch, (r + p - j) % p, 1), tmp_written);
  return s;
}

}  // namespace tutti::schedule
