// connect_store(): picks the store implementation from the URL's scheme.
#include <charconv>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/store_backends.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace detail {

bool parse_store_int(const std::string& text, std::int64_t* value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, *value);
  return !text.empty() && error == std::errc() && stop == end;
}

}  // namespace detail

namespace {

[[noreturn]] void malformed(const std::string& url, const std::string& why) {
  throw Error(ErrorCode::invalid_argument,
              "TUTTI_STORE: '" + url + "' is not file:///abs/dir or tcp://host:port (" + why + ")");
}

// "host:port" or "[v6 address]:port".
std::pair<std::string, int> split_host_port(const std::string& url, const std::string& rest) {
  std::string host;
  std::string port_text;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      malformed(url, "bad [address]:port");
    host = rest.substr(1, close - 1);
    port_text = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos) malformed(url, "no port");
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
    if (host.find(':') != std::string::npos) malformed(url, "an IPv6 address needs [brackets]");
  }
  if (host.empty()) malformed(url, "no host");
  int port = 0;
  const char* end = port_text.data() + port_text.size();
  const auto [stop, error] = std::from_chars(port_text.data(), end, port);
  if (port_text.empty() || error != std::errc() || stop != end || port < 1 || port > 65535)
    malformed(url, "port must be 1 to 65535");
  return {host, port};
}

}  // namespace

std::pair<std::string, int> tcp_store_address(const std::string& url) {
  const std::string tcp_scheme = "tcp://";
  if (!url.starts_with(tcp_scheme)) malformed(url, "not a tcp:// URL");
  std::string rest = url.substr(tcp_scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  return split_host_port(url, rest);
}

std::unique_ptr<Store> connect_store(const std::string& url, const std::string& token,
                                     std::chrono::milliseconds timeout) {
  const std::string file_scheme = "file://", tcp_scheme = "tcp://";
  if (url.starts_with(file_scheme)) {
    const std::string dir = url.substr(file_scheme.size());
    if (dir.empty() || dir.front() != '/') malformed(url, "the directory must be an absolute path");
    return detail::open_file_store(url, dir);
  }
  if (url.starts_with(tcp_scheme)) {
    const auto [host, port] = tcp_store_address(url);
    require_token(token, "the tcp:// store (TUTTI_STORE=" + url + ")");
    return detail::connect_tcp_store(url, host, port, token, timeout);
  }
  malformed(url, "unknown scheme");
}

}  // namespace tutti::bootstrap
