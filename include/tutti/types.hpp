// Tutti's value types: data types, reduction ops, algorithms, options and errors.
// Included by <tutti/tutti.hpp>; users include that one.
#pragma once

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace tutti {

/// Element types a collective moves and reduces.
enum class DataType { i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64 };

/// Element-wise reductions. `avg` is the sum divided by the number of ranks
/// (for integers, truncated toward zero).
enum class ReduceOp { sum, prod, min, max, avg };

/// Collective algorithms. Not every algorithm applies to every collective;
/// forcing one that does not apply raises `Error` with `ErrorCode::unsupported`.
enum class Algorithm {
  automatic,
  ring,
  recursive_doubling,
  rabenseifner,
  binomial_tree,
  bruck,
  pairwise,
  linear,
  direct,        // shared-memory algorithms (multi-process runtime)
  hierarchical,  // intra-host + inter-host (multi-process runtime)
  mpi,           // MPI's own collective (multi-process runtime)
};

namespace gpu {

/// Which device a tutti::gpu::Communicator (and an offload pool) uses: the emulated device (host
/// memory, a worker per stream; docs/gpu.md) or CUDA. The one device-kind enum: the device layer's
/// device::Kind is this type.
enum class DeviceKind { emulated, cuda };

/// Which backend of tutti::gpu::Communicator runs a collective (<tutti/gpu.hpp>, docs/gpu.md,
/// "Backends"). Declared here, beside Algorithm, because tuning files name backends too.
enum class Backend {
  automatic,      ///< chosen per call (the contract at the top of <tutti/gpu.hpp>)
  host_transfer,  ///< a host collective between copies to and from pinned staging; any host transport
  ipc,            ///< device to device through mapped staging; ranks on one host
  nccl,           ///< NCCL; CUDA devices, one GPU per rank
};

/// "automatic", "host_transfer", "ipc" or "nccl" (the names tuning files and --backend use);
/// "invalid" for a value out of range.
std::string_view to_string(Backend backend);
/// The backend `to_string` spells `name`, if any.
std::optional<Backend> backend_from_name(std::string_view name);

}  // namespace gpu

/// The collectives. One name each, as `to_string` spells it (TUTTI_ALGO, tuning files, errors).
enum class Collective {
  allreduce,
  reduce,
  reduce_scatter,
  allgather,
  allgatherv,
  broadcast,
  alltoall,
  alltoallv,
  gather,
  scatter,
  barrier,
};

/// Per-call options.
struct Options {
  Algorithm algorithm = Algorithm::automatic;
  /// Deadline of the operation; 0 = the communicator's default (`TUTTI_TIMEOUT_MS`, 300 s).
  std::chrono::milliseconds timeout{0};
};

enum class ErrorCode { invalid_argument, mismatch, timeout, peer_failure, aborted, unsupported, system };

/// Every failure Tutti reports is an `Error`; `what()` names the argument, the
/// rank(s) and the operation involved.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

/// Size in bytes of one element of `type`.
std::size_t size_of(DataType type);

std::string_view to_string(DataType type);
std::string_view to_string(ReduceOp op);
std::string_view to_string(Algorithm algorithm);
std::string_view to_string(Collective collective);
std::string_view to_string(ErrorCode code);

/// The value `to_string` spells `name` ("ring", "allreduce", "bf16", ...), if any: what command
/// lines, TUTTI_ALGO and tuning files are read with.
std::optional<Algorithm> algorithm_from_name(std::string_view name);
std::optional<Collective> collective_from_name(std::string_view name);
std::optional<DataType> data_type_from_name(std::string_view name);

/// IEEE 754 half precision, storage only (arithmetic happens in float).
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
  explicit f16(float value);
  explicit operator float() const;
  friend bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

/// bfloat16 (the top half of an IEEE float), storage only.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float value);
  explicit operator float() const;
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

namespace detail {

// float -> bf16, rounding to nearest even (NaN stays NaN).
constexpr std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu) != 0) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// float -> IEEE half, rounding to nearest even, with subnormals, infinities and NaN.
constexpr std::uint16_t float_to_f16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {                                                    // half subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);           // below half the smallest subnormal
    const std::uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

constexpr float f16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// FNV-1a, 64 bits, over `bytes` bytes, continued from `hash`: the one hash of the ranks'
/// agreement checks (signatures, host names, counts) and of the checkpoint files' checksum. Not
/// cryptographic (the frame tags are HMAC-SHA256).
inline constexpr std::uint64_t fnv1a_offset = 14695981039346656037ull;
inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = fnv1a_offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}
inline std::uint64_t fnv1a(std::string_view text, std::uint64_t hash = fnv1a_offset) {
  return fnv1a(text.data(), text.size(), hash);
}

}  // namespace detail

inline f16::f16(float value) : bits(detail::float_to_f16_bits(value)) {}
inline f16::operator float() const { return detail::f16_bits_to_float(bits); }
inline bf16::bf16(float value) : bits(detail::float_to_bf16_bits(value)) {}
inline bf16::operator float() const { return detail::bf16_bits_to_float(bits); }

/// The `DataType` of a C++ element type, e.g. `data_type_of<float>() == DataType::f32`.
template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, std::int8_t>)
    return DataType::i8;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return DataType::u8;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DataType::i32;
  else if constexpr (std::is_same_v<U, std::uint32_t>)
    return DataType::u32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return DataType::i64;
  else if constexpr (std::is_same_v<U, std::uint64_t>)
    return DataType::u64;
  else if constexpr (std::is_same_v<U, f16>)
    return DataType::f16;
  else if constexpr (std::is_same_v<U, bf16>)
    return DataType::bf16;
  else if constexpr (std::is_same_v<U, float>)
    return DataType::f32;
  else if constexpr (std::is_same_v<U, double>)
    return DataType::f64;
  else
    static_assert(sizeof(U) == 0, "tutti: no DataType for this C++ type");
}

}  // namespace tutti
