#include "bootstrap/frame_mac.hpp"

#include <openssl/evp.h>
#include <openssl/modes.h>

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

FrameMac::FrameMac(const SessionKey& key, bool from_initiator)
    : block_(EVP_CIPHER_CTX_new()), direction_(from_initiator ? 'I' : 'A') {
  static_assert(std::tuple_size_v<SessionKey> == 32, "AES-256 takes a 32-byte key");
  if (block_ == nullptr) crypto_failure("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex(block_, EVP_aes_256_ecb(), nullptr, key.data(), nullptr) != 1 ||
      EVP_CIPHER_CTX_set_padding(block_, 0) != 1) {
    EVP_CIPHER_CTX_free(block_);
    crypto_failure("EVP_EncryptInit_ex");
  }
  gcm_ = CRYPTO_gcm128_new(block_, encrypt_block);  // computes GCM's hash key H = E(K, 0)
  if (gcm_ == nullptr) {
    EVP_CIPHER_CTX_free(block_);
    crypto_failure("CRYPTO_gcm128_new");
  }
}

FrameMac::~FrameMac() {
  CRYPTO_gcm128_release(gcm_);
  EVP_CIPHER_CTX_free(block_);
}

void FrameMac::begin(std::uint64_t counter, Part part) {
  std::uint8_t nonce[12] = {direction_, static_cast<std::uint8_t>(part), 0, 0};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<std::uint8_t>(counter >> (8 * i));
  CRYPTO_gcm128_setiv(gcm_, nonce, sizeof(nonce));
}

void FrameMac::update(const void* data, std::size_t bytes) {
  if (bytes == 0) return;
  // GCM takes at most 2^61 bytes of associated data: far beyond any frame (payloads are bounded).
  if (CRYPTO_gcm128_aad(gcm_, static_cast<const unsigned char*>(data), bytes) != 0) crypto_failure("CRYPTO_gcm128_aad");
}

Tag FrameMac::finish() {
  Tag tag{};
  CRYPTO_gcm128_tag(gcm_, tag.data(), tag.size());
  return tag;
}

bool FrameMac::same(const Tag& a, const Tag& b) { return same_bytes(a.data(), b.data(), a.size()); }

}  // namespace tutti::bootstrap
