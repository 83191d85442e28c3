#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "compression '" + std::string(text) + "': " + why +
                                               " (none, fp16, bf16, qsgd:BITS with BITS 4 or 8, powersgd:RANK, "
                                               "topk:RATIO or topk:RATIO:WARMUP with 0 < RATIO <= 1 and WARMUP steps)");
}

template <class T>
T number(std::string_view text, std::string_view value) {
  T out{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size())
    bad(text, "'" + std::string(value) + "' is not a number");
  return out;
}

}  // namespace

Compression Compression::parse(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const bool has_value = colon != std::string_view::npos;
  const std::string_view value = has_value ? text.substr(colon + 1) : std::string_view();
  Compression c;
  if (kind == "none" || kind == "fp16" || kind == "bf16") {
    if (has_value) bad(text, std::string(kind) + " takes no value");
    c.kind = kind == "none" ? Kind::none : kind == "fp16" ? Kind::fp16 : Kind::bf16;
    return c;
  }
  if (!has_value) bad(text, "missing ':' and a value");
  if (kind == "qsgd") {
    c.kind = Kind::qsgd;
    c.bits = number<int>(text, value);
    if (c.bits != 4 && c.bits != 8) bad(text, "BITS must be 4 or 8");
  } else if (kind == "powersgd") {
    c.kind = Kind::powersgd;
    c.rank = number<int>(text, value);
    if (c.rank < 1) bad(text, "RANK must be at least 1");
  } else if (kind == "topk") {  // topk:RATIO or topk:RATIO:WARMUP
    c.kind = Kind::topk;
    const auto second = value.find(':');
    c.ratio = number<double>(text, value.substr(0, second));
    if (!(c.ratio > 0 && c.ratio <= 1)) bad(text, "RATIO must be in (0, 1]");
    if (second != std::string_view::npos) {
      c.warmup = number<int>(text, value.substr(second + 1));
      if (c.warmup < 0) bad(text, "WARMUP must be a number of steps, 0 or more");
    }
  } else {
    bad(text, "unknown compressor");
  }
  return c;
}

std::string Compression::to_string() const {
  switch (kind) {
    case Kind::none:
      return "none";
    case Kind::fp16:
      return "fp16";
    case Kind::bf16:
      return "bf16";
    case Kind::qsgd:
      return "qsgd:" + std::to_string(bits);
    case Kind::powersgd:
      return "powersgd:" + std::to_string(rank);
    case Kind::topk: {
      char buffer[32];
      const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, ratio);
      return "topk:" + std::string(buffer, ec == std::errc() ? end : buffer) +
             (warmup > 0 ? ":" + std::to_string(warmup) : "");
    }
  }
  return "?";
}

}  // namespace tutti::compress
