#include "fashion_mnist.hpp"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>

namespace tutti::train {

namespace {

constexpr std::uint32_t images_magic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t labels_magic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr std::size_t side = 28;
constexpr std::size_t max_count = 10'000'000;  // a header announcing more is damaged

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// A gzip (or plain: zlib reads it as is) file, read sequentially.
class GzFile {
 public:
  explicit GzFile(std::string path) : path_(std::move(path)) {
    file_ = gzopen(path_.c_str(), "rb");
    if (!file_) fail(path_, errno ? std::strerror(errno) : "cannot open");
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  /// Reads exactly `bytes` bytes; `what` names them in the error.
  void read(void* data, std::size_t bytes, const char* what) {
    auto* out = static_cast<unsigned char*>(data);
    while (bytes > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes, 1u << 30));
      const int got = gzread(file_, out, chunk);
      if (got < 0) fail(path_, std::string("damaged (") + error() + ") while reading " + what);
      if (got == 0) fail(path_, std::string("truncated: the file ends inside ") + what);
      out += got;
      bytes -= static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_u32(const char* what) {
    std::array<unsigned char, 4> b{};
    read(b.data(), b.size(), what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  }

  /// Checks that nothing follows what was read.
  void expect_end() {
    unsigned char extra = 0;
    const int got = gzread(file_, &extra, 1);
    if (got < 0) fail(path_, std::string("damaged (") + error() + ")");
    if (got > 0) fail(path_, "damaged: bytes follow the data the header announces");
  }

  const std::string& path() const { return path_; }

 private:
  const char* error() {
    int code = 0;
    const char* message = gzerror(file_, &code);
    return message && *message ? message : "read error";
  }

  std::string path_;
  gzFile file_ = nullptr;
};

// DIR/NAME.gz, or DIR/NAME when only the uncompressed file is there.
std::string locate(const std::string& dir, const std::string& name) {
  const std::filesystem::path gz = std::filesystem::path(dir) / (name + ".gz");
  const std::filesystem::path plain = std::filesystem::path(dir) / name;
  std::error_code ec;
  if (!std::filesystem::exists(gz, ec) && std::filesystem::exists(plain, ec)) return plain.string();
  if (!std::filesystem::exists(gz, ec))
    fail(gz.string(), "no such file (install the dataset-fashion-mnist package, or pass --data DIR)");
  return gz.string();
}

}  // namespace

ImageSet read_fashion_mnist(const std::string& dir, const std::string& name, std::size_t limit) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    fail(dir, "no such data directory (install the dataset-fashion-mnist package, or pass --data DIR)");

  ImageSet set;
  GzFile images(locate(dir, name + "-images-idx3-ubyte"));
  if (const auto magic = images.read_u32("the magic number"); magic != images_magic)
    fail(images.path(), "not an IDX image file (magic number " + std::to_string(magic) + ", expected 2051)");
  const std::size_t count = images.read_u32("the image count");
  if (count > max_count) fail(images.path(), "damaged: the header announces " + std::to_string(count) + " images");
  set.rows = images.read_u32("the row count");
  set.cols = images.read_u32("the column count");
  if (set.rows != side || set.cols != side)
    fail(images.path(), "images are " + std::to_string(set.rows) + "x" + std::to_string(set.cols) + ", expected 28x28");

  GzFile labels(locate(dir, name + "-labels-idx1-ubyte"));
  if (const auto magic = labels.read_u32("the magic number"); magic != labels_magic)
    fail(labels.path(), "not an IDX label file (magic number " + std::to_string(magic) + ", expected 2049)");
  if (const std::size_t n = labels.read_u32("the label count"); n != count)
    fail(labels.path(), std::to_string(n) + " labels for " + std::to_string(count) + " images in " + images.path());

  // Read everything (so that damage anywhere is found), keep the first `limit`.
  set.pixels.resize(count * side * side);
  set.labels.resize(count);
  images.read(set.pixels.data(), set.pixels.size(), "the pixels");
  images.expect_end();
  labels.read(set.labels.data(), set.labels.size(), "the labels");
  labels.expect_end();
  for (std::size_t i = 0; i < count; ++i)
    if (set.labels[i] > 9)
      fail(labels.path(),
           "label " + std::to_string(set.labels[i]) + " of sample " + std::to_string(i) + " is not a class (0..9)");
  set.count = limit ? std::min(limit, count) : count;
  set.pixels.resize(set.count * side * side);
  set.labels.resize(set.count);
  return set;
}

}  // namespace tutti::train
