// GradientCompressor::save_state and load_state (include/tutti/compress.hpp).
//
//   shared: "TCS1", text compression, u64 step, u64 n, n x (text name, u64 rows, u64 cols,
//           u64 k, f32[k] Q)                          (Q: PowerSGD's tensors only)
//   local:  "TCL1", text compression, u64 n, n x (text name, u64 k, f32[k] residual)
//
// text: u64 length, then the bytes. Numbers in the host's byte order (the job's machines share
// it, as the checkpoints' shards assume).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

constexpr char shared_magic[4] = {'T', 'C', 'S', '1'};
constexpr char local_magic[4] = {'T', 'C', 'L', '1'};

class Out {
 public:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void text(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void floats(std::span<const float> v) {
    u64(v.size());
    raw(v.data(), v.size_bytes());
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class In {
 public:
  In(std::span<const std::byte> bytes, const char* what) : bytes_(bytes), what_(what) {}
  void raw(void* p, std::size_t n) {
    if (n > bytes_.size() - at_) fail("it ends early");
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    raw(&v, sizeof v);
    return v;
  }
  std::string text() {
    const std::uint64_t n = u64();
    if (n > bytes_.size() - at_) fail("a text is longer than what is left");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  std::vector<float> floats() {
    const std::uint64_t n = u64();
    if (n > (bytes_.size() - at_) / sizeof(float)) fail("a tensor is longer than what is left");
    std::vector<float> v(n);
    raw(v.data(), n * sizeof(float));
    return v;
  }
  void header(const char (&magic)[4], const Compression& compression) {
    char m[4];
    raw(m, 4);
    if (std::memcmp(m, magic, 4) != 0) fail("it is not a compressor's state");
    const std::string written = text();
    if (written != compression.to_string())
      fail("it was written by compression " + written + ", this compressor is " + compression.to_string());
  }
  void end() {
    if (at_ != bytes_.size()) fail(std::to_string(bytes_.size() - at_) + " bytes follow its end");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::invalid_argument, std::string("GradientCompressor::load_state: the ") + what_ + " state (" +
                                                 std::to_string(bytes_.size()) + " bytes) is refused: " + why);
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
  const char* what_;
};

template <class Map>
std::vector<typename Map::const_pointer> in_name_order(const Map& map) {
  std::vector<typename Map::const_pointer> items;
  for (const auto& item : map) items.push_back(&item);
  std::sort(items.begin(), items.end(), [](auto a, auto b) { return a->first < b->first; });
  return items;
}

}  // namespace

CompressorState GradientCompressor::save_state() const {
  Out shared, local;
  shared.raw(shared_magic, 4);
  shared.text(compression_.to_string());
  shared.u64(step_);
  local.raw(local_magic, 4);
  local.text(compression_.to_string());
  if (power_) {
    const auto states = in_name_order(power_->states_);
    shared.u64(states.size());
    local.u64(states.size());
    for (const auto* s : states) {
      shared.text(s->first);
      shared.u64(s->second.rows);
      shared.u64(s->second.cols);
      shared.floats(s->second.q);
      local.text(s->first);
      local.floats(s->second.residual);
    }
  } else {
    shared.u64(0);
    const auto residuals = in_name_order(feedback_.residuals_);
    local.u64(residuals.size());
    for (const auto* r : residuals) {
      local.text(r->first);
      local.floats(r->second);
    }
  }
  return {shared.take(), local.take()};
}

void GradientCompressor::load_state(std::span<const std::byte> shared_bytes, std::span<const std::byte> local_bytes) {
  // Everything is read and checked before anything changes.
  In shared(shared_bytes, "shared");
  shared.header(shared_magic, compression_);
  const std::uint64_t step = shared.u64();
  std::unordered_map<std::string, PowerSgd::State> states;
  for (std::uint64_t n = shared.u64(), i = 0; i < n; ++i) {
    std::string name = shared.text();
    PowerSgd::State s;
    s.rows = shared.u64();
    s.cols = shared.u64();
    s.q = shared.floats();
    const std::uint64_t r =
        power_ ? std::min<std::uint64_t>({static_cast<std::uint64_t>(power_->rank_), s.rows, s.cols}) : 0;
    if (!power_ || s.rows == 0 || s.cols == 0 || s.rows > (std::uint64_t{1} << 40) / s.cols || s.q.size() != s.cols * r)
      shared.fail("tensor '" + name + "' is not a PowerSGD state of rank " +
                  std::to_string(power_ ? power_->rank_ : 0));
    s.residual.assign(s.rows * s.cols, 0.0f);  // a rank without its own starts from zero
    if (!states.emplace(std::move(name), std::move(s)).second) shared.fail("a tensor is in it twice");
  }
  shared.end();
  std::unordered_map<std::string, std::vector<float>> residuals;
  if (!local_bytes.empty()) {
    In local(local_bytes, "local");
    local.header(local_magic, compression_);
    for (std::uint64_t n = local.u64(), i = 0; i < n; ++i) {
      std::string name = local.text();
      std::vector<float> residual = local.floats();
      if (power_) {
        const auto it = states.find(name);
        if (it == states.end() || residual.size() != it->second.residual.size())
          local.fail("the residual of '" + name + "' fits no tensor of the shared state");
        it->second.residual = std::move(residual);
      } else if (!residuals.emplace(std::move(name), std::move(residual)).second) {
        local.fail("a tensor is in it twice");
      }
    }
    local.end();
  }
  step_ = step;
  if (power_) power_->states_ = std::move(states);
  feedback_.residuals_ = std::move(residuals);
}

}  // namespace tutti::compress
