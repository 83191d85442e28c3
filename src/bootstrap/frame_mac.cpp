#include "bootstrap/frame_mac.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "bootstrap/crypto.hpp"

namespace tutti::bootstrap {

FrameMac::FrameMac(const SessionKey& key, bool from_initiator)
    : ctx_(EVP_CIPHER_CTX_new()), direction_(from_initiator ? 'I' : 'A') {
  static_assert(std::tuple_size_v<SessionKey> == 32, "AES-256 takes a 32-byte key");
  if (ctx_ == nullptr) crypto_failure("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
    EVP_CIPHER_CTX_free(ctx_);
    crypto_failure("EVP_EncryptInit_ex");
  }
}

FrameMac::~FrameMac() { EVP_CIPHER_CTX_free(ctx_); }

void FrameMac::begin(std::uint64_t counter, Part part) {
  std::uint8_t nonce[12] = {direction_, static_cast<std::uint8_t>(part), 0, 0};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<std::uint8_t>(counter >> (8 * i));
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1) crypto_failure("EVP_EncryptInit_ex");
}

void FrameMac::update(const void* data, std::size_t bytes) {
  const auto* next = static_cast<const unsigned char*>(data);
  while (bytes > 0) {  // EVP counts in int
    const std::size_t piece = std::min<std::size_t>(bytes, std::size_t{1} << 30);
    int ignored = 0;
    if (EVP_EncryptUpdate(ctx_, nullptr, &ignored, next, static_cast<int>(piece)) != 1)
      crypto_failure("EVP_EncryptUpdate");
    next += piece;
    bytes -= piece;
  }
}

Tag FrameMac::finish() {
  Tag tag{};
  int ignored = 0;
  unsigned char none[16];
  if (EVP_EncryptFinal_ex(ctx_, none, &ignored) != 1) crypto_failure("EVP_EncryptFinal_ex");
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()) != 1)
    crypto_failure("EVP_CTRL_GCM_GET_TAG");
  return tag;
}

bool FrameMac::same(const Tag& a, const Tag& b) { return same_bytes(a.data(), b.data(), a.size()); }

}  // namespace tutti::bootstrap
