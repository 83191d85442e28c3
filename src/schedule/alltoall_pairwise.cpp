// Pairwise-exchange alltoall(v): in step k = 1..p-1 rank r sends its block for (r+k) mod p and
// receives the block from (r-k) mod p; its own block is a local copy. Step k waits for step k-w:
// large blocks keep one exchange per rank in flight (w = 1: no incast at large p, and the cost
// model sees the p-1 rounds this costs), while small blocks go out together, as many steps at
// once as keep at most window_bytes of a rank's blocks in flight (all p-1 of them for blocks of a
// few KiB at small p: one latency instead of p-1, and fewer than Bruck's log p rounds). Works for
// any p. For alltoallv the blocks are packed in rank order (offsets are prefix sums of the
// counts), the window is set by this rank's largest block either way, and a pair whose count is
// zero exchanges nothing: both sides know it, since send_counts[j] on rank i == recv_counts[i] on
// rank j. (The window changes only when steps start, not which message matches which.)
#include <algorithm>
#include <numeric>
#include <string>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {
namespace {

// What a rank may have in flight at once before a step waits for an earlier one.
constexpr std::size_t window_bytes = 32 * 1024;

struct Blocks {
  std::vector<std::size_t> offset, count;  // per peer, in elements
};

Blocks fixed_blocks(int p, std::size_t count) {
  Blocks b{std::vector<std::size_t>(p), std::vector<std::size_t>(p, count)};
  for (int j = 0; j < p; ++j) b.offset[j] = j * count;
  return b;
}

// make() has checked that there is one count per rank.
Blocks packed_blocks(std::span<const std::size_t> counts) {
  Blocks b{std::vector<std::size_t>(counts.size()), {counts.begin(), counts.end()}};
  std::exclusive_scan(counts.begin(), counts.end(), b.offset.begin(), std::size_t{0});
  return b;
}

}  // namespace

Schedule alltoall_pairwise(const Params& params) {
  const int p = params.size, r = params.rank;
  const bool v = params.collective == Collective::alltoallv;
  const Blocks out = v ? packed_blocks(params.counts) : fixed_blocks(p, params.count);
  const Blocks in = v ? packed_blocks(params.recv_counts) : fixed_blocks(p, params.count);
  // The own block is a local copy, so its two counts must agree (other pairs are the caller's
  // cross-rank contract, which the communicator's signature check enforces).
  if (out.count[r] != in.count[r])
    throw Error(ErrorCode::invalid_argument, "alltoallv: rank " + std::to_string(r) + " sends itself " +
                                                 std::to_string(out.count[r]) + " elements but receives " +
                                                 std::to_string(in.count[r]));

  Schedule s;
  if (out.count[r] > 0)
    s.copy({Buffer::output, in.offset[r], in.count[r]}, {Buffer::input, out.offset[r], out.count[r]});
  std::size_t largest = 0;  // elements
  for (int q = 0; q < p; ++q)
    if (q != r) largest = std::max({largest, out.count[q], in.count[q]});
  const std::size_t block_bytes = largest * params.elem_size;
  const int window =
      p <= 1 ? 1
             : static_cast<int>(std::clamp<std::size_t>(block_bytes == 0 ? p - 1 : window_bytes / block_bytes, 1,
                                                        static_cast<std::size_t>(p - 1)));
  // steps[k % window]: the steps of the last step k that had any, which step k + window waits for.
  std::vector<std::vector<std::uint32_t>> steps(static_cast<std::size_t>(window));
  for (int k = 1; k < p; ++k) {
    const int to = (r + k) % p, from = (r - k + p) % p;
    std::vector<std::uint32_t>& slot = steps[static_cast<std::size_t>(k % window)];
    std::vector<std::uint32_t> current;
    if (out.count[to] > 0) current.push_back(s.send(to, {Buffer::input, out.offset[to], out.count[to]}, slot));
    if (in.count[from] > 0) current.push_back(s.recv(from, {Buffer::output, in.offset[from], in.count[from]}, slot));
    if (!current.empty()) slot = std::move(current);
  }
  return s;
}

}  // namespace tutti::schedule
