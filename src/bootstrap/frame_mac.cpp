#include "bootstrap/frame_mac.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>

#include <algorithm>
#include <cstring>

#include "bootstrap/crypto.hpp"

namespace tutti::bootstrap {

namespace {

// GCM's block cipher: one AES block through the ECB context. Cannot fail on a context set up by
// the constructor; if it ever did, the output is zeroed, every tag is wrong, and the peer drops
// the connection (it fails closed).
void encrypt_block(const unsigned char in[16], unsigned char out[16], const void* key) {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(const_cast<void*>(key));
  int written = 0;
  if (EVP_EncryptUpdate(ctx, out, &written, in, 16) != 1 || written != 16) std::memset(out, 0, 16);
}

}  // namespace

bool FrameMac::vector_available() {
  static const bool available = ghash::available();
  return available;
}

FrameMac::FrameMac(const SessionKey& key, bool from_initiator, Engine engine)
    : block_(EVP_CIPHER_CTX_new()), direction_(from_initiator ? 'I' : 'A') {
  static_assert(std::tuple_size_v<SessionKey> == 32, "AES-256 takes a 32-byte key");
  if (block_ == nullptr) crypto_failure("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex(block_, EVP_aes_256_ecb(), nullptr, key.data(), nullptr) != 1 ||
      EVP_CIPHER_CTX_set_padding(block_, 0) != 1) {
    EVP_CIPHER_CTX_free(block_);
    crypto_failure("EVP_EncryptInit_ex");
  }
  if (engine == Engine::fastest && vector_available()) {
    vector_ = std::make_unique<Vector>();
    std::uint8_t h[ghash::block] = {};
    encrypt_block(h, h, block_);  // GCM's hash key H = E(K, 0)
    ghash::prepare(vector_->key, h);
    OPENSSL_cleanse(h, sizeof(h));
    return;
  }
  gcm_ = CRYPTO_gcm128_new(block_, encrypt_block);  // computes GCM's hash key H = E(K, 0)
  if (gcm_ == nullptr) {
    EVP_CIPHER_CTX_free(block_);
    crypto_failure("CRYPTO_gcm128_new");
  }
}

FrameMac::~FrameMac() {
  if (vector_) OPENSSL_cleanse(vector_.get(), sizeof(Vector));  // H's powers and the running hash
  if (gcm_ != nullptr) CRYPTO_gcm128_release(gcm_);
  EVP_CIPHER_CTX_free(block_);
}

void FrameMac::nonce(std::uint64_t counter, Part part, std::uint8_t out[12]) const {
  out[0] = direction_;
  out[1] = static_cast<std::uint8_t>(part);
  out[2] = out[3] = 0;
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<std::uint8_t>(counter >> (8 * i));
}

void FrameMac::begin(std::uint64_t counter, Part part) {
  if (!vector_) {
    std::uint8_t iv[12];
    nonce(counter, part, iv);
    CRYPTO_gcm128_setiv(gcm_, iv, sizeof(iv));
    return;
  }
  Vector& v = *vector_;
  std::uint8_t j0[ghash::block] = {};  // a 96-bit nonce, then the counter 1
  nonce(counter, part, j0);
  j0[15] = 1;
  encrypt_block(j0, v.pad, block_);
  v.hash = {};
  v.buffered = 0;
  v.bytes = 0;
}

void FrameMac::update(const void* data, std::size_t bytes) {
  if (bytes == 0) return;
  if (vector_) return vector_update(static_cast<const std::uint8_t*>(data), bytes);
  // GCM takes at most 2^61 bytes of associated data: far beyond any frame (payloads are bounded).
  if (CRYPTO_gcm128_aad(gcm_, static_cast<const unsigned char*>(data), bytes) != 0) crypto_failure("CRYPTO_gcm128_aad");
}

void FrameMac::vector_update(const std::uint8_t* data, std::size_t bytes) {
  Vector& v = *vector_;
  v.bytes += bytes;
  if (v.buffered > 0) {  // complete the block begun by the last update first
    const std::size_t take = std::min(bytes, ghash::block - v.buffered);
    std::memcpy(v.partial + v.buffered, data, take);
    v.buffered += take;
    data += take;
    bytes -= take;
    if (v.buffered < ghash::block) return;
    ghash::absorb(v.key, v.hash, v.partial, 1);
    v.buffered = 0;
  }
  const std::size_t blocks = bytes / ghash::block;
  ghash::absorb(v.key, v.hash, data, blocks);
  v.buffered = bytes - blocks * ghash::block;
  std::memcpy(v.partial, data + blocks * ghash::block, v.buffered);
}

Tag FrameMac::finish() {
  Tag tag{};
  if (!vector_) {
    CRYPTO_gcm128_tag(gcm_, tag.data(), tag.size());
    return tag;
  }
  Vector& v = *vector_;
  if (v.buffered > 0) {  // the last block, padded with zeros
    std::memset(v.partial + v.buffered, 0, ghash::block - v.buffered);
    ghash::absorb(v.key, v.hash, v.partial, 1);
  }
  std::uint8_t lengths[ghash::block] = {};  // the associated data's length in bits, then the text's (0)
  const std::uint64_t bits = v.bytes * 8;
  for (int i = 0; i < 8; ++i) lengths[7 - i] = static_cast<std::uint8_t>(bits >> (8 * i));
  ghash::absorb(v.key, v.hash, lengths, 1);
  ghash::output(v.hash, tag.data());
  for (std::size_t i = 0; i < tag.size(); ++i) tag[i] ^= v.pad[i];
  v.buffered = 0;
  return tag;
}

bool FrameMac::same(const Tag& a, const Tag& b) { return same_bytes(a.data(), b.data(), a.size()); }

}  // namespace tutti::bootstrap
