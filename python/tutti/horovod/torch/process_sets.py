"""Horovod's process sets: collectives among some of the job's ranks.

    even = hvd.add_process_set([0, 2])        # collective: every rank calls it, with the same ranks
    if hvd.rank() in even.ranks:
        hvd.allreduce(t, process_set=even)    # among ranks 0 and 2 only
    hvd.remove_process_set(even)              # collective again

A process set's ranks split a communicator from the job's and start an engine of their own, so
names are negotiated among its ranks only. Roots (broadcast's root_rank) are job ranks, as in
Horovod; allgather concatenates in the order of the set's ranks.
"""

import weakref

from tutti.horovod import _horovod
from tutti._errors import InvalidArgument, Unsupported

# Every set added and not removed: an elastic rebuild drops them all (_job_rebuilt).
_added = weakref.WeakSet()


class ProcessSet:
    """Some of the job's ranks (Horovod's horovod.common.process_sets.ProcessSet). Built from a
    list of ranks; `process_set_id` is set once it was added (add_process_set) and None after it
    was removed. An MPI communicator is not accepted (tutti.Unsupported)."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise Unsupported("ProcessSet: built from a list of ranks only (no MPI communicator here)") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks = ranks

    _dropped_by_rebuild = False

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """The number of ranks in the set, or None if it is not added."""
        if self.process_set_id is None:
            return None
        return len(_horovod.process_set_ranks(self.process_set_id))

    def rank(self):
        """This rank's index among the set's ranks, or None if it is not added. Error for a rank
        that is not a member."""
        if self.process_set_id is None:
            return None
        ranks = _horovod.process_set_ranks(self.process_set_id)
        if _horovod.rank() not in ranks:
            raise InvalidArgument("ProcessSet.rank: rank %d is not a member of %s" % (_horovod.rank(), self))
        return ranks.index(_horovod.rank())

    def included(self):
        """Whether this rank is a member (None before the set has ranks)."""
        if self.ranks is None:
            return None
        return _horovod.rank() in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (self.process_set_id, self.ranks,
                                                                         self.mpi_comm)

    __repr__ = __str__


# The job's ranks; its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _id_of(process_set):
    """The id to pass to the C++ module: 0 for None or the global set."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgument("process_set must be a ProcessSet (from hvd.add_process_set), not %s"
                              % type(process_set).__name__)
    if process_set.process_set_id is None:
        if process_set._dropped_by_rebuild:
            raise InvalidArgument("%s was dropped when the elastic job was rebuilt (its ranks changed): add it "
                                  "again, e.g. in a reset callback (state.register_reset_callbacks)" % process_set)
        raise InvalidArgument("%s has not been added (hvd.add_process_set) or was removed" % process_set)
    return process_set.process_set_id


def _size_of(process_set):
    return _horovod.size() if _id_of(process_set) == 0 else len(_horovod.process_set_ranks(_id_of(process_set)))


def _rank_in(process_set):
    """This rank's index in the set."""
    if _id_of(process_set) == 0:
        return _horovod.rank()
    return _horovod.process_set_ranks(_id_of(process_set)).index(_horovod.rank())


def add_process_set(process_set):
    """Collective over the job: adds a process set (a ProcessSet or a list of ranks; every rank
    passes the same ranks) and returns it, its process_set_id set. ValueError where a set of the
    same ranks exists (the global set included)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    process_set_id = _horovod.add_process_set(process_set.ranks)
    if process_set_id is None:
        raise ValueError("Attempted to add a duplicate process set: %s" % process_set)
    process_set.process_set_id = process_set_id
    process_set._dropped_by_rebuild = False
    _added.add(process_set)
    return process_set


def remove_process_set(process_set):
    """Collective over the job: removes the set (its operations must all be synchronized) and
    invalidates the object. False for the global set or a set not added."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    _added.discard(process_set)
    return _horovod.remove_process_set(process_set_id)


def _init_global_process_set():
    global_process_set.ranks = list(range(_horovod.size()))


def _job_rebuilt():
    """After an elastic rebuild (a new context, its ranks renumbered): every set added before is
    dropped, its object invalidated (using it names the rebuild), and the global set takes the new
    ranks. Sets are added again by the program, in a reset callback."""
    for process_set in list(_added):
        process_set._invalidate()
        process_set._dropped_by_rebuild = True
    _added.clear()
    _init_global_process_set()
