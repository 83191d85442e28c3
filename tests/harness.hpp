// Test harness: ranks are threads over the in-process transport. Every failure of any rank is
// collected and reported with its rank; every call carries a deadline, so a broken algorithm
// fails the test instead of hanging it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "threads.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {

inline constexpr std::chrono::milliseconds test_timeout{60000};

/// Runs fn(comm) on p threads, one per rank of local_group(p); returns "" or the failures.
inline std::string run_ranks(int p, const std::function<void(Communicator&)>& fn) {
  auto comms = local_group(p);
  return on_threads(p, [&](int r) { fn(comms[static_cast<std::size_t>(r)]); });
}

/// The value rank `rank` contributes at element `i`: small integers, so that sums, products,
/// minima and maxima are exact in every DataType (non-negative for unsigned types; {1,2} or
/// {-1,1,2} for products, so that 8 ranks stay exact in f16/bf16).
inline double input_value(DataType type, ReduceOp op, int rank, std::size_t i) {
  const bool is_unsigned = type == DataType::u8 || type == DataType::u32 || type == DataType::u64;
  const std::size_t h = (i * 2654435761u + static_cast<std::size_t>(rank) * 40503u + 7) % 1000003;
  if (op == ReduceOp::prod) {
    if (is_unsigned) return static_cast<double>(1 + h % 2);
    static constexpr double choices[] = {-1, 1, 2};
    return choices[h % 3];
  }
  return is_unsigned ? static_cast<double>(h % 6) : static_cast<double>(static_cast<int>(h % 7) - 3);
}

/// Writes `value` as one element of `type` at `out`.
inline void store(DataType type, void* out, double value) {
  const auto wide = static_cast<std::int64_t>(value);  // integers wrap modulo 2^bits, as the kernels do
  switch (type) {
    case DataType::i8: {
      auto v = static_cast<std::int8_t>(wide);
      std::memcpy(out, &v, 1);
      break;
    }
    case DataType::u8: {
      auto v = static_cast<std::uint8_t>(wide);
      std::memcpy(out, &v, 1);
      break;
    }
    case DataType::i32: {
      auto v = static_cast<std::int32_t>(wide);
      std::memcpy(out, &v, 4);
      break;
    }
    case DataType::u32: {
      auto v = static_cast<std::uint32_t>(wide);
      std::memcpy(out, &v, 4);
      break;
    }
    case DataType::i64:
      std::memcpy(out, &wide, 8);
      break;
    case DataType::u64: {
      auto v = static_cast<std::uint64_t>(wide);
      std::memcpy(out, &v, 8);
      break;
    }
    case DataType::f16: {
      f16 v(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      break;
    }
    case DataType::bf16: {
      bf16 v(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      break;
    }
    case DataType::f32: {
      auto v = static_cast<float>(value);
      std::memcpy(out, &v, 4);
      break;
    }
    case DataType::f64:
      std::memcpy(out, &value, 8);
      break;
  }
}

/// Reads one element of `type` at `in` (f16 and bf16 through float; 64-bit integers beyond 2^53 round).
inline double load(DataType type, const void* in) {
  auto get = [in](auto v) {
    std::memcpy(&v, in, sizeof v);
    if constexpr (std::is_same_v<decltype(v), f16> || std::is_same_v<decltype(v), bf16>)
      return static_cast<double>(static_cast<float>(v));
    else
      return static_cast<double>(v);
  };
  switch (type) {
    case DataType::i8:
      return get(std::int8_t{});
    case DataType::u8:
      return get(std::uint8_t{});
    case DataType::i32:
      return get(std::int32_t{});
    case DataType::u32:
      return get(std::uint32_t{});
    case DataType::i64:
      return get(std::int64_t{});
    case DataType::u64:
      return get(std::uint64_t{});
    case DataType::f16:
      return get(f16{});
    case DataType::bf16:
      return get(bf16{});
    case DataType::f32:
      return get(float{});
    case DataType::f64:
      return get(double{});
  }
  return 0;
}

inline bool is_integer(DataType type) {
  return type != DataType::f16 && type != DataType::bf16 && type != DataType::f32 && type != DataType::f64;
}

/// The exact result of reducing the ranks' values of element i (computed in double, exact for
/// these inputs), then, for avg, divided as Tutti specifies: integers truncate toward zero,
/// f16/bf16 divide in f32 and round once.
inline double reference_reduction(DataType type, ReduceOp op, int p, std::size_t i) {
  double acc = input_value(type, op, 0, i);
  for (int r = 1; r < p; ++r) {
    const double v = input_value(type, op, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::avg) {
    if (is_integer(type)) return static_cast<double>(static_cast<long long>(acc) / p);
    if (type == DataType::f64) return acc / p;
    return static_cast<double>(static_cast<float>(acc) / static_cast<float>(p));
  }
  return acc;
}

/// Byte pattern written over outputs before a call, so that an element nobody wrote is caught.
inline constexpr unsigned char poison = 0xA5;

}  // namespace tutti::testing
