// Communicator's collectives for Python: each one prepares its call from Python buffers (shapes,
// types and in-place forms checked here, everything else by the C++ library), then one path runs
// it blocking or nonblocking (call.hpp). Counts come from the buffers, not from the caller.
#include "core/collectives.hpp"

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.hpp"
#include "core/call.hpp"
#include "core/names.hpp"

namespace tutti_python {

namespace {

using Comm = tutti::Communicator;
using Counts = std::vector<std::size_t>;

// The call being prepared: its name and communicator, for the roles of its arguments.
struct Site {
  const char* name;
  Comm& comm;
  Role role(const char* argument, bool output) const { return {name, argument, comm.rank(), output}; }
  std::size_t size() const { return static_cast<std::size_t>(comm.size()); }
  bool at(int root) const { return comm.rank() == root; }
  // Before dividing by size(): an empty communicator (a negative color in split) has none.
  void check_not_empty() const {
    if (comm.size() <= 0) invalid(std::string(name) + ": the communicator is empty (split with a negative color)");
  }
};

// An output buffer that must match `reference` in type and hold `expected` elements.
Buffer output_like(const Site& site, const py::handle& object, const Buffer& reference, const char* reference_name,
                   std::size_t expected, const std::string& why) {
  const Role role = site.role("recv", true);
  Buffer buffer = buffer_of(object, role);
  expect_type(buffer, reference, role, reference_name);
  expect_count(buffer, expected, role, why);
  return buffer;
}

// The per-rank block of a buffer that holds size() blocks (in-place forms, reduce_scatter, ...).
std::size_t block_of(const Site& site, const Buffer& buffer, const char* argument) {
  site.check_not_empty();
  if (buffer.count % site.size() != 0)
    invalid(prefix(site.role(argument, false)) + argument + " has " + std::to_string(buffer.count) +
            " elements, not a multiple of size() = " + std::to_string(site.size()));
  return buffer.count / site.size();
}

// Per-rank counts (allgatherv, alltoallv): size() non-negative integers.
Counts counts_of(const Site& site, const py::handle& object, const char* argument) {
  site.check_not_empty();
  if (!py::isinstance<py::iterable>(object))
    invalid(prefix(site.role(argument, false)) + argument + " must be a sequence of integers");
  Counts counts;
  try {
    for (const py::handle item : py::iterable(py::reinterpret_borrow<py::object>(object))) {
      const auto c = item.cast<long long>();
      if (c < 0) invalid(prefix(site.role(argument, false)) + argument + " has a negative entry");
      counts.push_back(static_cast<std::size_t>(c));
    }
  } catch (const py::cast_error&) {
    invalid(prefix(site.role(argument, false)) + argument + " must be a sequence of integers");
  }
  if (counts.size() != site.size())
    invalid(prefix(site.role(argument, false)) + argument + " has " + std::to_string(counts.size()) +
            " entries, expected size() = " + std::to_string(site.size()));
  return counts;
}

std::size_t total(const Counts& counts) { return std::accumulate(counts.begin(), counts.end(), std::size_t{0}); }

void* offset(const Buffer& buffer, std::size_t elements) {
  return static_cast<std::byte*>(buffer.data) + elements * tutti::size_of(buffer.type);
}

PreparedCall allreduce(Comm& comm, py::object send, py::object recv, py::object op, py::object algorithm,
                       py::object timeout) {
  const Site site{"allreduce", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const auto reduce_op = reduce_op_of(op, site.name);
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", s.count, "the count of send");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, n = s.count, t = s.type](Comm& c, bool nb) {
            if (nb) return c.iallreduce(sp, rp, n, t, reduce_op, options);
            c.allreduce(sp, rp, n, t, reduce_op, options);
            return tutti::Request();
          }};
}

PreparedCall reduce(Comm& comm, py::object send, py::object recv, py::object op, int root, py::object algorithm,
                    py::object timeout) {
  const Site site{"reduce", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const auto reduce_op = reduce_op_of(op, site.name);
  const bool in_place = site.at(root) && recv.is_none();
  const Buffer s = buffer_of(send, site.role("send", in_place));
  Buffer r;  // elsewhere than at the root, recv is not used
  if (site.at(root)) r = in_place ? s : output_like(site, recv, s, "send", s.count, "the count of send");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, n = s.count, t = s.type](Comm& c, bool nb) {
            if (nb) return c.ireduce(sp, rp, n, t, reduce_op, root, options);
            c.reduce(sp, rp, n, t, reduce_op, root, options);
            return tutti::Request();
          }};
}

PreparedCall reduce_scatter(Comm& comm, py::object send, py::object recv, py::object op, py::object algorithm,
                            py::object timeout) {
  const Site site{"reduce_scatter", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const auto reduce_op = reduce_op_of(op, site.name);
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  const std::size_t n = block_of(site, s, "send");
  // In place (recv omitted): the result goes to the start of send, as MPI_IN_PLACE.
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", n, "the count of send / size()");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, t = s.type](Comm& c, bool nb) {
            if (nb) return c.ireduce_scatter(sp, rp, n, t, reduce_op, options);
            c.reduce_scatter(sp, rp, n, t, reduce_op, options);
            return tutti::Request();
          }};
}

PreparedCall allgather(Comm& comm, py::object send, py::object recv, py::object algorithm, py::object timeout) {
  const Site site{"allgather", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  // In place (recv omitted): send holds every block, this rank's already at its place.
  const std::size_t n = recv.is_none() ? block_of(site, s, "send") : s.count;
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", site.size() * n, "size() * count of send");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, t = s.type](Comm& c, bool nb) {
            if (nb) return c.iallgather(sp, rp, n, t, options);
            c.allgather(sp, rp, n, t, options);
            return tutti::Request();
          }};
}

PreparedCall allgatherv(Comm& comm, py::object send, py::object recv_counts, py::object recv, py::object algorithm,
                        py::object timeout) {
  const Site site{"allgatherv", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  Counts counts = counts_of(site, recv_counts, "recv_counts");
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  const std::size_t n = recv.is_none() ? counts[static_cast<std::size_t>(comm.rank())] : s.count;
  if (recv.is_none()) expect_count(s, total(counts), site.role("send", true), "in place: the sum of recv_counts");
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", total(counts), "the sum of recv_counts");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, t = s.type, counts = std::move(counts)](Comm& c, bool nb) {
            if (nb) return c.iallgatherv(sp, n, rp, counts, t, options);
            c.allgatherv(sp, n, rp, counts, t, options);
            return tutti::Request();
          }};
}

PreparedCall broadcast(Comm& comm, py::object buffer, int root, py::object algorithm, py::object timeout) {
  const Site site{"broadcast", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const Buffer b = buffer_of(buffer, site.role("buffer", !site.at(root)));
  return {{b.owner}, [=, p = b.data, n = b.count, t = b.type](Comm& c, bool nb) {
            if (nb) return c.ibroadcast(p, n, t, root, options);
            c.broadcast(p, n, t, root, options);
            return tutti::Request();
          }};
}

PreparedCall alltoall(Comm& comm, py::object send, py::object recv, py::object algorithm, py::object timeout) {
  const Site site{"alltoall", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  const std::size_t n = block_of(site, s, "send");
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", s.count, "the count of send");
  return {{s.owner, r.owner}, [=, sp = s.data, rp = r.data, t = s.type](Comm& c, bool nb) {
            if (nb) return c.ialltoall(sp, rp, n, t, options);
            c.alltoall(sp, rp, n, t, options);
            return tutti::Request();
          }};
}

PreparedCall alltoallv(Comm& comm, py::object send, py::object send_counts, py::object recv_counts, py::object recv,
                       py::object algorithm, py::object timeout) {
  const Site site{"alltoallv", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  Counts sc = counts_of(site, send_counts, "send_counts");
  Counts rc = counts_of(site, recv_counts, "recv_counts");
  const Buffer s = buffer_of(send, site.role("send", recv.is_none()));
  if (recv.is_none())  // in place: the one buffer holds the larger of what goes and what comes
    expect_count(s, std::max(total(sc), total(rc)), site.role("send", true),
                 "in place: the larger of the sums of send_counts and recv_counts");
  else
    expect_count(s, total(sc), site.role("send", false), "the sum of send_counts");
  const Buffer r = recv.is_none() ? s : output_like(site, recv, s, "send", total(rc), "the sum of recv_counts");
  return {{s.owner, r.owner},
          [=, sp = s.data, rp = r.data, t = s.type, sc = std::move(sc), rc = std::move(rc)](Comm& c, bool nb) {
            if (nb) return c.ialltoallv(sp, sc, rp, rc, t, options);
            c.alltoallv(sp, sc, rp, rc, t, options);
            return tutti::Request();
          }};
}

PreparedCall gather(Comm& comm, py::object send, py::object recv, int root, py::object algorithm, py::object timeout) {
  const Site site{"gather", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  const bool in_place = site.at(root) && recv.is_none();
  const Buffer s = buffer_of(send, site.role("send", in_place));
  // In place at the root (recv omitted): send holds every block, the root's already at its place.
  const std::size_t n = in_place ? block_of(site, s, "send") : s.count;
  Buffer r;  // elsewhere than at the root, recv is not used
  if (site.at(root)) r = in_place ? s : output_like(site, recv, s, "send", site.size() * n, "size() * count of send");
  const void* sp = in_place ? offset(s, static_cast<std::size_t>(root) * n) : s.data;
  return {{s.owner, r.owner}, [=, rp = r.data, t = s.type](Comm& c, bool nb) {
            if (nb) return c.igather(sp, rp, n, t, root, options);
            c.gather(sp, rp, n, t, root, options);
            return tutti::Request();
          }};
}

PreparedCall scatter(Comm& comm, py::object send, py::object recv, int root, py::object algorithm, py::object timeout) {
  const Site site{"scatter", comm};
  const auto options = options_of(algorithm, timeout, site.name);
  Buffer s;  // elsewhere than at the root, send is not used
  Buffer r;
  std::size_t n = 0;
  void* rp = nullptr;
  if (site.at(root)) {
    // In place at the root (recv omitted): the root's block of send stays where it is.
    s = buffer_of(send, site.role("send", recv.is_none()));
    n = block_of(site, s, "send");
    r = recv.is_none() ? s : output_like(site, recv, s, "send", n, "the count of send / size()");
    rp = recv.is_none() ? offset(s, static_cast<std::size_t>(root) * n) : r.data;
  } else {
    r = buffer_of(recv, site.role("recv", true));
    n = r.count;
    rp = r.data;
  }
  return {{s.owner, r.owner}, [=, sp = s.data, t = r.type](Comm& c, bool nb) {
            if (nb) return c.iscatter(sp, rp, n, t, root, options);
            c.scatter(sp, rp, n, t, root, options);
            return tutti::Request();
          }};
}

PreparedCall barrier(Comm& comm, py::object algorithm, py::object timeout) {
  const auto options = options_of(algorithm, timeout, "barrier");
  (void)comm;
  return {{}, [=](Comm& c, bool nb) {
            if (nb) return c.ibarrier(options);
            c.barrier(options);
            return tutti::Request();
          }};
}

PreparedCall send(Comm& comm, py::object buffer, int peer, int tag) {
  const Buffer b = buffer_of(buffer, Site{"send", comm}.role("buffer", false));
  return {{b.owner}, [=, p = b.data, n = b.count, t = b.type](Comm& c, bool nb) {
            if (nb) return c.isend(p, n, t, peer, tag);
            c.send(p, n, t, peer, tag);
            return tutti::Request();
          }};
}

PreparedCall recv(Comm& comm, py::object buffer, int peer, int tag) {
  const Buffer b = buffer_of(buffer, Site{"recv", comm}.role("buffer", true));
  return {{b.owner}, [=, p = b.data, n = b.count, t = b.type](Comm& c, bool nb) {
            if (nb) return c.irecv(p, n, t, peer, tag);
            c.recv(p, n, t, peer, tag);
            return tutti::Request();
          }};
}

// Both at once (no nonblocking twin): returns the sender of what was received.
int sendrecv(Comm& comm, py::object send, int dest, py::object recv, int source, int send_tag, int recv_tag) {
  const Site site{"sendrecv", comm};
  const Buffer s = buffer_of(send, site.role("send", false));
  const Buffer r = buffer_of(recv, site.role("recv", true));
  expect_type(r, s, site.role("recv", true), "send");
  py::gil_scoped_release release;  // s and r, which keep the buffers alive, outlive it
  return comm.sendrecv(s.data, s.count, dest, r.data, r.count, source, s.type, send_tag, recv_tag);
}

// Binds `build` twice: `name` runs the call and returns None; `iname` returns its Request.
template <class... A, class... Extra>
void def_twin(py::class_<Comm>& cls, const char* name, const char* iname, PreparedCall (*build)(Comm&, A...),
              const Extra&... extra) {
  cls.def(
      name, [build](Comm& c, A... a) { run_blocking(c, build(c, std::move(a)...)); }, extra...);
  cls.def(
      iname, [build](Comm& c, A... a) { return run_nonblocking(c, build(c, std::move(a)...)); }, extra...);
}

}  // namespace

void bind_collectives(py::class_<tutti::Communicator>& cls) {
  using py::arg;
  const auto sum = tutti::ReduceOp::sum;
  const auto none = py::none();
  const auto algo = arg("algorithm") = none;
  const auto timeout = arg("timeout") = none;
  def_twin(cls, "allreduce", "iallreduce", &allreduce, arg("send"), arg("recv") = none, arg("op") = sum, py::kw_only(),
           algo, timeout, "recv = op over ranks of send, on every rank; recv omitted: in place in send.");
  def_twin(cls, "reduce", "ireduce", &reduce, arg("send"), arg("recv") = none, arg("op") = sum, arg("root") = 0,
           py::kw_only(), algo, timeout,
           "Like allreduce, but only root's recv gets the result (recv omitted: in place).");
  def_twin(cls, "reduce_scatter", "ireduce_scatter", &reduce_scatter, arg("send"), arg("recv") = none, arg("op") = sum,
           py::kw_only(), algo, timeout,
           "send holds size() blocks; rank r's recv gets block r of the reduction (recv omitted: at send's start).");
  def_twin(cls, "allgather", "iallgather", &allgather, arg("send"), arg("recv") = none, py::kw_only(), algo, timeout,
           "recv (size() * len(send)) gets every rank's send in rank order (recv omitted: send holds all blocks).");
  def_twin(cls, "allgatherv", "iallgatherv", &allgatherv, arg("send"), arg("recv_counts"), arg("recv") = none,
           py::kw_only(), algo, timeout, "Like allgather with per-rank counts, packed in rank order.");
  def_twin(cls, "broadcast", "ibroadcast", &broadcast, arg("buffer"), arg("root") = 0, py::kw_only(), algo, timeout,
           "Copies root's buffer to every rank's buffer.");
  def_twin(cls, "alltoall", "ialltoall", &alltoall, arg("send"), arg("recv") = none, py::kw_only(), algo, timeout,
           "Block j of send goes to rank j, which stores it as its block rank (recv omitted: in place).");
  def_twin(cls, "alltoallv", "ialltoallv", &alltoallv, arg("send"), arg("send_counts"), arg("recv_counts"),
           arg("recv") = none, py::kw_only(), algo, timeout,
           "Like alltoall with per-peer counts, packed in rank order.");
  def_twin(cls, "gather", "igather", &gather, arg("send"), arg("recv") = none, arg("root") = 0, py::kw_only(), algo,
           timeout, "root's recv (size() * len(send)) gets every rank's send in rank order.");
  def_twin(cls, "scatter", "iscatter", &scatter, arg("send"), arg("recv") = none, arg("root") = 0, py::kw_only(), algo,
           timeout, "Block r of root's send (size() blocks) goes to rank r's recv.");
  def_twin(cls, "barrier", "ibarrier", &barrier, py::kw_only(), algo, timeout,
           "Returns only after every rank has entered it.");
  def_twin(cls, "send", "isend", &send, arg("buffer"), arg("peer"), arg("tag") = 0,
           "Sends buffer to peer; messages between two ranks with the same tag arrive in order.");
  def_twin(cls, "recv", "irecv", &recv, arg("buffer"), arg("peer"), arg("tag") = 0,
           "Receives peer's message with this tag into buffer (its size and type must match the send).");
  cls.def("sendrecv", &sendrecv, arg("send"), arg("dest"), arg("recv"), arg("source"), arg("send_tag") = 0,
          arg("recv_tag") = 0,
          "Sends send to dest and receives source's message into recv at once (as MPI_Sendrecv: neighbours "
          "that exchange); returns the sender.");
}

}  // namespace tutti_python
