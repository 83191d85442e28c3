// GHASH (NIST SP 800-38D, the hash of GCM and so of the frame tags' GMAC) with carry-less
// multiplication on 512-bit vectors: 32 blocks per reduction, four to an instruction. OpenSSL
// 3.0 hashes one 128-bit block per multiplication; where the CPU has VPCLMULQDQ and AVX-512 this
// is several times faster, and it computes the same function: FrameMac checks it against
// OpenSSL's GCM in tests (bootstrap_test), tag for tag.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::bootstrap::ghash {

inline constexpr std::size_t block = 16;
inline constexpr std::size_t powers = 32;  // blocks per reduction

/// The hash key H = E(K, 0^128) prepared: H^32 .. H^1, each bit-reflected and times x^-1, and
/// for each the xor of its two 64-bit halves in both (Karatsuba's middle factor).
struct alignas(64) Key {
  std::uint8_t power[powers][block];
  std::uint8_t halves[powers][block];
};

/// The running hash, bit-reflected (the block's bytes reversed).
struct alignas(16) State {
  std::uint8_t y[block] = {};
};

/// Whether this CPU runs the code below (x86-64 with PCLMULQDQ, AVX-512 F/BW/VL and VPCLMULQDQ).
/// Nothing else here may be called where it is false.
bool available();

/// Prepares `key` from the hash key h = E(K, 0^128), as bytes.
void prepare(Key& key, const std::uint8_t h[block]);

/// Absorbs `blocks` whole 16-byte blocks of `data` into `state`.
void absorb(const Key& key, State& state, const std::uint8_t* data, std::size_t blocks);

/// The hash as bytes (GCM's S, before its encryption with E(K, J0)).
void output(const State& state, std::uint8_t out[block]);

}  // namespace tutti::bootstrap::ghash
