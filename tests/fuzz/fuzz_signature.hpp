// What must hold of a collective's signature decoded from a peer's bytes (transport/signature.cpp),
// which a mismatch report describes: shared by the targets whose inputs carry one (a TCP frame
// header, an shm chunk header or signature slot).
#pragma once

#include <string>

#include "fuzz_support.hpp"
#include "transport/transport.hpp"

namespace tutti::fuzz {

inline void check_signature(const transport::WireSignature& wire) {
  require(wire == wire, "WireSignature's == is not reflexive");
  const transport::Signature decoded = transport::from_wire(wire);
  const std::string text = decoded.describe();  // what a mismatch report prints
  require(!text.empty(), "a signature described as nothing");
  // Decoding is stable: what it makes of any bytes, the wire form carries back unchanged.
  const transport::WireSignature again = transport::to_wire(decoded);
  require(transport::to_wire(transport::from_wire(again)) == again,
          "a signature does not survive to_wire(from_wire(...))");
  require(transport::from_wire(again) == decoded, "re-decoding a signature changed it");
}

}  // namespace tutti::fuzz
