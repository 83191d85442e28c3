// Gloo's collectives behind GlooPeer. Compiled with TUTTI_WITH_GLOO when CMake finds Gloo
// (tools/bench/gloo.cmake); without it, available() is false and every other member throws.
//
// Gloo's best configuration on one host: the "new-style" free functions gloo::allreduce,
// allgather and broadcast over unbound buffers on the TCP transport (what PyTorch's
// ProcessGroupGloo calls). They wait on a condition variable while one epoll thread per device
// moves the bytes: no busy-polling, so more ranks than cores still run. Gloo's pair sync mode
// (with or without busy-poll) is not an option: these collectives reject it (enforce !sync_).
// Allreduce: Gloo's default is its ring; its BCUBE algorithm measured 2-4x faster below 4 MiB on
// loopback (2 to 8 ranks, 2 cores) and within noise of ring above, so small messages use BCUBE
// and large ones ring, Gloo's best at each size.
#include "gloo_peer.hpp"

#include <stdexcept>
#include <string>

#ifdef TUTTI_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>
#endif

namespace tutti::bench {

#ifdef TUTTI_WITH_GLOO

namespace {

using ReduceFunction = void (*)(void*, const void*, const void*, std::size_t);

// Below this many bytes per rank allreduce runs BCUBE, from it ring (see the top of the file).
constexpr std::size_t bcube_below_bytes = std::size_t{4} << 20;

// Gloo's FileStore waits its fixed 30 s default when asked without a timeout, as get() and
// connectFullMesh ask; this store passes our deadline to every wait, so a rank that never comes makes the
// others throw after `timeout` instead of Gloo's fixed delay.
class DeadlineStore final : public gloo::rendezvous::Store {
 public:
  DeadlineStore(const std::string& directory, std::chrono::milliseconds timeout)
      : store_(directory), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    store_.wait({key}, timeout_);
    return store_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, std::min(timeout, timeout_));
  }

 private:
  gloo::rendezvous::FileStore store_;
  std::chrono::milliseconds timeout_;
};

// Gloo's float16 arithmetic calls converters that Debian's libgloo does not export, so half
// precision reduces through Tutti's converters instead: the same float round trip Gloo's scalar
// (non-AVX, as Debian builds it) path makes.
template <class Combine>
void reduce_f16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const float value = Combine{}(detail::f16_bits_to_float(x[i]), detail::f16_bits_to_float(y[i]));
    out[i] = detail::float_to_f16_bits(value);
  }
}

struct Plus {
  float operator()(float a, float b) const { return a + b; }
};
struct Times {
  float operator()(float a, float b) const { return a * b; }
};
struct Min {
  float operator()(float a, float b) const { return b < a ? b : a; }
};
struct Max {
  float operator()(float a, float b) const { return a < b ? b : a; }
};

template <class T>
ReduceFunction reduce_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return &gloo::sum<T>;
    case ReduceOp::prod:
      return &gloo::product<T>;
    case ReduceOp::min:
      return &gloo::min<T>;
    case ReduceOp::max:
      return &gloo::max<T>;
    default:
      return nullptr;  // avg: Gloo has no average
  }
}

// Gloo's reduction for (type, op), or null where Gloo has none (bf16, avg).
ReduceFunction reduce_function(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::i8:
      return reduce_of<std::int8_t>(op);
    case DataType::u8:
      return reduce_of<std::uint8_t>(op);
    case DataType::i32:
      return reduce_of<std::int32_t>(op);
    case DataType::u32:
      return reduce_of<std::uint32_t>(op);
    case DataType::i64:
      return reduce_of<std::int64_t>(op);
    case DataType::u64:
      return reduce_of<std::uint64_t>(op);
    case DataType::f32:
      return reduce_of<float>(op);
    case DataType::f64:
      return reduce_of<double>(op);
    case DataType::f16:
      switch (op) {
        case ReduceOp::sum:
          return &reduce_f16<Plus>;
        case ReduceOp::prod:
          return &reduce_f16<Times>;
        case ReduceOp::min:
          return &reduce_f16<Min>;
        case ReduceOp::max:
          return &reduce_f16<Max>;
        default:
          return nullptr;
      }
    default:
      return nullptr;  // bf16
  }
}

// Element size for the types Gloo moves; 0 for bf16, which Gloo has no type for.
std::size_t element_size(DataType type) { return type == DataType::bf16 ? 0 : size_of(type); }

// Gloo sizes buffers in elements of a C++ type; a byte type of the right width carries any of ours.
template <std::size_t Bytes>
struct Element {
  unsigned char bytes[Bytes];
};

}  // namespace

struct GlooPeer::State {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds timeout;
};

bool GlooPeer::available() { return true; }

GlooPeer::GlooPeer(int rank, int size, const std::string& directory, std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::runtime_error("gloo peer: rank " + std::to_string(rank) + " of " + std::to_string(size) + " is invalid");
  try {
    gloo::transport::tcp::attr attr;
    // This host's address where the job spans hosts (TUTTI_TCP_HOST, as Tutti's own TCP takes it).
    const char* host = std::getenv("TUTTI_TCP_HOST");
    attr.hostname = host != nullptr && *host != '\0' ? host : "127.0.0.1";
    attr.ai_family = AF_INET;
    state_->device = gloo::transport::tcp::CreateDevice(attr);
    state_->timeout = timeout;
    state_->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    state_->context->setTimeout(timeout);  // connecting the pairs and every collective
    DeadlineStore store(directory, timeout);
    state_->context->connectFullMesh(store, state_->device);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("gloo peer: rendezvous in ") + directory + " failed on rank " +
                             std::to_string(rank) + ": " + e.what());
  }
}

GlooPeer::~GlooPeer() = default;

bool GlooPeer::supports(std::string_view collective, DataType type, ReduceOp op) const {
  if (collective == "allreduce") return reduce_function(type, op) != nullptr;
  if (collective == "allgather" || collective == "broadcast") return element_size(type) != 0;
  return false;
}

namespace {

template <std::size_t Bytes>
void run_sized(const std::shared_ptr<gloo::Context>& shared, std::chrono::milliseconds timeout,
               std::string_view collective, const void* send, void* recv, std::size_t count, ReduceFunction reduce,
               int root) {
  using T = Element<Bytes>;
  const gloo::Context& context = *shared;
  auto* in = static_cast<T*>(const_cast<void*>(send));  // Gloo reads its input through a non-const pointer
  auto* out = static_cast<T*>(recv);
  if (collective == "allreduce") {
    gloo::AllreduceOptions opts(shared);
    opts.setAlgorithm(count * Bytes < bcube_below_bytes ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                        : gloo::AllreduceOptions::Algorithm::RING);
    if (in != out) opts.setInput(in, count);  // without an input, Gloo reduces the output in place
    opts.setOutput(out, count);
    opts.setReduceFunction(reduce);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  } else if (collective == "allgather") {
    gloo::AllgatherOptions opts(shared);
    // In place (this rank's block already in recv) is Gloo's allgather without an input.
    if (in != out && in != out + static_cast<std::size_t>(context.rank) * count) opts.setInput(in, count);
    opts.setOutput(out, count * static_cast<std::size_t>(context.size));
    opts.setTimeout(timeout);
    gloo::allgather(opts);
  } else {
    gloo::BroadcastOptions opts(shared);
    opts.setOutput(out, count);
    opts.setRoot(root);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  }
}

}  // namespace

void GlooPeer::run(std::string_view collective, const void* send, void* recv, std::size_t count, DataType type,
                   ReduceOp op, int root) {
  if (!supports(collective, type, op))
    throw std::runtime_error("gloo peer: no " + std::string(collective) + " for " + std::string(to_string(type)) +
                             (collective == "allreduce" ? " " + std::string(to_string(op)) : std::string()));
  const std::shared_ptr<gloo::Context> shared = state_->context;
  const gloo::Context& context = *shared;
  if (collective == "broadcast" && (root < 0 || root >= context.size))
    throw std::runtime_error("gloo peer: broadcast root " + std::to_string(root) + " is not a rank");
  if (count == 0) return;  // Gloo rejects empty buffers; there is nothing to move
  const ReduceFunction reduce = collective == "allreduce" ? reduce_function(type, op) : nullptr;
  try {
    switch (element_size(type)) {
      case 1:
        run_sized<1>(shared, state_->timeout, collective, send, recv, count, reduce, root);
        break;
      case 2:
        run_sized<2>(shared, state_->timeout, collective, send, recv, count, reduce, root);
        break;
      case 4:
        run_sized<4>(shared, state_->timeout, collective, send, recv, count, reduce, root);
        break;
      default:
        run_sized<8>(shared, state_->timeout, collective, send, recv, count, reduce, root);
        break;
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("gloo peer: " + std::string(collective) + " on rank " + std::to_string(context.rank) +
                             " failed: " + e.what());
  }
}

#else  // no Gloo in this build

namespace {

[[noreturn]] void no_gloo() {
  throw std::runtime_error("gloo peer: this build has no Gloo (install libgloo-dev and reconfigure)");
}

}  // namespace

struct GlooPeer::State {};

bool GlooPeer::available() { return false; }

GlooPeer::GlooPeer(int, int, const std::string&, std::chrono::milliseconds) { no_gloo(); }

GlooPeer::~GlooPeer() = default;

bool GlooPeer::supports(std::string_view, DataType, ReduceOp) const { no_gloo(); }

void GlooPeer::run(std::string_view, const void*, void*, std::size_t, DataType, ReduceOp, int) { no_gloo(); }

#endif

}  // namespace tutti::bench
