// Inputs are small integers chosen per op so that every reduction over up to 127 ranks is exact
// in every type (bf16 holds integers up to 256 exactly): the expected result is computed in
// double, converted to the type and compared bit for bit.
#include "bench/cases.hpp"

#include <algorithm>
#include <cstring>

namespace tutti::bench {

namespace {

// Element j of rank q's input.
double value(const Case& c, int q, std::size_t j, int p) {
  if (!reduces(c.kind)) return static_cast<double>((static_cast<std::size_t>(q) * 7 + j) % 61 + 1);
  switch (c.op) {
    case ReduceOp::prod:
      return j % static_cast<std::size_t>(p) == static_cast<std::size_t>(q) ? 2 : 1;
    case ReduceOp::min:
    case ReduceOp::max:
      return static_cast<double>((static_cast<std::size_t>(q) + j) % static_cast<std::size_t>(p) + 1);
    case ReduceOp::avg: {  // offsets that cancel, so that the average is exact
      const double base = static_cast<double>(j % 5 + 2);
      if (p % 2 == 1 && q == p - 1) return base;
      return base + (q % 2 == 0 ? 1 : -1);
    }
    case ReduceOp::sum:
      break;
  }
  return static_cast<double>(q + 1) + static_cast<double>(j % 3);
}

double reduced(const Case& c, std::size_t j, int p) {
  double acc = value(c, 0, j, p);
  for (int q = 1; q < p; ++q) {
    const double v = value(c, q, j, p);
    switch (c.op) {
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      default:
        acc += v;
        break;
    }
  }
  return c.op == ReduceOp::avg ? acc / p : acc;
}

template <class T>
void store_as(void* at, double v) {
  T x;
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>)
    x = T(static_cast<float>(v));
  else
    x = static_cast<T>(v);
  std::memcpy(at, &x, sizeof(T));
}

}  // namespace

void store(DataType type, void* at, double v) {
  switch (type) {
    case DataType::i8:
      return store_as<std::int8_t>(at, v);
    case DataType::u8:
      return store_as<std::uint8_t>(at, v);
    case DataType::i32:
      return store_as<std::int32_t>(at, v);
    case DataType::u32:
      return store_as<std::uint32_t>(at, v);
    case DataType::i64:
      return store_as<std::int64_t>(at, v);
    case DataType::u64:
      return store_as<std::uint64_t>(at, v);
    case DataType::f16:
      return store_as<f16>(at, v);
    case DataType::bf16:
      return store_as<bf16>(at, v);
    case DataType::f32:
      return store_as<float>(at, v);
    case DataType::f64:
      return store_as<double>(at, v);
  }
}

bool has_form(Kind kind, bool in_place) {
  if (kind == Collective::broadcast) return in_place;
  if (kind == sendrecv || kind == Collective::barrier || kind == Collective::gather || kind == Collective::scatter ||
      kind == Collective::allgatherv || kind == Collective::alltoallv)
    return !in_place;
  return true;
}

std::size_t uneven_count(std::size_t n, int k, int p) {
  return 2 * n * static_cast<std::size_t>(k + 1) / static_cast<std::size_t>(p + 1);
}

Case make_case(Kind kind, DataType type, ReduceOp op, int root, std::size_t bytes, int ranks) {
  Case c{kind, type, op, root, 0, false};
  if (kind == Collective::barrier) return c;  // no data: one row whatever the sizes
  const std::size_t divisor = size_of(type) * (size_is_total(kind) ? static_cast<std::size_t>(ranks) : 1);
  c.count = bytes / divisor;
  return c;
}

std::size_t case_elements(const Case& c, int ranks) {
  if (c.kind == Collective::allgatherv || c.kind == Collective::alltoallv) {  // the blocks received, summed
    std::size_t total = 0;
    for (int q = 0; q < ranks; ++q) total += uneven_count(c.count, q, ranks);
    return total;
  }
  return c.count * (size_is_total(c.kind) ? static_cast<std::size_t>(ranks) : 1);
}

std::size_t case_bytes(const Case& c, int ranks) { return case_elements(c, ranks) * size_of(c.type); }

Buffers::Buffers(const Case& c, int rank, int ranks, const Communicator* shared)
    : case_(c), rank_(rank), ranks_(ranks), elem_(size_of(c.type)) {
  const std::size_t p = static_cast<std::size_t>(ranks);
  switch (c.kind.value_or(Collective::allreduce)) {  // sendrecv: one buffer each way, like allreduce
    case Collective::reduce_scatter:
      send_elems_ = p * c.count, recv_elems_ = c.count;
      break;
    case Collective::allgather:
      send_elems_ = c.count, recv_elems_ = p * c.count;
      break;
    case Collective::alltoall:
      send_elems_ = recv_elems_ = p * c.count;
      break;
    case Collective::gather:
      send_elems_ = c.count, recv_elems_ = p * c.count;
      break;
    case Collective::scatter:
      send_elems_ = p * c.count, recv_elems_ = c.count;
      break;
    case Collective::allgatherv:
      for (int q = 0; q < ranks; ++q) recv_counts_.push_back(uneven_count(c.count, q, ranks));
      send_counts_ = {recv_counts_[static_cast<std::size_t>(rank)]};
      send_elems_ = send_counts_[0], recv_elems_ = case_elements(c, ranks);
      break;
    case Collective::alltoallv:
      send_elems_ = recv_elems_ = 0;
      for (int q = 0; q < ranks; ++q) {
        send_counts_.push_back(uneven_count(c.count, (rank + q) % ranks, ranks));
        recv_counts_.push_back(send_counts_.back());  // (q + rank) mod p: what q sends this rank
        send_elems_ += send_counts_.back(), recv_elems_ += recv_counts_.back();
      }
      break;
    case Collective::barrier:
      send_elems_ = recv_elems_ = 0;
      break;
    default:
      send_elems_ = recv_elems_ = c.count;
      break;
  }
  if (c.in_place && c.kind == Collective::reduce_scatter) recv_elems_ = send_elems_;  // the result is block `rank`
  const std::size_t send_bytes = std::max<std::size_t>(1, send_elems_ * elem_);
  const std::size_t recv_bytes = std::max<std::size_t>(1, recv_elems_ * elem_);
  if (shared != nullptr) {
    if (!c.in_place) shared_send_ = shared->allocate(send_bytes), send_ = shared_send_.data();
    shared_recv_ = shared->allocate(recv_bytes), recv_ = shared_recv_.data();
  } else {
    if (!c.in_place) owned_send_ = std::make_unique_for_overwrite<std::byte[]>(send_bytes), send_ = owned_send_.get();
    owned_recv_ = std::make_unique_for_overwrite<std::byte[]>(recv_bytes), recv_ = owned_recv_.get();
  }
  prepare();  // also faults every page in before anything is timed
}

std::byte* Buffers::input() {
  if (!case_.in_place) return send_;
  if (case_.kind == Collective::allgather) return recv_ + static_cast<std::size_t>(rank_) * case_.count * elem_;
  return recv_;
}

const void* Buffers::send() const { return const_cast<Buffers*>(this)->input(); }

void* Buffers::recv() {
  if (case_.in_place && case_.kind == Collective::reduce_scatter)
    return recv_ + static_cast<std::size_t>(rank_) * case_.count * elem_;
  return recv_;
}

void Buffers::prepare() {
  std::memset(recv_, 0xa5, std::max<std::size_t>(1, recv_elems_ * elem_));  // poison
  if (case_.kind == Collective::broadcast && rank_ != case_.root) return;
  std::byte* in = input();
  for (std::size_t j = 0; j < send_elems_; ++j) store(case_.type, in + j * elem_, value(case_, rank_, j, ranks_));
}

void Buffers::corrupt() {
  if (recv_elems_ > 0) *static_cast<std::byte*>(recv()) ^= std::byte{1};
}

std::size_t Buffers::count_wrong() const {
  const Case& c = case_;
  const std::size_t n = c.count, r = static_cast<std::size_t>(rank_);
  if ((c.kind == Collective::reduce || c.kind == Collective::gather) && rank_ != c.root) return 0;
  auto* out = const_cast<Buffers*>(this)->recv();
  const std::size_t elements = c.in_place && c.kind == Collective::reduce_scatter ? n : recv_elems_;
  // The v-forms' blocks are packed in rank order: block q starts at the sum of the counts before it.
  std::vector<std::size_t> starts;
  for (std::size_t q = 0, at = 0; q < recv_counts_.size(); at += recv_counts_[q++]) starts.push_back(at);
  std::size_t wrong = 0;
  std::byte expected[8];
  for (std::size_t i = 0; i < elements; ++i) {
    std::size_t block = i / std::max<std::size_t>(n, 1), within = i % std::max<std::size_t>(n, 1);
    if (!starts.empty()) {
      block = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin()) - 1;
      within = i - starts[block];
    }
    double v = 0;
    if (c.kind == sendrecv) v = value(c, (rank_ + ranks_ - 1) % ranks_, i, ranks_);
    switch (c.kind.value_or(Collective::barrier)) {
      case Collective::allreduce:
      case Collective::reduce:
        v = reduced(c, i, ranks_);
        break;
      case Collective::reduce_scatter:
        v = reduced(c, r * n + i, ranks_);
        break;
      case Collective::allgather:
      case Collective::allgatherv:
      case Collective::gather:
        v = value(c, static_cast<int>(block), within, ranks_);
        break;
      case Collective::alltoall:
        v = value(c, static_cast<int>(block), r * n + within, ranks_);
        break;
      case Collective::alltoallv: {  // rank `block` sent it from its block r, after its blocks 0..r-1
        std::size_t from = 0;
        for (std::size_t t = 0; t < r; ++t) from += uneven_count(n, static_cast<int>(block + t) % ranks_, ranks_);
        v = value(c, static_cast<int>(block), from + within, ranks_);
        break;
      }
      case Collective::scatter:
        v = value(c, c.root, r * n + i, ranks_);
        break;
      case Collective::broadcast:
        v = value(c, c.root, i, ranks_);
        break;
      default:  // sendrecv, above
        break;
    }
    store(c.type, expected, v);
    if (std::memcmp(expected, static_cast<const std::byte*>(out) + i * elem_, elem_) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace tutti::bench
