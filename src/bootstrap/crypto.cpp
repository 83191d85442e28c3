#include "bootstrap/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <climits>
#include <string>

#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

// libcrypto may reject a null pointer even for zero bytes (an empty HMAC key in OpenSSL 3.0).
const unsigned char* bytes_of(std::string_view text) {
  static constexpr unsigned char none = 0;
  return text.empty() ? &none : reinterpret_cast<const unsigned char*>(text.data());
}

}  // namespace

void crypto_failure(const char* call) {
  std::string message = std::string("libcrypto failed in ") + call;
  if (const unsigned long code = ERR_get_error(); code != 0) {
    char reason[256];
    ERR_error_string_n(code, reason, sizeof reason);
    message += std::string(": ") + reason;
  }
  ERR_clear_error();
  throw Error(ErrorCode::system, message);
}

Digest sha256(std::string_view data) {
  Digest digest{};
  unsigned int size = 0;
  if (EVP_Digest(bytes_of(data), data.size(), digest.data(), &size, EVP_sha256(), nullptr) != 1 ||
      size != digest.size())
    crypto_failure("EVP_Digest");
  return digest;
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  if (key.size() > INT_MAX) throw Error(ErrorCode::invalid_argument, "hmac_sha256: key longer than 2 GiB");
  Digest mac{};
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), bytes_of(key), static_cast<int>(key.size()), bytes_of(message), message.size(), mac.data(),
           &size) == nullptr ||
      size != mac.size())
    crypto_failure("HMAC");
  return mac;
}

bool same_bytes(const void* a, const void* b, std::size_t size) { return CRYPTO_memcmp(a, b, size) == 0; }

}  // namespace tutti::bootstrap
