// The in-place forms of a collective call (include/tutti/tutti.hpp, NativeCall), in one place:
// which (send, recv) pairs are allowed, and what each means for where this rank's input is and
// where its result goes. Validation (comm/validate.cpp), the schedules' buffers
// (CommImpl::map_buffers) and shared memory's direct collectives (shm/direct_start.cpp,
// shm/direct_inline.cpp) all read the forms from here; MPI's collectives take them as they are
// (MPI_IN_PLACE).
#pragma once

#include <cstddef>

#include "transport/transport.hpp"

namespace tutti::transport {

/// A call's in-place form, mapped onto plain buffers.
struct InPlace {
  /// Where this rank's input is: `send`, or for allgather's and allgatherv's MPI form (send ==
  /// recv) its block, already in its slot of recv.
  const std::byte* input = nullptr;
  /// alltoall or alltoallv with send == recv: the result overwrites input that is still to be
  /// sent, so the input must be copied first.
  bool snapshot_input = false;
  /// reduce_scatter's MPI form (send == recv) on a rank > 0 with count > 0: the result goes to
  /// the start of recv, over input blocks still to be read, so it must be written elsewhere and
  /// copied there at the end.
  bool stage_output = false;
};

/// How `call`'s buffers map on rank `rank` (the arguments validated).
InPlace map_in_place(const NativeCall& call, int rank);

/// Whether `call`'s send and recv, which overlap, are one of the in-place forms: send == recv
/// (allreduce, reduce, alltoall(v), reduce_scatter's and allgather(v)'s MPI forms), and NCCL's
/// forms, where this rank's block of the larger buffer is the smaller one (reduce_scatter,
/// allgather, allgatherv, gather, scatter).
bool is_in_place_form(const NativeCall& call, int rank);

}  // namespace tutti::transport
