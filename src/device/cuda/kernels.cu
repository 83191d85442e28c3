// The reduction kernels of the CUDA device: every DataType x ReduceOp, grid-stride loops, 16-byte
// loads and stores where all the buffers are 16-byte aligned. The element rules are
// elementwise.hpp's, the same bits as the host kernels.
#include <cstdint>

#include "device/cuda/kernels.hpp"

namespace tutti::device::cuda {
namespace {

using kernels::Bf16;
using kernels::DefaultNan;
using kernels::F16;
using kernels::Op;

constexpr int threads_per_block = 256;

// A 16-byte vector of T, loaded and stored as one uint4.
template <class T>
struct Vector {
  static constexpr int lanes = 16 / sizeof(T);
  T lane[lanes];
};

template <class T>
__device__ __forceinline__ Vector<T> load(const void* p, std::size_t i) {
  const uint4 raw = static_cast<const uint4*>(p)[i];
  Vector<T> v;
  memcpy(&v, &raw, sizeof v);
  return v;
}

template <class T>
__device__ __forceinline__ void store(void* p, std::size_t i, const Vector<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof raw);
  static_cast<uint4*>(p)[i] = raw;
}

// The one grid-stride loop of every kernel: vector(i) for each 16-byte vector i when `vectors`,
// then one(i) for each element past them (all of them otherwise).
template <class T, class Vectors, class One>
__device__ void grid_stride(std::size_t count, bool vectors, Vectors vector, One one) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vectors) {
    const std::size_t n = count / Vector<T>::lanes;
    for (std::size_t i = first; i < n; i += stride) vector(i);
    done = n * Vector<T>::lanes;
  }
  for (std::size_t i = done + first; i < count; i += stride) one(i);
}

// Each thread reads all its inputs before it writes, so dst may alias a or b exactly.
template <Op op, class T>
__global__ void reduce_kernel(T* dst, const T* a, const T* b, std::size_t count, bool vectors, DefaultNan nan) {
  grid_stride<T>(
      count, vectors,
      [&](std::size_t i) {
        const Vector<T> x = load<T>(a, i), y = load<T>(b, i);
        Vector<T> r;
#pragma unroll
        for (int k = 0; k < Vector<T>::lanes; ++k) r.lane[k] = kernels::combine<op>(x.lane[k], y.lane[k], nan);
        store<T>(dst, i, r);
      },
      [&](std::size_t i) { dst[i] = kernels::combine<op>(a[i], b[i], nan); });
}

template <class T>
__global__ void divide_kernel(T* data, std::size_t count, bool vectors, int divisor) {
  grid_stride<T>(
      count, vectors,
      [&](std::size_t i) {
        Vector<T> x = load<T>(data, i);
#pragma unroll
        for (int k = 0; k < Vector<T>::lanes; ++k) x.lane[k] = kernels::divide(x.lane[k], divisor);
        store<T>(data, i, x);
      },
      [&](std::size_t i) { data[i] = kernels::divide(data[i], divisor); });
}

// Device::compute: a chain of `rounds` dependent FMAs per element (compute-bound for large rounds).
__global__ void compute_kernel(float* data, std::size_t count, int rounds) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float x = data[i];
    for (int r = 0; r < rounds; ++r) x = fmaf(x, 0.5f, 1.0f);
    data[i] = x;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

unsigned blocks_for(std::size_t work, int max_blocks) {
  const std::size_t wanted = (work + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(wanted < static_cast<std::size_t>(max_blocks) ? (wanted > 0 ? wanted : 1) : max_blocks);
}

// Calls f.template operator()<T>() with the element type of `type` (F16/Bf16 for the halves).
template <class F>
cudaError_t with_type(DataType type, F&& f) {
  switch (type) {
    case DataType::i8:
      return f.template operator()<std::int8_t>();
    case DataType::u8:
      return f.template operator()<std::uint8_t>();
    case DataType::i32:
      return f.template operator()<std::int32_t>();
    case DataType::u32:
      return f.template operator()<std::uint32_t>();
    case DataType::i64:
      return f.template operator()<std::int64_t>();
    case DataType::u64:
      return f.template operator()<std::uint64_t>();
    case DataType::f16:
      return f.template operator()<F16>();
    case DataType::bf16:
      return f.template operator()<Bf16>();
    case DataType::f32:
      return f.template operator()<float>();
    case DataType::f64:
      return f.template operator()<double>();
  }
  return cudaErrorInvalidValue;
}

template <Op op, class T>
cudaError_t reduce_as(void* dst, const void* a, const void* b, std::size_t count, const DefaultNan& nan, int max_blocks,
                      cudaStream_t stream) {
  const bool vectors = aligned16(dst) && aligned16(a) && aligned16(b);
  const std::size_t work = vectors ? count / Vector<T>::lanes + Vector<T>::lanes : count;
  reduce_kernel<op, T><<<blocks_for(work, max_blocks), threads_per_block, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, vectors, nan);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                          const DefaultNan& nan, int max_blocks, cudaStream_t stream) {
  return with_type(type, [&]<class T>() {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return reduce_as<Op::sum, T>(dst, a, b, count, nan, max_blocks, stream);
      case ReduceOp::prod:
        return reduce_as<Op::prod, T>(dst, a, b, count, nan, max_blocks, stream);
      case ReduceOp::min:
        return reduce_as<Op::min, T>(dst, a, b, count, nan, max_blocks, stream);
      case ReduceOp::max:
        return reduce_as<Op::max, T>(dst, a, b, count, nan, max_blocks, stream);
    }
    return cudaErrorInvalidValue;
  });
}

cudaError_t launch_divide(void* data, std::size_t count, DataType type, int divisor, int max_blocks,
                          cudaStream_t stream) {
  return with_type(type, [&]<class T>() {
    const bool vectors = aligned16(data);
    const std::size_t work = vectors ? count / Vector<T>::lanes + Vector<T>::lanes : count;
    divide_kernel<T><<<blocks_for(work, max_blocks), threads_per_block, 0, stream>>>(static_cast<T*>(data), count,
                                                                                     vectors, divisor);
    return cudaGetLastError();
  });
}

cudaError_t launch_compute(float* data, std::size_t count, int rounds, int max_blocks, cudaStream_t stream) {
  compute_kernel<<<blocks_for(count, max_blocks), threads_per_block, 0, stream>>>(data, count, rounds);
  return cudaGetLastError();
}

cudaError_t load_kernels() {
  const auto load = [](const void* kernel) {
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, kernel);
  };
  for (const DataType type : {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64, DataType::u64,
                              DataType::f16, DataType::bf16, DataType::f32, DataType::f64}) {
    const cudaError_t status = with_type(type, [&]<class T>() {
      for (const void* kernel : {reinterpret_cast<const void*>(&reduce_kernel<Op::sum, T>),
                                 reinterpret_cast<const void*>(&reduce_kernel<Op::prod, T>),
                                 reinterpret_cast<const void*>(&reduce_kernel<Op::min, T>),
                                 reinterpret_cast<const void*>(&reduce_kernel<Op::max, T>),
                                 reinterpret_cast<const void*>(&divide_kernel<T>)})
        if (const cudaError_t loaded = load(kernel); loaded != cudaSuccess) return loaded;
      return cudaSuccess;
    });
    if (status != cudaSuccess) return status;
  }
  return load(reinterpret_cast<const void*>(&compute_kernel));
}

}  // namespace tutti::device::cuda
