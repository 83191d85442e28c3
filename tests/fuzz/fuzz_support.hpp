// Shared by the fuzz targets: the libFuzzer entry point's declaration and a check that fails
// loudly (abort, which libFuzzer and the corpus replayer both report as a crash of this input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace tutti::fuzz {

inline void require(bool holds, const char* what) {
  if (holds) return;
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

}  // namespace tutti::fuzz
