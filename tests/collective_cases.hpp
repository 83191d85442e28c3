// The collective sweep's cases and one rank's part of a case: shared by the in-process suite
// (ranks are threads) and the multi-process one (ranks are processes under tutti-run).
// Inputs are integer-valued so results are exact; outputs are poisoned before the call; every
// element of every rank's output is compared with a reference computed from the definition.
#pragma once

#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "harness.hpp"
#include "schedule/schedule.hpp"

namespace tutti::testing {

struct Case {
  Collective collective;
  Algorithm algorithm;
  DataType type;
  ReduceOp op;
  int p;
  std::size_t count;
  int place;  // 0: out of place; 1: in place (NCCL form); 2: in place (MPI form, where it differs)
  int root;
  bool nonblocking;
  bool shared = false;  // buffers from Communicator::allocate (zero copy on shm)
};

inline std::string name_of(const Case& c) {
  std::ostringstream s;
  s << to_string(c.collective) << "_" << to_string(c.algorithm) << "_" << to_string(c.type) << "_" << to_string(c.op)
    << "_p" << c.p << "_n" << c.count << "_place" << c.place << "_root" << c.root << (c.nonblocking ? "_nb" : "_b")
    << (c.shared ? "_shared" : "");
  return s.str();
}

inline bool is_reduction(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
}

inline bool is_rooted(Collective c) {
  return c == Collective::reduce || c == Collective::broadcast || c == Collective::gather || c == Collective::scatter;
}

// Per-rank counts of the v-collectives: irregular, with zeros, the same rule on every rank.
inline std::size_t v_count(std::size_t count, int from, int to) {
  const std::size_t k = static_cast<std::size_t>(from * 3 + to * 5) % 4;
  return k == 0 ? 0 : count + k;
}
constexpr std::size_t v_stride = 100000;  // element index base of block (from, to) in alltoallv

// A typed buffer of n elements, poisoned.
// n elements and a poisoned byte past them; from `shared`->allocate if given, else the heap.
struct Buffer {
  Buffer(DataType type, std::size_t n, const Communicator* shared = nullptr) : elem(size_of(type)), size(n * elem + 1) {
    if (shared != nullptr) {
      memory = shared->allocate(size);
      data = reinterpret_cast<unsigned char*>(memory.data());
    } else {
      plain.resize(size);
      data = plain.data();
    }
    std::memset(data, poison, size);
  }
  void* at(std::size_t i) { return data + i * elem; }
  unsigned char last() const { return data[size - 1]; }
  std::size_t elem, size;
  unsigned char* data = nullptr;
  std::vector<unsigned char> plain;
  SharedBuffer memory;
};

// Fills [first, first+n) of `b` with rank's values at element indices base + j.
inline void fill(Buffer& b, const Case& c, int rank, std::size_t first, std::size_t n, std::size_t base) {
  for (std::size_t j = 0; j < n; ++j) store(c.type, b.at(first + j), input_value(c.type, c.op, rank, base + j));
}

// Compares [first, first+n) of `b` with the expected values; returns a description of the first difference.
inline std::string compare(Buffer& b, const Case& c, std::size_t first, std::size_t n,
                           const std::function<double(std::size_t)>& expected) {
  std::vector<unsigned char> want(b.elem);
  for (std::size_t j = 0; j < n; ++j) {
    store(c.type, want.data(), expected(j));
    if (std::memcmp(want.data(), b.at(first + j), b.elem) != 0) {
      std::size_t wrong = 0;
      for (std::size_t k = j; k < n; ++k) {
        store(c.type, want.data(), expected(k));
        wrong += std::memcmp(want.data(), b.at(first + k), b.elem) != 0;
      }
      return "element " + std::to_string(first + j) + " differs (expected " + std::to_string(expected(j)) + "); " +
             std::to_string(wrong) + " of " + std::to_string(n) + " wrong";
    }
  }
  if (b.last() != poison) return "wrote past the end of the buffer";
  return {};
}

inline void finish(Request request, bool nonblocking) {
  if (!nonblocking) return;
  while (!request.test()) request.wait_for(std::chrono::milliseconds(50));
}

// Runs one rank's part of the case and returns "" or what was wrong.
inline std::string run_rank(Communicator& comm, const Case& c) {
  const int r = comm.rank(), p = comm.size();
  const auto up = static_cast<std::size_t>(p), n = c.count;
  const Options options{c.algorithm, test_timeout};
  const auto ref = [&](std::size_t base) {
    return [&, base](std::size_t j) { return reference_reduction(c.type, c.op, p, base + j); };
  };
  const auto value_of = [&](int rank, std::size_t base) {
    return [&, rank, base](std::size_t j) { return input_value(c.type, c.op, rank, base + j); };
  };
  auto call = [&](auto&& blocking, auto&& nonblocking) {
    if (c.nonblocking)
      finish(nonblocking(), true);
    else
      blocking();
  };
  const Communicator* shared = c.shared ? &comm : nullptr;
  switch (c.collective) {
    case Collective::allreduce: {
      Buffer in(c.type, n, shared), out(c.type, n, shared);
      fill(in, c, r, 0, n, 0);
      Buffer& result = c.place ? in : out;
      call([&] { comm.allreduce(in.at(0), result.at(0), n, c.type, c.op, options); },
           [&] { return comm.iallreduce(in.at(0), result.at(0), n, c.type, c.op, options); });
      return compare(result, c, 0, n, ref(0));
    }
    case Collective::reduce: {
      Buffer in(c.type, n), out(c.type, n);
      fill(in, c, r, 0, n, 0);
      Buffer& result = c.place && r == c.root ? in : out;
      void* recv = r == c.root ? result.at(0) : nullptr;
      call([&] { comm.reduce(in.at(0), recv, n, c.type, c.op, c.root, options); },
           [&] { return comm.ireduce(in.at(0), recv, n, c.type, c.op, c.root, options); });
      if (r != c.root) return "";  // recv is null off the root: nothing to check
      return compare(result, c, 0, n, ref(0));
    }
    case Collective::reduce_scatter: {
      Buffer in(c.type, up * n, shared), out(c.type, n, shared);
      fill(in, c, r, 0, up * n, 0);
      void* recv = c.place == 1 ? in.at(r * n) : c.place == 2 ? in.at(0) : out.at(0);
      call([&] { comm.reduce_scatter(in.at(0), recv, n, c.type, c.op, options); },
           [&] { return comm.ireduce_scatter(in.at(0), recv, n, c.type, c.op, options); });
      if (c.place == 0) return compare(out, c, 0, n, ref(r * n));
      return compare(in, c, c.place == 1 ? r * n : 0, n, ref(r * n));
    }
    case Collective::allgather: {
      Buffer in(c.type, n, shared), out(c.type, up * n, shared);
      fill(in, c, r, 0, n, 0);
      const void* send = in.at(0);
      if (c.place) {
        fill(out, c, r, r * n, n, 0);
        send = c.place == 1 ? out.at(r * n) : out.at(0);
      }
      call([&] { comm.allgather(send, out.at(0), n, c.type, options); },
           [&] { return comm.iallgather(send, out.at(0), n, c.type, options); });
      for (int q = 0; q < p; ++q)
        if (auto e = compare(out, c, q * n, n, value_of(q, 0)); !e.empty())
          return "block " + std::to_string(q) + ": " + e;
      return "";
    }
    case Collective::allgatherv: {
      std::vector<std::size_t> counts(up);
      for (int q = 0; q < p; ++q) counts[q] = v_count(n, q, 0);
      std::vector<std::size_t> displ(up + 1, 0);
      std::partial_sum(counts.begin(), counts.end(), displ.begin() + 1);
      Buffer in(c.type, counts[r]), out(c.type, displ[up]);
      fill(in, c, r, 0, counts[r], 0);
      const void* send = in.at(0);
      if (c.place) {
        fill(out, c, r, displ[r], counts[r], 0);
        send = c.place == 1 ? out.at(displ[r]) : out.at(0);
      }
      call([&] { comm.allgatherv(send, counts[r], out.at(0), counts, c.type, options); },
           [&] { return comm.iallgatherv(send, counts[r], out.at(0), counts, c.type, options); });
      for (int q = 0; q < p; ++q)
        if (auto e = compare(out, c, displ[q], counts[q], value_of(q, 0)); !e.empty())
          return "block " + std::to_string(q) + ": " + e;
      return "";
    }
    case Collective::broadcast: {
      Buffer buffer(c.type, n, shared);
      if (r == c.root) fill(buffer, c, r, 0, n, 0);
      call([&] { comm.broadcast(buffer.at(0), n, c.type, c.root, options); },
           [&] { return comm.ibroadcast(buffer.at(0), n, c.type, c.root, options); });
      return compare(buffer, c, 0, n, value_of(c.root, 0));
    }
    case Collective::alltoall: {
      Buffer in(c.type, up * n), out(c.type, up * n);
      fill(in, c, r, 0, up * n, 0);
      Buffer& result = c.place ? in : out;
      call([&] { comm.alltoall(in.at(0), result.at(0), n, c.type, options); },
           [&] { return comm.ialltoall(in.at(0), result.at(0), n, c.type, options); });
      for (int q = 0; q < p; ++q)
        if (auto e = compare(result, c, q * n, n, value_of(q, r * n)); !e.empty())
          return "block " + std::to_string(q) + ": " + e;
      return "";
    }
    case Collective::alltoallv: {
      std::vector<std::size_t> send_counts(up), recv_counts(up);
      for (int q = 0; q < p; ++q) {
        send_counts[q] = v_count(n, r, q);
        recv_counts[q] = v_count(n, q, r);
      }
      std::vector<std::size_t> sd(up + 1, 0), rd(up + 1, 0);
      std::partial_sum(send_counts.begin(), send_counts.end(), sd.begin() + 1);
      std::partial_sum(recv_counts.begin(), recv_counts.end(), rd.begin() + 1);
      if (c.place) {  // in place needs the same layout both ways: use recv_counts == send_counts
        for (int q = 0; q < p; ++q) send_counts[q] = recv_counts[q] = v_count(n, std::min(r, q), std::max(r, q));
        std::partial_sum(send_counts.begin(), send_counts.end(), sd.begin() + 1);
        rd = sd;
      }
      Buffer in(c.type, sd[up]), out(c.type, rd[up]);
      for (int q = 0; q < p; ++q) fill(in, c, r, sd[q], send_counts[q], q * v_stride);
      Buffer& result = c.place ? in : out;
      call([&] { comm.alltoallv(in.at(0), send_counts, result.at(0), recv_counts, c.type, options); },
           [&] { return comm.ialltoallv(in.at(0), send_counts, result.at(0), recv_counts, c.type, options); });
      for (int q = 0; q < p; ++q)
        if (auto e = compare(result, c, rd[q], recv_counts[q], value_of(q, r * v_stride)); !e.empty())
          return "block " + std::to_string(q) + ": " + e;
      return "";
    }
    case Collective::gather: {
      Buffer in(c.type, n, shared), out(c.type, up * n, shared);
      fill(in, c, r, 0, n, 0);
      const void* send = in.at(0);
      if (c.place && r == c.root) {
        fill(out, c, r, r * n, n, 0);
        send = out.at(r * n);
      }
      void* recv = r == c.root ? out.at(0) : nullptr;
      call([&] { comm.gather(send, recv, n, c.type, c.root, options); },
           [&] { return comm.igather(send, recv, n, c.type, c.root, options); });
      if (r != c.root) return "";
      for (int q = 0; q < p; ++q)
        if (auto e = compare(out, c, q * n, n, value_of(q, 0)); !e.empty())
          return "block " + std::to_string(q) + ": " + e;
      return "";
    }
    case Collective::scatter: {
      Buffer in(c.type, up * n), out(c.type, n);
      if (r == c.root) fill(in, c, r, 0, up * n, 0);
      void* recv = c.place && r == c.root ? in.at(r * n) : out.at(0);
      const void* send = r == c.root ? in.at(0) : nullptr;
      call([&] { comm.scatter(send, recv, n, c.type, c.root, options); },
           [&] { return comm.iscatter(send, recv, n, c.type, c.root, options); });
      if (c.place && r == c.root) return compare(in, c, r * n, n, value_of(c.root, r * n));
      return compare(out, c, 0, n, value_of(c.root, r * n));
    }
    case Collective::barrier:
      return "";  // see BarrierTest
  }
  return "unknown collective";
}

inline std::vector<Algorithm> algorithms_with_automatic(Collective c) {
  auto out = schedule::algorithms_for(c);
  out.insert(out.begin(), Algorithm::automatic);
  return out;
}

inline std::vector<int> places_of(Collective c) {
  switch (c) {
    case Collective::broadcast:
    case Collective::barrier:
      return {0};
    case Collective::reduce_scatter:
    case Collective::allgather:
    case Collective::allgatherv:
      return {0, 1, 2};
    default:
      return {0, 1};
  }
}

inline constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                         DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
inline constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

inline const std::vector<Collective> data_collectives = {
    Collective::allreduce,  Collective::reduce,    Collective::reduce_scatter, Collective::allgather,
    Collective::allgatherv, Collective::broadcast, Collective::alltoall,       Collective::alltoallv,
    Collective::gather,     Collective::scatter};

// Every collective × algorithm × p × count {0, 1, p−1, p+1} × in place/out of place, f32 sum.
inline std::vector<Case> sweep_cases(std::initializer_list<int> sizes = {1, 2, 3, 4, 5, 7, 8}) {
  std::vector<Case> cases;
  for (Collective coll : data_collectives)
    for (Algorithm a : algorithms_with_automatic(coll))
      for (int p : sizes)
        for (std::size_t n : std::set<std::size_t>{0, 1, std::size_t(p - 1), std::size_t(p + 1)})
          for (int place : places_of(coll)) {
            const auto up = static_cast<std::size_t>(p), shift = n + static_cast<std::size_t>(place);
            const int root = p > 1 ? static_cast<int>(shift % up) : 0;
            cases.push_back({coll, a, DataType::f32, ReduceOp::sum, p, n, place, root, shift % 2 == 1});
          }
  return cases;
}

// Every type × op for the reductions (every algorithm), and every type for the others.
inline std::vector<Case> type_cases() {
  std::vector<Case> cases;
  for (DataType t : all_types) {
    for (Collective coll : data_collectives) {
      if (is_reduction(coll)) {
        for (Algorithm a : schedule::algorithms_for(coll))
          for (ReduceOp op : all_ops)
            for (int p : {3, 8}) cases.push_back({coll, a, t, op, p, 37, p == 8 ? 1 : 0, 1, p == 8});
      } else {
        cases.push_back({coll, Algorithm::automatic, t, ReduceOp::sum, 5, 13, 0, 2, false});
      }
    }
  }
  return cases;
}

// A large prime count, every algorithm, at p = 3 and 8 (alltoall and gather-type: p = 3).
inline std::vector<Case> large_cases() {
  std::vector<Case> cases;
  constexpr std::size_t prime = 1000003;
  for (Collective coll : data_collectives)
    for (Algorithm a : schedule::algorithms_for(coll))
      for (int p : {3, 8}) {
        const bool full_exchange = coll == Collective::alltoall || coll == Collective::alltoallv ||
                                   coll == Collective::allgather || coll == Collective::allgatherv ||
                                   coll == Collective::reduce_scatter || coll == Collective::gather ||
                                   coll == Collective::scatter;
        if (full_exchange && p == 8) continue;
        cases.push_back({coll, a, DataType::f32, ReduceOp::sum, p, prime, p == 8 ? 1 : 0, p - 1, p == 3});
      }
  return cases;
}

// `automatic` at a count between the small and the large cases (20011 elements: what shared
// memory runs as direct in chunks, or single-copy for allgather and broadcast), every collective,
// every place, blocking and nonblocking.
inline std::vector<Case> mid_cases(std::initializer_list<int> sizes) {
  std::vector<Case> cases;
  for (Collective coll : data_collectives)
    for (int p : sizes)
      for (int place : places_of(coll))
        cases.push_back(
            {coll, Algorithm::automatic, DataType::f32, ReduceOp::sum, p, 20011, place, p - 1, place % 2 == 1});
  return cases;
}

}  // namespace tutti::testing
