// The nccl backend (nccl.hpp), built with the CUDA toolkit's nccl.h; libnccl.so.2 is loaded at run
// time. Operation n on stream S: write_value(reached, n); the NCCL call(s); write_value(done, n).
// Its watchdog (watchdog.hpp) compares each operation's call across ranks, then follows `done`.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "core/env.hpp"
#include "gpu/nccl.hpp"
#include "gpu/verdict.hpp"
#include "gpu/watchdog.hpp"

namespace tutti::gpu::detail {

namespace {

// The NCCL entry points Tutti uses, from libnccl.so.2.
struct Api {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

// The API, or nullptr with `why` when libnccl.so.2 (or a symbol of it) is missing.
const Api* load_api(std::string& why) {
  static std::string failure;
  static const Api* api = []() -> const Api* {
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      failure = std::string("cannot load libnccl.so.2: ") + dlerror();
      return nullptr;
    }
    static Api loaded;
    const auto find = [&](auto& entry, const char* name) {
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
      if (entry == nullptr && failure.empty()) failure = std::string("libnccl.so.2 has no ") + name;
    };
    find(loaded.get_unique_id, "ncclGetUniqueId");
    find(loaded.init_rank, "ncclCommInitRank");
    find(loaded.abort, "ncclCommAbort");
    find(loaded.destroy, "ncclCommDestroy");
    find(loaded.async_error, "ncclCommGetAsyncError");
    find(loaded.error_string, "ncclGetErrorString");
    find(loaded.all_reduce, "ncclAllReduce");
    find(loaded.reduce, "ncclReduce");
    find(loaded.broadcast, "ncclBroadcast");
    find(loaded.all_gather, "ncclAllGather");
    find(loaded.reduce_scatter, "ncclReduceScatter");
    find(loaded.send, "ncclSend");
    find(loaded.recv, "ncclRecv");
    find(loaded.group_start, "ncclGroupStart");
    find(loaded.group_end, "ncclGroupEnd");
    return failure.empty() ? &loaded : nullptr;
  }();
  why = failure;
  return api;
}

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::i8:
      return ncclInt8;
    case DataType::u8:
      return ncclUint8;
    case DataType::i32:
      return ncclInt32;
    case DataType::u32:
      return ncclUint32;
    case DataType::i64:
      return ncclInt64;
    case DataType::u64:
      return ncclUint64;
    case DataType::f16:
      return ncclFloat16;
    case DataType::bf16:
      return ncclBfloat16;
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
  }
  return ncclUint8;
}

// avg is a sum here, divided afterwards by the device's divide (Tutti's rounding, not NCCL's).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::prod:
      return ncclProd;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    default:
      return ncclSum;
  }
}

ErrorCode code_of(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return ErrorCode::invalid_argument;
    case ncclRemoteError:
      return ErrorCode::peer_failure;
    default:
      return ErrorCode::system;
  }
}

class NcclBackend final : public Nccl, private Watchdog::Watched {
 public:
  NcclBackend(std::shared_ptr<device::Device> device, tutti::Communicator host, const Api& api)
      : device_(std::move(device)), host_(std::move(host)), api_(api), rank_(host_.rank()), size_(host_.size()) {
    scratch_ = device_->allocate(sizeof(std::int32_t));
    flags_ = static_cast<std::uint32_t*>(device_->allocate_pinned(2 * sizeof(std::uint32_t)));
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, scratch_) == cudaSuccess) cudaSetDevice(attributes.device);
    // Every rank learns which peers share its host (their pids are checked while it waits) and
    // its GPU: NCCL refuses two ranks on one GPU, so that is refused here, on every rank alike,
    // before NCCL is asked.
    struct Entry {
      char host[192] = {};
      char gpu[64] = {};
      std::int64_t pid = 0;
    } mine;
    std::snprintf(mine.host, sizeof(mine.host), "%s", host_identity().c_str());
    cudaDeviceGetPCIBusId(mine.gpu, sizeof(mine.gpu) - 1, attributes.device);
    mine.pid = getpid();
    std::vector<Entry> all(static_cast<std::size_t>(size_));
    host_.allgather(&mine, all.data(), sizeof(Entry), DataType::u8);
    for (const Entry& e : all)
      local_pids_.push_back(std::strncmp(e.host, mine.host, sizeof(mine.host)) == 0 ? e.pid : 0);
    for (int a = 0; a < size_; ++a)
      for (int b = a + 1; b < size_; ++b) {
        const Entry& x = all[static_cast<std::size_t>(a)];
        const Entry& y = all[static_cast<std::size_t>(b)];
        if (std::strncmp(x.host, y.host, sizeof(x.host)) == 0 && std::strncmp(x.gpu, y.gpu, sizeof(x.gpu)) == 0) {
          device_->free(scratch_);
          device_->free_pinned(flags_);
          throw Error(ErrorCode::unsupported, "tutti::gpu: the nccl backend is not available: ranks " +
                                                  std::to_string(a) + " and " + std::to_string(b) + " share one GPU (" +
                                                  std::string(x.gpu) + "), which NCCL refuses");
        }
      }
    ncclUniqueId id{};
    std::uint8_t ok = 1;
    if (rank_ == 0 && api_.get_unique_id(&id) != ncclSuccess) ok = 0;
    host_.broadcast(&id, sizeof(id), DataType::u8, 0);
    std::uint8_t all_ok = 0;
    host_.allreduce(&ok, &all_ok, 1, DataType::u8, ReduceOp::min);
    ncclResult_t result = ncclSystemError;
    if (all_ok) result = api_.init_rank(&comm_, size_, id, rank_);
    ok = result == ncclSuccess ? 1 : 0;
    host_.allreduce(&ok, &all_ok, 1, DataType::u8, ReduceOp::min);
    if (!all_ok) {
      if (result == ncclSuccess) api_.abort(comm_);
      device_->free(scratch_);
      device_->free_pinned(flags_);
      throw Error(ErrorCode::unsupported,
                  "tutti::gpu: the nccl backend is not available: NCCL could not make the communicator (rank " +
                      std::to_string(rank_) + ": " +
                      (result == ncclSuccess ? "another rank failed" : api_.error_string(result)) +
                      "; NCCL refuses two ranks on one GPU)");
    }
    watchdog_ = std::make_unique<Watchdog>(static_cast<Watchdog::Watched&>(*this), host_, local_pids_);
  }

  ~NcclBackend() override {
    watchdog_->stop();
    const bool idle = device::Device::load_flag(done()) == issued_;
    if (!aborted_.exchange(true)) {
      if (idle)
        api_.destroy(comm_);
      else
        api_.abort(comm_);  // operations in flight: their kernels return, the streams move on
    }
    // The scratch and the flags stay with the device when a stream may still touch them.
    if (idle) {
      device_->free(scratch_);
      device_->free(copy_.memory);
      for (const Retired& r : retired_) device_->free(r.memory);
      device_->free_pinned(flags_);
    }
  }

  bool serves(const DeviceCall& dc, std::string* why) const override {
    if (!collective_only(dc, why)) return false;
    const auto& c = dc.call;
    switch (c.collective) {
      case Collective::allreduce:
      case Collective::reduce:
      case Collective::broadcast:
      case Collective::allgather:
      case Collective::barrier:
        return true;
      case Collective::reduce_scatter:
        return (c.send != c.recv || size_ == 1) ||
               refuse(why, "NCCL has no reduce_scatter with its result at the start of send");
      case Collective::alltoall:  // in place through a copy of the input (NCCL has no alltoall in place)
        return true;
      default:
        return refuse(why, std::string(to_string(c.collective)) + " is not an nccl collective");
    }
  }

  void check() override { watchdog_->check(); }

  void enqueue(const DeviceCall& dc, device::Stream stream) override {
    check();
    const std::uint32_t n = issued_ + 1;
    device_->write_value(reached(), n, stream);  // the first enqueue checks the stream
    const void* input = in_place_input(dc, n, stream);
    const ncclResult_t result = issue(dc, input, static_cast<cudaStream_t>(stream.handle));
    if (result != ncclSuccess)
      throw Error(code_of(result), std::string("tutti::gpu: nccl ") + std::string(to_string(dc.call.collective)) +
                                       ": " + api_.error_string(result));
    const auto& c = dc.call;
    if (c.op && *c.op == ReduceOp::avg && (c.collective != Collective::reduce || rank_ == c.root))
      device_->divide(c.recv, c.count, c.type, size_, stream);  // Tutti's rounding, not NCCL's
    device_->write_value(done(), n, stream);
    issued_ = n;
    watchdog_->post(Operation{n, dc, n, n});
  }

 private:
  using Operation = Watchdog::Operation;

  std::uint32_t* reached() const { return flags_; }
  std::uint32_t* done() const { return flags_ + 1; }

  // Device memory that the operations up to `last` may use.
  struct Retired {
    void* memory = nullptr;
    std::uint32_t last = 0;
  };

  // An alltoall in place sends from a copy of its input, made on the stream into a buffer of the
  // backend's that grows to the largest such input. The stream first waits until the previous
  // operation that used the buffer is done; a buffer outgrown is freed once the operations that
  // used it are done (pool memory: its free waits for no stream). Returns what to send from.
  const void* in_place_input(const DeviceCall& dc, std::uint32_t n, device::Stream stream) {
    const auto& c = dc.call;
    const std::size_t bytes = c.count * size_of(c.type) * static_cast<std::size_t>(size_);
    if (c.collective != Collective::alltoall || c.send != c.recv || bytes == 0) return c.send;
    const std::uint32_t now = device::Device::load_flag(done());
    std::erase_if(retired_, [&](const Retired& r) {
      if (!device::Device::reached(now, r.last)) return false;
      device_->free(r.memory);
      return true;
    });
    if (bytes > copy_bytes_) {
      void* grown = device_->allocate(bytes);
      if (copy_.memory != nullptr) retired_.push_back(copy_);
      copy_ = Retired{grown, 0};
      copy_bytes_ = bytes;
    }
    if (copy_.last != 0 && copy_.last != n) device_->wait_value(done(), copy_.last, stream);  // n: a retry of n
    device_->copy(copy_.memory, c.send, bytes, stream);
    copy_.last = n;
    return copy_.memory;
  }

  ncclResult_t issue(const DeviceCall& dc, const void* input, cudaStream_t s) {
    const auto& c = dc.call;
    const ncclDataType_t type = nccl_type(c.type);
    const ncclRedOp_t op = nccl_op(c.op.value_or(ReduceOp::sum));
    const std::size_t bytes = c.count * size_of(c.type);
    const auto p = static_cast<std::size_t>(size_);
    auto* out = static_cast<std::byte*>(c.recv);
    switch (c.collective) {
      case Collective::allreduce:
        return api_.all_reduce(c.send, c.recv, c.count, type, op, comm_, s);
      case Collective::reduce:
        return api_.reduce(c.send, c.recv, c.count, type, op, c.root, comm_, s);
      case Collective::broadcast:
        return api_.broadcast(c.recv, c.recv, c.count, type, c.root, comm_, s);
      case Collective::allgather: {
        // In place as MPI_IN_PLACE (send == recv): NCCL's in-place form is its block's place.
        const void* send = c.send == c.recv ? out + static_cast<std::size_t>(rank_) * bytes : c.send;
        return api_.all_gather(send, c.recv, c.count, type, comm_, s);
      }
      case Collective::reduce_scatter:
        return api_.reduce_scatter(c.send, c.recv, c.count, type, op, comm_, s);
      case Collective::alltoall: {
        ncclResult_t result = api_.group_start();
        for (std::size_t j = 0; j < p && result == ncclSuccess; ++j) {
          result =
              api_.send(static_cast<const std::byte*>(input) + j * bytes, c.count, type, static_cast<int>(j), comm_, s);
          if (result == ncclSuccess) result = api_.recv(out + j * bytes, c.count, type, static_cast<int>(j), comm_, s);
        }
        const ncclResult_t ended = api_.group_end();
        return result != ncclSuccess ? result : ended;
      }
      case Collective::barrier:
        return api_.all_reduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, s);
      default:
        return ncclInvalidUsage;
    }
  }

  // What the watchdog asks (watchdog.hpp).
  std::string describe(const Operation& op) const override {
    return "nccl " + std::string(to_string(op.call.call.collective)) + " (operation " + std::to_string(op.n) + ")";
  }
  bool stream_reached(const Operation& op) const override {
    return device::Device::reached(device::Device::load_flag(reached()), op.n);
  }
  bool stream_done(const Operation& op) const override {
    return device::Device::reached(device::Device::load_flag(done()), op.n);
  }
  // NCCL's asynchronous error, while the watchdog follows an operation.
  std::optional<Error> noticed(const Operation* op) override {
    ncclResult_t async = ncclSuccess;
    if (op == nullptr || aborted_.load() || api_.async_error(comm_, &async) != ncclSuccess || async == ncclSuccess ||
        async == ncclInProgress)
      return std::nullopt;
    return Error(code_of(async), describe(*op) + ": " + api_.error_string(async));
  }
  void compared(const Operation&, bool) override {}
  std::string late(const Operation&) const override { return ""; }
  // Aborts the NCCL communicator: its pending kernels return, so every stream waiting in an NCCL
  // call moves on.
  void release(const Error&) override {
    if (!aborted_.exchange(true)) api_.abort(comm_);
  }
  bool follow_after_failure() const override { return false; }

  std::shared_ptr<device::Device> device_;
  tutti::Communicator host_;
  const Api& api_;
  int rank_ = 0, size_ = 1;
  std::vector<std::int64_t> local_pids_;  // 0 for a peer on another host
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;  // device memory: the barrier's allreduce
  Retired copy_;             // device memory: the input of an alltoall in place (in_place_input)
  std::size_t copy_bytes_ = 0;
  std::vector<Retired> retired_;    // outgrown copy_ buffers
  std::uint32_t* flags_ = nullptr;  // pinned: reached, done
  std::uint32_t issued_ = 0;        // host thread
  std::atomic<bool> aborted_{false};
  std::unique_ptr<Watchdog> watchdog_;  // last: its thread calls the above
};

}  // namespace

std::unique_ptr<Nccl> Nccl::create(std::shared_ptr<device::Device> device, tutti::Communicator host) {
  if (device->kind() != device::Kind::cuda)
    throw Error(ErrorCode::unsupported,
                "tutti::gpu: the nccl backend is not available: it needs a CUDA device (this "
                "communicator's is " +
                    std::string(device::to_string(device->kind())) + ")");
  std::string why;
  const Api* api = load_api(why);
  std::uint8_t ok = api != nullptr ? 1 : 0, all_ok = 0;
  host.allreduce(&ok, &all_ok, 1, DataType::u8, ReduceOp::min);
  if (!all_ok)
    throw Error(ErrorCode::unsupported, "tutti::gpu: the nccl backend is not available: " +
                                            (api == nullptr ? why : std::string("another rank cannot load NCCL")));
  return std::make_unique<NcclBackend>(std::move(device), std::move(host), *api);
}

}  // namespace tutti::gpu::detail
