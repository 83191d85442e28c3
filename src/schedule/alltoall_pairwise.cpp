// Pairwise-exchange alltoall(v): in step k = 1..p-1 rank r sends its block for (r+k) mod p and
// receives the block from (r-k) mod p; its own block is a local copy. Step k waits for step k-1,
// which keeps one exchange per rank in flight (no incast at large p) and lets the cost model see
// the p-1 rounds this costs. Works for any p. For alltoallv the blocks are packed in rank order
// (offsets are prefix sums of the counts), and a pair whose count is zero exchanges nothing:
// both sides know it, since send_counts[j] on rank i == recv_counts[i] on rank j.
#include <numeric>
#include <string>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {
namespace {

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
  std::vector<std::uint32_t> previous;
  for (int k = 1; k < p; ++k) {
    const int to = (r + k) % p, from = (r - k + p) % p;
    std::vector<std::uint32_t> current;
    if (out.count[to] > 0) current.push_back(s.send(to, {Buffer::input, out.offset[to], out.count[to]}, previous));
    if (in.count[from] > 0)
      current.push_back(s.recv(from, {Buffer::output, in.offset[from], in.count[from]}, previous));
    if (!current.empty()) previous = std::move(current);
  }
  return s;
}

}  // namespace tutti::schedule
