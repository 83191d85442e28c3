// The TCP store's frames (bootstrap/tcp_store_protocol.hpp) as the server reads requests and a
// client reads replies off a connection: byte 0 picks which (bit 0 set: requests, with a key),
// the rest is the stream. Every frame taken must re-encode to exactly the bytes it came from, and
// whatever is not a whole frame must be left alone.
#include <string>

#include "bootstrap/tcp_store_protocol.hpp"
#include "fuzz_support.hpp"

using tutti::bootstrap::detail::FrameStatus;
using tutti::bootstrap::detail::StoreMessage;
using tutti::fuzz::require;
namespace protocol = tutti::bootstrap::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool with_key = (data[0] & 1) != 0;
  std::string stream(reinterpret_cast<const char*>(data + 1), size - 1);
  StoreMessage message;
  for (;;) {
    const std::string before = stream;
    const FrameStatus status = protocol::take_message(stream, with_key, &message);
    if (status != FrameStatus::complete) {
      require(stream == before, "a frame that was not taken changed the buffer");
      break;
    }
    const std::size_t used = before.size() - stream.size();
    require(used >= 9 && before.compare(used, std::string::npos, stream) == 0,
            "taking a frame removed something other than its own bytes");
    std::string again = protocol::encode_message(message, with_key);
    require(again == before.substr(0, used), "a taken frame does not re-encode to its bytes");
    StoreMessage back;
    require(protocol::take_message(again, with_key, &back) == FrameStatus::complete && again.empty(),
            "an encoded frame does not decode");
    require(back.id == message.id && back.kind == message.kind && back.key == message.key &&
                back.payload == message.payload,
            "decode(encode(message)) differs from message");
    if (const auto value = protocol::decode_i64(message.payload))
      require(protocol::encode_i64(*value) == message.payload, "an 8-byte integer does not round-trip");
  }
  return 0;
}
