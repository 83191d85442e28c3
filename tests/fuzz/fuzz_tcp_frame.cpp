// What a TCP peer sends after the handshake (transport/tcp/wire.hpp): frames, each an 80-byte
// FrameHeader read by memcpy. The fuzzer's bytes are one header (a short input overwrites only
// the first fields of a default header; bytes past 80 are ignored). check_frame holds what must be true of any header a
// peer can send; today that is the signature's decoding (transport/signature.cpp), which a mismatch report reads from a
// peer's frame.
#include <algorithm>
#include <cstring>
#include <string>

#include "fuzz_support.hpp"
#include "transport/tcp/wire.hpp"

using tutti::fuzz::require;
namespace transport = tutti::transport;
namespace tcp = tutti::transport::tcp;

namespace {

void check_signature(const transport::WireSignature& wire) {
  require(tcp::same_signature(wire, wire), "same_signature is not reflexive");
  const transport::Signature decoded = transport::from_wire(wire);
  const std::string text = decoded.describe();  // what a mismatch report prints
  require(!text.empty(), "a signature described as nothing");
  // Decoding is stable: what it makes of any bytes, the wire form carries back unchanged.
  const transport::WireSignature again = transport::to_wire(decoded);
  require(tcp::same_signature(transport::to_wire(transport::from_wire(again)), again),
          "a signature does not survive to_wire(from_wire(...))");
  require(transport::from_wire(again) == decoded, "re-decoding a signature changed it");
}

void check_frame(const tcp::FrameHeader& header) { check_signature(header.signature); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tcp::FrameHeader header{};
  std::memcpy(&header, data, std::min(size, sizeof(header)));
  check_frame(header);
  return 0;
}
