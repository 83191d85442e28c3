// QSGD: stochastic quantization of each bucket against its L2 norm (Alistarh et al., 2017).
// Layout of an encoded vector: one f32 norm per bucket, then one code per element (8 bits: the
// sign in bit 7, the level in bits 0-6; 4 bits: two codes a byte, element 2j in the low nibble,
// the sign in bit 3, the level in bits 0-2).
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compress/random.hpp"
#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

void check(std::size_t count, const QsgdOptions& options, const void* a, const void* b, const char* what) {
  qsgd_levels(options.bits);
  if (options.bucket_size == 0) throw Error(ErrorCode::invalid_argument, std::string(what) + ": bucket_size is 0");
  if (count > 0 && (a == nullptr || b == nullptr))
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": null buffer with count " + std::to_string(count));
  // The encoded size (count codes of up to 8 bits, a norm per bucket) must not wrap around: a
  // wrapped size would have the caller allocate too little for qsgd_encode to write.
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max() / 16;
  if (count > most || options.bucket_size > most)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": count " + std::to_string(count) +
                                                 " is too large: its encoding would take more than 2^64 bytes");
}

std::size_t buckets(std::size_t count, const QsgdOptions& options) {
  return (count + options.bucket_size - 1) / options.bucket_size;
}

void put_code(std::byte* codes, std::size_t i, int bits, unsigned code) {
  if (bits == 8) {
    codes[i] = static_cast<std::byte>(code);
    return;
  }
  const unsigned shift = (i % 2) * 4;
  codes[i / 2] |= static_cast<std::byte>(code << shift);
}

unsigned get_code(const std::byte* codes, std::size_t i, int bits) {
  if (bits == 8) return static_cast<unsigned>(codes[i]);
  return (static_cast<unsigned>(codes[i / 2]) >> ((i % 2) * 4)) & 0xfu;
}

// The decoded value of every element, handed to `sink(i, value)`.
template <class Sink>
void decode_each(const std::byte* in, std::size_t count, const QsgdOptions& options, Sink sink) {
  const int s = qsgd_levels(options.bits);
  const unsigned sign_bit = 1u << (options.bits - 1);
  const std::size_t nb = buckets(count, options);
  const std::byte* codes = in + nb * sizeof(float);
  for (std::size_t b = 0; b < nb; ++b) {
    float norm;
    std::memcpy(&norm, in + b * sizeof(float), sizeof norm);
    const std::size_t end = std::min(count, (b + 1) * options.bucket_size);
    for (std::size_t i = b * options.bucket_size; i < end; ++i) {
      const unsigned code = get_code(codes, i, options.bits);
      const double level = static_cast<double>(code & (sign_bit - 1));
      const float magnitude = static_cast<float>(static_cast<double>(norm) * level / s);
      sink(i, (code & sign_bit) ? -magnitude : magnitude);
    }
  }
}

}  // namespace

int qsgd_levels(int bits) {
  if (bits != 4 && bits != 8)
    throw Error(ErrorCode::invalid_argument, "qsgd: bits must be 4 or 8, not " + std::to_string(bits));
  return (1 << (bits - 1)) - 1;
}

std::size_t qsgd_encoded_bytes(std::size_t count, const QsgdOptions& options) {
  check(count, options, &options, &options, "qsgd_encoded_bytes");  // the options and the size: no buffers here
  return buckets(count, options) * sizeof(float) + (count * static_cast<std::size_t>(options.bits) + 7) / 8;
}

void qsgd_encode(const float* in, std::size_t count, const QsgdOptions& options, const RandomKey& key, std::byte* out) {
  check(count, options, in, out, "qsgd_encode");
  if (count == 0) return;  // out may be null then
  const int s = qsgd_levels(options.bits);
  const unsigned sign_bit = 1u << (options.bits - 1);
  const detail::CounterRandom random(key);
  const std::size_t nb = buckets(count, options);
  std::byte* codes = out + nb * sizeof(float);
  std::memset(codes, 0, qsgd_encoded_bytes(count, options) - nb * sizeof(float));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t begin = b * options.bucket_size, end = std::min(count, begin + options.bucket_size);
    double sum = 0;
    for (std::size_t i = begin; i < end; ++i) sum += static_cast<double>(in[i]) * in[i];
    // The levels are measured against the norm as sent, so that decoding gives exactly the level.
    const float norm = static_cast<float>(std::sqrt(sum));
    std::memcpy(out + b * sizeof(float), &norm, sizeof norm);
    if (!(norm > 0) || !std::isfinite(norm)) continue;  // zero codes: zeros, or NaN from the norm
    for (std::size_t i = begin; i < end; ++i) {
      // r is in [0, s]: the conversion truncates, which is the floor here (and far cheaper).
      const double r = std::min(std::fabs(static_cast<double>(in[i])) / norm * s, static_cast<double>(s));
      const auto whole = static_cast<unsigned>(r);
      unsigned code = whole + (random(i) < r - whole ? 1u : 0u);
      if (std::signbit(in[i]) && code != 0) code |= sign_bit;
      put_code(codes, i, options.bits, code);
    }
  }
}

void qsgd_decode(const std::byte* in, std::size_t count, const QsgdOptions& options, float* out) {
  check(count, options, in, out, "qsgd_decode");
  decode_each(in, count, options, [out](std::size_t i, float v) { out[i] = v; });
}

void qsgd_decode_add(const std::byte* in, std::size_t count, const QsgdOptions& options, float* out) {
  check(count, options, in, out, "qsgd_decode_add");
  decode_each(in, count, options, [out](std::size_t i, float v) { out[i] += v; });
}

}  // namespace tutti::compress
