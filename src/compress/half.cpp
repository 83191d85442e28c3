// fp16 and bf16 codecs: the reduce layer's branch-free conversions (element_ops.hpp), which are
// bit for bit those of tutti::detail and vectorize.
#include "reduce/element_ops.hpp"
#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

template <class Codec>
void encode(const float* in, std::uint16_t* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = Codec::encode(in[i]);
}

template <class Codec>
void decode(const std::uint16_t* in, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = Codec::decode(in[i]);
}

}  // namespace

void encode_fp16(const float* in, std::uint16_t* out, std::size_t count) { encode<reduce::F16Codec>(in, out, count); }
void decode_fp16(const std::uint16_t* in, float* out, std::size_t count) { decode<reduce::F16Codec>(in, out, count); }
void encode_bf16(const float* in, std::uint16_t* out, std::size_t count) { encode<reduce::Bf16Codec>(in, out, count); }
void decode_bf16(const std::uint16_t* in, float* out, std::size_t count) { decode<reduce::Bf16Codec>(in, out, count); }

}  // namespace tutti::compress
