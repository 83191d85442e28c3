// The training-step simulator's inputs and outputs: model profiles, networks, engine policies.
//
// A model profile is what one rank's training step computes and communicates: forward time,
// each gradient in the order backward produces it (its size and the backward time until it is
// ready), and the optimizer's time. `tutti-train --profile FILE` records one from a real run;
// one can also be written by hand. The file is line-oriented text:
//
//   tutti-profile 1
//   model vgg16
//   batch 32                          # samples per rank and step
//   forward 0.1234                    # seconds
//   optimizer 0.0100                  # seconds
//   note measured on ..., scaled by ...   (free text, any number of lines)
//   grad classifier.6.bias 1000 f32 0.0012    # name, elements, type, backward seconds since
//   grad classifier.6.weight 4096000 f32 0.0 #   the previous gradient (or backward's start)
//
// Blank lines and text after '#' are ignored; names contain no spaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::sim {

struct GradientProfile {
  std::string name;
  std::size_t count = 0;  ///< elements
  DataType type = DataType::f32;
  double backward_seconds = 0;  ///< compute between the previous gradient (or backward's start) and this one
};

struct ModelProfile {
  std::string model;
  std::int64_t batch_size = 0;  ///< samples per rank and step
  double forward_seconds = 0;
  double optimizer_seconds = 0;
  std::vector<GradientProfile> gradients;  ///< in the order backward produces them
  std::vector<std::string> notes;          ///< provenance, one line each

  double backward_seconds() const;
  std::size_t gradient_bytes() const;
  /// Forward + backward + optimizer: the step without communication.
  double compute_seconds() const { return forward_seconds + backward_seconds() + optimizer_seconds; }
};

/// Parses the format above. Throws Error(invalid_argument) naming `source` and the line on a
/// malformed or missing field, an unknown type, a negative time or a duplicate gradient name.
ModelProfile read_profile(std::istream& in, const std::string& source = "profile");
/// Reads `path`; Error(invalid_argument) naming it when it cannot be opened.
ModelProfile read_profile_file(const std::string& path);
/// Writes `profile` in the format read_profile reads (times with 9 significant digits).
void write_profile(std::ostream& out, const ModelProfile& profile);
/// Writes to `path` atomically (a temporary file renamed); Error(system) on failure.
void write_profile_file(const std::string& path, const ModelProfile& profile);

}  // namespace tutti::sim
