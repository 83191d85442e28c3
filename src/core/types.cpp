#include "tutti/types.hpp"

#include <iterator>
#include <optional>

namespace tutti {

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::i8:
    case DataType::u8:
      return 1;
    case DataType::f16:
    case DataType::bf16:
      return 2;
    case DataType::i32:
    case DataType::u32:
    case DataType::f32:
      return 4;
    case DataType::i64:
    case DataType::u64:
    case DataType::f64:
      return 8;
  }
  throw Error(ErrorCode::invalid_argument, "invalid DataType value " + std::to_string(static_cast<int>(type)));
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "invalid";
}

namespace {

// The one name table of each vocabulary enum, in enumerator order.
constexpr std::string_view algorithm_names[] = {
    "automatic", "ring",   "recursive_doubling", "rabenseifner", "binomial_tree", "bruck", "pairwise",
    "linear",    "direct", "hierarchical",       "mpi"};
static_assert(std::size(algorithm_names) == static_cast<std::size_t>(Algorithm::mpi) + 1);
constexpr std::string_view backend_names[] = {"automatic", "host_transfer", "ipc", "nccl"};
static_assert(std::size(backend_names) == static_cast<std::size_t>(gpu::Backend::nccl) + 1);
constexpr std::string_view collective_names[] = {"allreduce",  "reduce",    "reduce_scatter", "allgather",
                                                 "allgatherv", "broadcast", "alltoall",       "alltoallv",
                                                 "gather",     "scatter",   "barrier"};
static_assert(std::size(collective_names) == static_cast<std::size_t>(Collective::barrier) + 1);
constexpr std::string_view data_type_names[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"};
static_assert(std::size(data_type_names) == static_cast<std::size_t>(DataType::f64) + 1);

template <typename Enum, std::size_t N>
std::string_view name_in(const std::string_view (&names)[N], Enum value) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : "invalid";
}

template <typename Enum, std::size_t N>
std::optional<Enum> value_in(const std::string_view (&names)[N], std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  return std::nullopt;
}

}  // namespace

std::string_view to_string(Algorithm algorithm) { return name_in(algorithm_names, algorithm); }
std::string_view to_string(Collective collective) { return name_in(collective_names, collective); }
std::string_view to_string(DataType type) { return name_in(data_type_names, type); }
std::string_view gpu::to_string(Backend backend) { return name_in(backend_names, backend); }
std::optional<gpu::Backend> gpu::backend_from_name(std::string_view name) {
  return value_in<Backend>(backend_names, name);
}

std::optional<Algorithm> algorithm_from_name(std::string_view name) {
  return value_in<Algorithm>(algorithm_names, name);
}
std::optional<Collective> collective_from_name(std::string_view name) {
  return value_in<Collective>(collective_names, name);
}
std::optional<DataType> data_type_from_name(std::string_view name) { return value_in<DataType>(data_type_names, name); }

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::mismatch:
      return "mismatch";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::peer_failure:
      return "peer_failure";
    case ErrorCode::aborted:
      return "aborted";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::system:
      return "system";
  }
  return "invalid";
}

}  // namespace tutti
