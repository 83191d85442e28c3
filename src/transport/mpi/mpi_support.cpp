#include "transport/mpi/mpi_support.hpp"

#include <atomic>
#include <thread>
#include <vector>

#include "reduce/reduce.hpp"

namespace tutti::transport::mpi {

namespace {

// MPI_Query_thread's answer, read once (-1: not read yet). The level cannot change after MPI_Init.
std::atomic<int> thread_level{-1};

int provided_level() {
  int level = thread_level.load(std::memory_order_acquire);
  if (level < 0) {
    MPI_Query_thread(&level);
    thread_level.store(level, std::memory_order_release);
  }
  return level;
}

// f16 and bf16 travel as opaque 2-byte MPI types; their reductions are user-defined MPI_Ops that
// call Tutti's own kernels (MPI has no half types before MPI 4.1, and OpenMPI 4.1 none at all).
struct HalfTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Op ops[2][4] = {};  // [f16, bf16][sum, prod, min, max]
};

template <DataType Type, ReduceOp Op>
void half_reduction(void* in, void* inout, int* len, MPI_Datatype*) {
  // MPI asks for inout = in op inout; every op here is commutative.
  reduce::apply(Op, Type, inout, inout, in, static_cast<std::size_t>(*len));
}

template <DataType Type>
void create_ops(MPI_Op (&ops)[4]) {
  check(MPI_Op_create(&half_reduction<Type, ReduceOp::sum>, 1, &ops[0]), "MPI_Op_create");
  check(MPI_Op_create(&half_reduction<Type, ReduceOp::prod>, 1, &ops[1]), "MPI_Op_create");
  check(MPI_Op_create(&half_reduction<Type, ReduceOp::min>, 1, &ops[2]), "MPI_Op_create");
  check(MPI_Op_create(&half_reduction<Type, ReduceOp::max>, 1, &ops[3]), "MPI_Op_create");
}

// Created once per process, on first use (MPI must be initialized by then); never freed: MPI
// releases them at MPI_Finalize.
const HalfTypes& half_types() {
  static std::once_flag once;
  static HalfTypes types;
  std::call_once(once, [] {
    auto lock = serialize();
    for (MPI_Datatype* t : {&types.f16, &types.bf16}) {
      check(MPI_Type_contiguous(2, MPI_BYTE, t), "MPI_Type_contiguous");
      check(MPI_Type_commit(t), "MPI_Type_commit");
    }
    create_ops<DataType::f16>(types.ops[0]);
    create_ops<DataType::bf16>(types.ops[1]);
  });
  return types;
}

}  // namespace

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, const char* function) {
  if (code != MPI_SUCCESS) throw Error(ErrorCode::system, std::string(function) + " failed: " + error_string(code));
}

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void require_usable_mpi(const char* who) {
  if (!mpi_active())
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + ": MPI is not initialized (or already finalized); call MPI_Init_thread first");
  (void)provided_level();  // read while MPI is surely up
  (void)who;
  half_types();
}

bool caller_threads_only() { return provided_level() < MPI_THREAD_SERIALIZED; }

std::unique_lock<std::mutex> serialize() {
  static std::mutex process_wide;
  if (provided_level() >= MPI_THREAD_MULTIPLE) return {};
  return std::unique_lock(process_wide);
}

bool poll(std::span<MPI_Request> requests, std::chrono::steady_clock::time_point deadline, const char* what,
          const std::function<bool()>& stop) {
  using clock = std::chrono::steady_clock;
  const auto spin_until = clock::now() + std::chrono::microseconds(50);
  auto nap = std::chrono::microseconds(50);
  for (;;) {
    int flag = 0;
    {
      auto lock = serialize();
      check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE), what);
    }
    if (flag) return true;
    const auto now = clock::now();
    if (now >= deadline || (stop && stop())) return false;
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::min<clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

namespace {

struct Abandoned {
  std::mutex mutex;
  std::vector<std::pair<MPI_Request, std::shared_ptr<void>>> requests;
};

Abandoned& abandoned() {
  static Abandoned list;  // destroyed at exit, after MPI_Finalize
  return list;
}

}  // namespace

void abandon(MPI_Request request, std::shared_ptr<void> keep) {
  Abandoned& list = abandoned();
  std::lock_guard lock(list.mutex);
  list.requests.emplace_back(request, std::move(keep));
}

MPI_Datatype datatype(DataType type) {
  switch (type) {
    case DataType::i8:
      return MPI_INT8_T;
    case DataType::u8:
      return MPI_UINT8_T;
    case DataType::i32:
      return MPI_INT32_T;
    case DataType::u32:
      return MPI_UINT32_T;
    case DataType::i64:
      return MPI_INT64_T;
    case DataType::u64:
      return MPI_UINT64_T;
    case DataType::f16:
      return half_types().f16;
    case DataType::bf16:
      return half_types().bf16;
    case DataType::f32:
      return MPI_FLOAT;
    case DataType::f64:
      return MPI_DOUBLE;
  }
  throw Error(ErrorCode::invalid_argument, "MPI: type is not a valid DataType");
}

MPI_Op reduction(ReduceOp op, DataType type) {
  const int index = op == ReduceOp::avg ? 0 : static_cast<int>(op);
  if (index < 0 || index > 3) throw Error(ErrorCode::invalid_argument, "MPI: op is not a valid ReduceOp");
  if (type == DataType::f16 || type == DataType::bf16) return half_types().ops[type == DataType::f16 ? 0 : 1][index];
  static const MPI_Op builtin[4] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
  return builtin[index];
}

}  // namespace tutti::transport::mpi
