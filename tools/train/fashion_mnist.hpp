// The Fashion-MNIST data set from its gzipped IDX files (Debian's dataset-fashion-mnist).
//
// No libtorch here: the reader returns bytes; the training program makes tensors of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tutti::train {

/// Where dataset-fashion-mnist installs the files.
inline constexpr const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// One split: `count` images of rows x cols bytes (0 = black .. 255), row-major, and their labels 0..9.
struct ImageSet {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols
  std::vector<std::uint8_t> labels;  // count
};

/// Reads split `name` ("train" or "t10k") from `dir`: NAME-images-idx3-ubyte.gz and
/// NAME-labels-idx1-ubyte.gz (or the same names without .gz), keeping the first `limit` samples
/// (0 = all). Checks the IDX magic numbers, the 28x28 dimensions, that the two files agree on
/// the count, that neither is truncated or has trailing bytes, and that labels are 0..9.
/// Throws std::runtime_error naming the file and what is wrong.
ImageSet read_fashion_mnist(const std::string& dir, const std::string& name, std::size_t limit = 0);

}  // namespace tutti::train
