// Canonical form, merging and the wire format of sparse pieces.
#include "sparse/piece.hpp"

#include <sys/mman.h>
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>

#include "reduce/reduce.hpp"

namespace tutti::sparse::detail {

namespace {

#ifdef MADV_POPULATE_WRITE
constexpr int populate_write = MADV_POPULATE_WRITE;
#else
constexpr int populate_write = 23;  // Linux's value, for C libraries older than the kernel
#endif

template <class I>
std::uint64_t load_index(const std::byte* at) {
  I i;
  std::memcpy(&i, at, sizeof(I));
  return i;
}

// Calls fn(std::integral_constant<std::size_t, c_v>) so that value copies have a constant size.
template <class Fn>
decltype(auto) with_value_size(std::size_t cv, Fn&& fn) {
  switch (cv) {
    case 1:
      return fn(std::integral_constant<std::size_t, 1>{});
    case 2:
      return fn(std::integral_constant<std::size_t, 2>{});
    case 4:
      return fn(std::integral_constant<std::size_t, 4>{});
    default:
      return fn(std::integral_constant<std::size_t, 8>{});
  }
}

std::string where(std::string_view operation, int rank) {
  return std::string(operation) + " (rank " + std::to_string(rank) + "): ";
}

}  // namespace

bool Layout::dense_is_smaller(std::size_t nnz) const {
  // In long double so that neither product overflows for any dim the checks let through.
  return static_cast<long double>(nnz) * static_cast<long double>(pair_bytes()) >=
         static_cast<long double>(dim) * static_cast<long double>(value_bytes);
}

bool surely_dense(Form form, const Layout& layout, std::size_t max_nnz) {
  return form == Form::dense || (form == Form::automatic && layout.dense_is_smaller(max_nnz));
}

Layout layout_of(std::size_t dim, IndexType index_type, DataType value_type) {
  Layout l;
  l.dim = dim;
  l.index_type = index_type;
  l.value_type = value_type;
  l.index_bytes = index_type == IndexType::u32 ? 4 : 8;
  l.value_bytes = size_of(value_type);
  return l;
}

bool check_input(const Vector& input, std::string_view operation, int rank) {
  const auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, where(operation, rank) + what);
  };
  if (input.index_type != IndexType::u32 && input.index_type != IndexType::u64) fail("invalid index type");
  const int type = static_cast<int>(input.value_type);
  if (type < static_cast<int>(DataType::i8) || type > static_cast<int>(DataType::f64)) fail("invalid value type");
  if (input.nnz > 0 && input.indices == nullptr) fail("indices is null with nnz > 0");
  if (input.nnz > 0 && input.values == nullptr) fail("values is null with nnz > 0");
  const std::size_t pair = (input.index_type == IndexType::u32 ? 4 : 8) + size_of(input.value_type);
  if (input.dim > std::numeric_limits<std::size_t>::max() / pair ||
      input.nnz > std::numeric_limits<std::size_t>::max() / pair)
    fail("dim " + std::to_string(input.dim) + " or nnz " + std::to_string(input.nnz) + " too large for size_t bytes");
  if (input.index_type == IndexType::u32 && input.dim > (std::uint64_t{1} << 32))
    fail("dim " + std::to_string(input.dim) + " exceeds what u32 indices address");
  // One pass: every index below dim, and whether they strictly increase (is_canonical).
  const auto* raw = static_cast<const std::byte*>(input.indices);
  const auto scan = [&](auto width) {
    using I = decltype(width);
    bool increasing = true;
    std::uint64_t last = 0;
    for (std::size_t k = 0; k < input.nnz; ++k) {
      const std::uint64_t i = load_index<I>(raw + k * sizeof(I));
      if (i >= input.dim)
        fail("indices[" + std::to_string(k) + "] = " + std::to_string(i) + " is not below dim " +
             std::to_string(input.dim));
      increasing &= k == 0 || last < i;
      last = i;
    }
    return increasing;
  };
  return input.index_type == IndexType::u32 ? scan(std::uint32_t{}) : scan(std::uint64_t{});
}

namespace {

// The input's indices as 64-bit values.
std::vector<std::uint64_t> widened_indices(const Vector& input) {
  std::vector<std::uint64_t> out(input.nnz);
  const auto* raw = static_cast<const std::byte*>(input.indices);
  if (input.index_type == IndexType::u32)
    for (std::size_t k = 0; k < input.nnz; ++k) out[k] = load_index<std::uint32_t>(raw + 4 * k);
  else if (input.nnz > 0)
    std::memcpy(out.data(), raw, input.nnz * 8);
  return out;
}

}  // namespace

Piece copy_canonical(const Vector& input, const Layout& layout) {
  Piece out;
  out.indices = widened_indices(input);
  const auto* values = static_cast<const std::byte*>(input.values);
  if (input.nnz > 0) out.values.assign(values, values + input.nnz * layout.value_bytes);
  return out;
}

Piece canonical(const Vector& input, ReduceOp op, const Layout& layout) {
  // The common case (top-k output, embeddings' rows): one copy.
  if (is_canonical(input)) return copy_canonical(input, layout);
  const std::size_t cv = layout.value_bytes;
  const auto* values = static_cast<const std::byte*>(input.values);
  const std::vector<std::uint64_t> indices = widened_indices(input);
  // Stable, so that duplicates combine in input order (the same bits on every run).
  std::vector<std::size_t> order(input.nnz);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return indices[a] < indices[b]; });
  Piece out;
  out.indices.reserve(input.nnz);
  out.values.resize(input.nnz * cv);
  for (std::size_t k = 0; k < input.nnz; ++k) {
    const std::uint64_t i = indices[order[k]];
    const std::byte* v = values + order[k] * cv;
    if (!out.indices.empty() && out.indices.back() == i) {
      std::byte* acc = out.values.data() + (out.indices.size() - 1) * cv;
      reduce::apply(op, layout.value_type, acc, acc, v, 1);
      continue;
    }
    std::memcpy(out.values.data() + out.indices.size() * cv, v, cv);
    out.indices.push_back(i);
  }
  out.values.resize(out.indices.size() * cv);
  return out;
}

bool is_canonical(const Vector& input) {
  const auto* raw = static_cast<const std::byte*>(input.indices);
  const auto increasing = [&](auto width) {
    using I = decltype(width);
    for (std::size_t k = 1; k < input.nnz; ++k)
      if (load_index<I>(raw + (k - 1) * sizeof(I)) >= load_index<I>(raw + k * sizeof(I))) return false;
    return true;
  };
  return input.index_type == IndexType::u32 ? increasing(std::uint32_t{}) : increasing(std::uint64_t{});
}

void scatter_canonical(const Vector& input, std::uint64_t lo, std::uint64_t hi, const Layout& layout,
                       std::byte* dense) {
  const auto* raw = static_cast<const std::byte*>(input.indices);
  const auto* values = static_cast<const std::byte*>(input.values);
  with_value_size(layout.value_bytes, [&](auto cv) {
    const auto scatter = [&](auto width) {
      using I = decltype(width);
      // The input's indices strictly increase: the pairs in [lo, hi) are one run of them.
      const auto position = [&](std::uint64_t bound) {
        std::size_t first = 0, count = input.nnz;
        while (count > 0) {
          const std::size_t half = count / 2;
          if (load_index<I>(raw + (first + half) * sizeof(I)) < bound)
            first += half + 1, count -= half + 1;
          else
            count = half;
        }
        return first;
      };
      const std::size_t first = lo == 0 ? 0 : position(lo), last = hi >= layout.dim ? input.nnz : position(hi);
      for (std::size_t k = first; k < last; ++k)
        std::memcpy(dense + (load_index<I>(raw + k * sizeof(I)) - lo) * cv, values + k * cv, cv);
    };
    input.index_type == IndexType::u32 ? scatter(std::uint32_t{}) : scatter(std::uint64_t{});
  });
}

void mark_indices(const Vector& input, std::uint64_t* bits) {
  const auto* raw = static_cast<const std::byte*>(input.indices);
  const auto mark = [&](auto width) {
    using I = decltype(width);
    for (std::size_t k = 0; k < input.nnz; ++k) {
      const std::uint64_t i = load_index<I>(raw + k * sizeof(I));
      bits[i / 64] |= std::uint64_t{1} << (i % 64);
    }
  };
  input.index_type == IndexType::u32 ? mark(std::uint32_t{}) : mark(std::uint64_t{});
}

Piece pick(const std::byte* dense, const std::uint64_t* bits, std::size_t count, const Layout& layout) {
  Piece out;
  out.indices.resize(count);
  out.values.resize(count * layout.value_bytes);
  const std::size_t words = (layout.dim + 63) / 64;
  with_value_size(layout.value_bytes, [&](auto cv) {
    std::size_t k = 0;
    for (std::size_t w = 0; w < words; ++w)
      for (std::uint64_t word = bits[w]; word != 0 && k < count; word &= word - 1, ++k) {
        const std::uint64_t i = w * 64 + static_cast<std::uint64_t>(std::countr_zero(word));
        out.indices[k] = i;
        std::memcpy(out.values.data() + k * cv, dense + i * cv, cv);
      }
  });
  return out;
}

std::vector<std::byte> zeroed_bytes(std::size_t bytes) {
  std::vector<std::byte> out;
  out.reserve(bytes);
  // A large allocation is fresh pages, each faulted in by the first write: asking the kernel for
  // all of them in one call halves the cost of zeroing 64 MiB (about 29 ms against 15 here).
  // Kernels before 5.14 refuse the advice (EINVAL), and the pages then fault as before.
  if (bytes >= (std::size_t{1} << 20)) {
    const std::size_t page = 4096;
    const auto begin = (reinterpret_cast<std::uintptr_t>(out.data()) + page - 1) & ~(page - 1);
    const auto end = (reinterpret_cast<std::uintptr_t>(out.data()) + bytes) & ~(page - 1);
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, populate_write);
  }
  out.assign(bytes, std::byte{0});
  return out;
}

Piece densify_canonical(const Vector& input, const Layout& layout, std::vector<std::byte> zeroed) {
  Piece out;
  out.dense = true;
  const std::size_t bytes = layout.dim * layout.value_bytes;
  out.values = zeroed.size() == bytes ? std::move(zeroed) : zeroed_bytes(bytes);
  scatter_canonical(input, 0, layout.dim, layout, out.values.data());
  return out;
}

Vector as_vector(const Piece& piece, const Layout& layout) {
  return Vector{layout.dim, piece.nnz(), piece.indices.data(), IndexType::u64, piece.values.data(), layout.value_type};
}

Piece densify(Piece piece, const Layout& layout, std::vector<std::byte> zeroed) {
  if (piece.dense) return piece;
  return densify_canonical(as_vector(piece, layout), layout, std::move(zeroed));
}

namespace {

// An unsigned integer of `Bytes` bytes: values move as bits, never as numbers.
template <std::size_t Bytes>
using Bits = std::conditional_t<
    Bytes == 1, std::uint8_t,
    std::conditional_t<Bytes == 2, std::uint16_t, std::conditional_t<Bytes == 4, std::uint32_t, std::uint64_t>>>;

template <class U>
U load_bits(const std::byte* values, std::size_t k) {
  U u;
  std::memcpy(&u, values + k * sizeof(U), sizeof(U));
  return u;
}

// Both sides' values laid out along the union of their indices (zero where a side lacks the
// index), then one call of the kernel over the whole union. The loop over both sides has no
// branch on the data (selects only): which side holds the next index is a coin toss that a
// branch predictor would lose half the time.
template <std::size_t CV>
Piece merge_sparse(const Piece& a, const Piece& b, ReduceOp op, DataType type) {
  using U = Bits<CV>;
  const std::size_t na = a.nnz(), nb = b.nnz();
  Piece out;
  out.indices.resize(na + nb);
  auto left = std::make_unique_for_overwrite<U[]>(na + nb), right = std::make_unique_for_overwrite<U[]>(na + nb);
  const std::uint64_t *ai = a.indices.data(), *bi = b.indices.data();
  std::uint64_t* oi = out.indices.data();
  std::size_t i = 0, j = 0, n = 0;
  for (; i < na && j < nb; ++n) {
    const std::uint64_t x = ai[i], y = bi[j];
    const bool take_a = x <= y, take_b = y <= x;
    left[n] = take_a ? load_bits<U>(a.values.data(), i) : U{0};
    right[n] = take_b ? load_bits<U>(b.values.data(), j) : U{0};
    oi[n] = take_a ? x : y;
    i += take_a;
    j += take_b;
  }
  for (; i < na; ++i, ++n) oi[n] = ai[i], left[n] = load_bits<U>(a.values.data(), i), right[n] = 0;
  for (; j < nb; ++j, ++n) oi[n] = bi[j], left[n] = 0, right[n] = load_bits<U>(b.values.data(), j);
  out.indices.resize(n);
  out.values.resize(n * CV);
  reduce::apply(op, type, out.values.data(), left.get(), right.get(), n);
  return out;
}

}  // namespace

Piece merge(Piece a, const Piece& b, ReduceOp op, const Layout& layout) {
  if (!a.dense && !b.dense)
    return with_value_size(layout.value_bytes, [&](auto cv) { return merge_sparse<cv>(a, b, op, layout.value_type); });
  Piece out = densify(std::move(a), layout);
  if (b.dense) {
    reduce::apply(op, layout.value_type, out.values.data(), out.values.data(), b.values.data(), layout.dim);
  } else {
    const Piece right = densify(b, layout);  // every index, so that absent ones combine with 0
    reduce::apply(op, layout.value_type, out.values.data(), out.values.data(), right.values.data(), layout.dim);
  }
  return out;
}

Piece merge_tree(std::vector<Piece> pieces, ReduceOp op, const Layout& layout, std::size_t dense_from) {
  if (pieces.empty()) return {};
  while (pieces.size() > 1) {
    std::vector<Piece> next;
    next.reserve((pieces.size() + 1) / 2);
    for (std::size_t k = 0; k + 1 < pieces.size(); k += 2) {
      Piece merged = merge(std::move(pieces[k]), pieces[k + 1], op, layout);
      if (!merged.dense && merged.nnz() >= dense_from) merged = densify(std::move(merged), layout);
      next.push_back(std::move(merged));
    }
    if (pieces.size() % 2 == 1) next.push_back(std::move(pieces.back()));
    pieces = std::move(next);
  }
  return std::move(pieces.front());
}

std::pair<std::size_t, std::size_t> range_of(const Piece& piece, std::uint64_t lo, std::uint64_t hi) {
  const auto first = std::lower_bound(piece.indices.begin(), piece.indices.end(), lo);
  const auto last = std::lower_bound(first, piece.indices.end(), hi);
  return {static_cast<std::size_t>(first - piece.indices.begin()),
          static_cast<std::size_t>(last - piece.indices.begin())};
}

void append_indices(const Piece& piece, std::size_t first, std::size_t last, const Layout& layout,
                    std::vector<std::byte>& out) {
  const std::size_t at = out.size();
  out.resize(at + (last - first) * layout.index_bytes);
  std::byte* p = out.data() + at;
  if (layout.index_type == IndexType::u64) {
    if (last > first) std::memcpy(p, piece.indices.data() + first, (last - first) * 8);
    return;
  }
  for (std::size_t k = first; k < last; ++k, p += 4) {
    const auto i = static_cast<std::uint32_t>(piece.indices[k]);
    std::memcpy(p, &i, 4);
  }
}

void pack(const Piece& piece, std::size_t first, std::size_t last, const Layout& layout, std::vector<std::byte>& out) {
  out.reserve(out.size() + (last - first) * layout.pair_bytes());  // one allocation for indices and values
  append_indices(piece, first, last, layout, out);
  const std::size_t bytes = (last - first) * layout.value_bytes;
  if (bytes == 0) return;
  const std::size_t at = out.size();
  out.resize(at + bytes);
  std::memcpy(out.data() + at, piece.values.data() + first * layout.value_bytes, bytes);
}

namespace {

template <class I>
void read_indices(const std::byte* p, std::size_t n, std::uint64_t lo, std::uint64_t hi, std::uint64_t* out,
                  std::string_view what) {
  std::uint64_t previous = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t i = load_index<I>(p + k * sizeof(I));
    if (i < lo || i >= hi || (k > 0 && i <= previous))
      throw Error(ErrorCode::invalid_argument, std::string(what) + ": index " + std::to_string(i) + " at pair " +
                                                   std::to_string(k) + " is out of order or outside [" +
                                                   std::to_string(lo) + ", " + std::to_string(hi) + ")");
    out[k] = previous = i;
  }
}

}  // namespace

void unpack_into(std::span<const std::byte> bytes, std::uint64_t lo, std::uint64_t hi, const Layout& layout,
                 std::string_view what, Piece& out) {
  if (bytes.size() % layout.pair_bytes() != 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": " + std::to_string(bytes.size()) + " bytes are not a whole number of pairs");
  const std::size_t n = bytes.size() / layout.pair_bytes(), at = out.indices.size();
  out.indices.resize(at + n);
  try {
    if (layout.index_type == IndexType::u32)
      read_indices<std::uint32_t>(bytes.data(), n, lo, hi, out.indices.data() + at, what);
    else
      read_indices<std::uint64_t>(bytes.data(), n, lo, hi, out.indices.data() + at, what);
  } catch (...) {
    out.indices.resize(at);  // `out` as it was
    throw;
  }
  out.values.insert(out.values.end(), bytes.data() + n * layout.index_bytes, bytes.data() + bytes.size());
}

Piece unpack(std::span<const std::byte> bytes, std::uint64_t lo, std::uint64_t hi, const Layout& layout,
             std::string_view what) {
  Piece out;
  unpack_into(bytes, lo, hi, layout, what, out);
  return out;
}

std::uint64_t range_begin(std::size_t dim, int r, int p) {
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(dim) * static_cast<unsigned>(r) /
                                    static_cast<unsigned>(p));
}

}  // namespace tutti::sparse::detail
