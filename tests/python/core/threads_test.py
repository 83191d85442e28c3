"""tutti in one process: the ranks of tutti.local_group(p) as threads (ctest python.core.threads).

Every collective runs with each rank in its own thread; they progress together only because the
bindings release the GIL while Tutti waits. Then the errors: each bad argument raises the right
tutti.Error subclass, with a message naming it, before anything moves.
"""

import threading
import time
import unittest

import numpy as np

import checks
import tutti

torch = checks.torch
DEADLINE_S = 120  # a rank thread still running by then is a hang


def run_ranks(p, body):
    """Runs body(comm) for each communicator of local_group(p) in its own thread; returns the
    results by rank and re-raises the first rank's exception."""
    comms = tutti.local_group(p)
    results, errors = [None] * p, [None] * p

    def run(rank):
        try:
            results[rank] = body(comms[rank])
        except BaseException as e:  # delivered to the test below
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(p)]
    for t in threads:
        t.start()
    end = time.monotonic() + DEADLINE_S
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:  # the others' errors say why (a rank that raised leaves its peers waiting)
        raise AssertionError(f"ranks {hung} of local_group({p}) did not finish in {DEADLINE_S} s; "
                             f"the others raised {[repr(e) for e in errors if e is not None]}")
    for e in errors:
        if e is not None:
            raise e
    return results


class Collectives(unittest.TestCase):
    def test_local_group(self):
        comms = tutti.local_group(3)
        self.assertEqual([(c.rank, c.size) for c in comms], [(0, 3), (1, 3), (2, 3)])
        self.assertEqual(repr(comms[1]), "<tutti.Communicator rank 1 of 3>")

    def test_allreduce_every_type_and_op(self):
        for p in (1, 3, 4):
            counts = run_ranks(p, checks.run_allreduce)
            self.assertEqual(len(set(counts)), 1)
            self.assertGreaterEqual(counts[0], 9 * 5 * 4)

    def test_every_collective(self):
        for p in (1, 2, 3, 4):
            counts = run_ranks(p, checks.run_collectives)
            self.assertEqual(len(set(counts)), 1)

    def test_split(self):
        run_ranks(5, checks.run_split)

    def test_host_layout(self):
        """Threads share one host: every rank is local, in rank order."""

        def body(comm):
            layout = comm.host_layout()
            self.assertEqual((layout.host_count, layout.host), (1, 0))
            self.assertEqual((layout.local_rank, layout.local_size), (comm.rank, 3))
            self.assertEqual(layout.host_of_rank, [0, 0, 0])

        run_ranks(3, body)

    def test_algorithms(self):
        def body(comm):
            for algorithm in ("ring", tutti.Algorithm.recursive_doubling, "rabenseifner", tutti.Algorithm.automatic):
                x = np.arange(11, dtype=np.float32) + comm.rank
                comm.allreduce(x, algorithm=algorithm, timeout=30.0)
                checks.expect(x, [4 * i + 6 for i in range(11)], f"allreduce {algorithm}")

        run_ranks(4, body)

    def test_buffer_kinds(self):
        """bytearray, memoryview and DLPack capsules (torch.utils.dlpack) as outputs."""

        def body(comm):
            out = bytearray(6)
            comm.allreduce(bytes([comm.rank + 1] * 6), out)
            self.assertEqual(list(out), [3] * 6)
            view = memoryview(bytearray([comm.rank] * 4))
            comm.allreduce(view, op="max")
            self.assertEqual(list(view), [1] * 4)
            if torch is not None:
                t = torch.zeros(2, 3, dtype=torch.int64)
                comm.allreduce(torch.full((2, 3), comm.rank + 2, dtype=torch.int64), torch.utils.dlpack.to_dlpack(t))
                checks.expect(t.flatten(), [5] * 6, "allreduce into a DLPack capsule")

        run_ranks(2, body)

    def test_views(self):
        """Contiguous views (slices, 2-D blocks) are written where they lie, and nowhere else."""

        def body(comm):
            whole = np.full(10, -1, dtype=np.int32)
            comm.allreduce(np.full(4, comm.rank + 1, np.int32), whole[3:7])
            checks.expect(whole, [-1] * 3 + [3] * 4 + [-1] * 3, "allreduce into a NumPy slice")
            grid = np.full((4, 3), -1, dtype=np.float64)
            comm.allgather(np.full(3, comm.rank + 5, np.float64), grid[1:3])
            checks.expect(grid.ravel(), [-1] * 3 + [5] * 3 + [6] * 3 + [-1] * 3, "allgather into rows 1-2")
            if torch is not None:
                t = torch.full((10,), -1, dtype=torch.int64)
                comm.allreduce(t[2:5].clone().fill_(comm.rank + 1), t[6:9])
                comm.broadcast(t[2:5], root=0)
                checks.expect(t, [-1, -1, -1, -1, -1, -1, 3, 3, 3, -1], "torch slices")
                empty = torch.zeros(0)
                comm.allreduce(empty)

        run_ranks(2, body)

    def test_request_keeps_buffers_alive(self):
        """A request holds its buffers: temporaries, and requests dropped before they complete."""

        def body(comm):
            recv = np.zeros(1000, dtype=np.int64)
            request = comm.iallreduce(np.full(1000, comm.rank, dtype=np.int64), recv)  # send is a temporary
            request.wait()
            checks.expect(recv, [1] * 1000, "iallreduce of a temporary")
            for _ in range(20):  # dropped at once; later calls sweep them
                comm.iallreduce(np.full(1000, comm.rank, dtype=np.int64), np.zeros(1000, dtype=np.int64))
            x = np.full(3, comm.rank + 1, dtype=np.int32)
            comm.allreduce(x)
            checks.expect(x, [3] * 3, "allreduce after dropped requests")

        run_ranks(2, body)

    def test_wait_with_timeout_and_test(self):
        """wait(timeout) returns False while the peer has not sent; test() polls to completion."""
        sent = threading.Event()

        def body(comm):
            buf = np.zeros(4, dtype=np.float64)
            if comm.rank == 0:
                request = comm.irecv(buf, 1)
                self.assertFalse(request.wait(timeout=0.05))
                self.assertFalse(request.test())
                sent.set()
                deadline = time.monotonic() + 30
                while not request.test():
                    self.assertLess(time.monotonic(), deadline)
                checks.expect(buf, [1, 2, 3, 4], "irecv polled with test()")
            else:
                self.assertTrue(sent.wait(30))
                comm.send(np.array([1, 2, 3, 4], dtype=np.float64), 0)

        run_ranks(2, body)


class Errors(unittest.TestCase):
    """Bad arguments: tutti.InvalidArgument with a message that names the call, rank and argument;
    nothing moves, so one rank alone can see them, and its communicator stays usable."""

    def setUp(self):
        self.comm = tutti.local_group(1)[0]

    def assertRaisesWith(self, cls, fragments, fn, *args, **kwargs):
        with self.assertRaises(cls) as caught:
            fn(*args, **kwargs)
        self.assertIsInstance(caught.exception, tutti.Error)
        for fragment in fragments:
            self.assertIn(fragment, str(caught.exception))
        return caught.exception

    def tearDown(self):
        x = np.ones(3, dtype=np.int32)
        self.comm.allreduce(x)  # still usable after the rejected calls
        checks.expect(x, [1, 1, 1], "allreduce after errors")

    def test_non_contiguous(self):
        a = np.zeros(10, dtype=np.float32)
        self.assertRaisesWith(tutti.InvalidArgument, ["allreduce (rank 0)", "send", "not C-contiguous"],
                              self.comm.allreduce, a[::2])
        self.assertRaisesWith(tutti.InvalidArgument, ["recv", "not C-contiguous"], self.comm.iallreduce,
                              np.zeros(5, np.float32), a[::2])
        if torch is not None:
            t = torch.zeros(3, 4)
            self.assertRaisesWith(tutti.InvalidArgument, ["broadcast (rank 0)", "buffer", "not C-contiguous",
                                                          "contiguous()"], self.comm.broadcast, t.t())
        self.assertEqual(a.tolist(), [0.0] * 10)

    def test_read_only_output(self):
        a = np.zeros(4, dtype=np.int32)
        a.flags.writeable = False
        self.assertRaisesWith(tutti.InvalidArgument, ["allreduce (rank 0)", "send", "read-only"],
                              self.comm.allreduce, a)  # in place: send is written
        self.assertRaisesWith(tutti.InvalidArgument, ["recv", "read-only"], self.comm.allreduce,
                              np.ones(4, np.int32), a)
        self.assertRaisesWith(tutti.InvalidArgument, ["recv (rank 0)", "buffer", "read-only"], self.comm.recv,
                              b"abcd", 0)
        self.comm.allreduce(a, np.zeros(4, np.int32))  # a read-only send is fine

    def test_wrong_size(self):
        recv = np.full(5, 9, dtype=np.int64)
        self.assertRaisesWith(tutti.InvalidArgument, ["allreduce (rank 0)", "recv has 5 elements, expected 4"],
                              self.comm.allreduce, np.ones(4, np.int64), recv)
        self.assertEqual(recv.tolist(), [9] * 5)  # nothing written
        comm3 = tutti.local_group(3)[1]
        self.assertRaisesWith(tutti.InvalidArgument, ["reduce_scatter (rank 1)", "7 elements", "multiple of size() = 3"],
                              comm3.reduce_scatter, np.ones(7, np.int64))
        self.assertRaisesWith(tutti.InvalidArgument, ["allgather (rank 1)", "recv has 4 elements, expected 6"],
                              comm3.iallgather, np.ones(2, np.int64), np.ones(4, np.int64))
        self.assertRaisesWith(tutti.InvalidArgument, ["recv_counts has 2 entries, expected size() = 3"],
                              comm3.allgatherv, np.ones(2, np.int64), [2, 2])
        self.assertRaisesWith(tutti.InvalidArgument, ["alltoallv (rank 1)", "send has 3 elements, expected 2"],
                              comm3.alltoallv, np.ones(3, np.int64), [1, 1, 0], [1, 1, 0], np.ones(2, np.int64))

    def test_type_mismatch_and_bad_types(self):
        self.assertRaisesWith(tutti.InvalidArgument, ["recv has type i32 but send has f32"], self.comm.allreduce,
                              np.ones(3, np.float32), np.ones(3, np.int32))
        self.assertRaisesWith(tutti.InvalidArgument, ["sendrecv (rank 0)", "recv has type i32 but send has f32"],
                              self.comm.sendrecv, np.ones(3, np.float32), 0, np.ones(3, np.int32), 0)
        shared = np.zeros(8, np.int32)
        self.assertRaisesWith(tutti.InvalidArgument, ["sendrecv: the send and receive buffers overlap"],
                              self.comm.sendrecv, shared[:5], 0, shared[3:], 0)
        self.assertRaisesWith(tutti.InvalidArgument, ["format 'h'", "no Tutti type"], self.comm.allreduce,
                              np.ones(3, np.int16))
        self.assertRaisesWith(tutti.InvalidArgument, ["no Tutti type"], self.comm.allreduce, np.ones(3, np.bool_))
        self.assertRaisesWith(tutti.InvalidArgument, ["no Tutti type"], self.comm.allreduce,
                              np.ones(3, np.complex64))
        self.assertRaisesWith(tutti.InvalidArgument, ["list", "neither the buffer protocol nor __dlpack__"],
                              self.comm.allreduce, [1, 2, 3])
        if torch is not None:
            self.assertRaisesWith(tutti.InvalidArgument, ["torch.bool"], self.comm.allreduce, torch.ones(3, dtype=torch.bool))
            self.assertRaisesWith(tutti.InvalidArgument, ["DLPack dtype (code 5"], self.comm.allreduce,
                                  torch.ones(3, dtype=torch.complex64))
            self.assertRaisesWith(tutti.InvalidArgument, ["cannot be exported through DLPack"], self.comm.allreduce,
                                  torch.ones(3, requires_grad=True))

    def test_bad_op_algorithm_timeout(self):
        self.assertRaisesWith(tutti.InvalidArgument, ["'mean' is not a ReduceOp (sum, prod, min, max, avg)"],
                              self.comm.allreduce, np.ones(3, np.float32), op="mean")
        self.assertRaisesWith(tutti.InvalidArgument, ["expected a tutti.ReduceOp or its name, not int"],
                              self.comm.allreduce, np.ones(3, np.float32), op=3)
        self.assertRaisesWith(tutti.InvalidArgument, ["'fastest' is not a Algorithm"], self.comm.allreduce,
                              np.ones(3, np.float32), algorithm="fastest")
        self.assertRaisesWith(tutti.InvalidArgument, ["timeout", "negative"], self.comm.barrier, timeout=-1)
        self.assertRaisesWith(tutti.InvalidArgument, ["'nccl' is not a Algorithm"], self.comm.allreduce,
                              np.ones(3, np.float32), algorithm="nccl")

    def test_rank_out_of_range(self):
        self.assertRaisesWith(tutti.InvalidArgument, ["broadcast", "root 1 is out of range [0, 1)"],
                              self.comm.broadcast, np.ones(3, np.int32), root=1)
        self.assertRaisesWith(tutti.InvalidArgument, ["reduce", "root -1 is out of range [0, 1)"],
                              self.comm.ireduce, np.ones(3, np.int32), np.ones(3, np.int32), root=-1)
        self.assertRaisesWith(tutti.InvalidArgument, ["send", "peer 3 is out of range [0, 1)"], self.comm.send,
                              np.ones(3, np.int32), 3)
        self.assertRaisesWith(tutti.InvalidArgument, ["recv", "peer -2 is out of range [0, 1)"], self.comm.irecv,
                              np.ones(3, np.int32), -2)

    def test_empty_communicator(self):
        empty = self.comm.split(-1, 0)
        for call in (lambda: empty.allgather(np.ones(2)), lambda: empty.ialltoall(np.ones(2)),
                     lambda: empty.allgatherv(np.ones(2), [2]), lambda: empty.allreduce(np.ones(2)),
                     lambda: empty.barrier()):
            self.assertRaisesWith(tutti.InvalidArgument, ["the communicator is empty"], call)

    def test_bad_counts(self):
        comm3 = tutti.local_group(3)[0]
        for counts in (5, ["a", 1, 1], [1, -1, 1]):
            self.assertRaisesWith(tutti.InvalidArgument, ["allgatherv (rank 0)", "recv_counts"], comm3.allgatherv,
                                  np.ones(1), counts)

    def test_exception_classes(self):
        self.assertTrue(issubclass(tutti.InvalidArgument, ValueError))
        self.assertTrue(issubclass(tutti.Timeout, TimeoutError))
        for cls in (tutti.InvalidArgument, tutti.Mismatch, tutti.Timeout, tutti.PeerFailure, tutti.Aborted,
                    tutti.Unsupported, tutti.SystemError_):
            self.assertTrue(issubclass(cls, tutti.Error))


class Failures(unittest.TestCase):
    """Failures among ranks: a timeout when a peer never comes, a mismatch when peers disagree."""

    def test_timeout(self):
        comms = tutti.local_group(2)
        start = time.monotonic()
        with self.assertRaises(tutti.Timeout) as caught:
            comms[0].allreduce(np.ones(4, np.float32), timeout=0.3)  # rank 1 never calls
        self.assertLess(time.monotonic() - start, 30)
        # The C++ message, intact: which rank, which call, which peer it waited for.
        self.assertIn("rank 0: allreduce(#0, count=4, f32, sum", str(caught.exception))
        self.assertIn("timed out after 300 ms; still waiting for rank(s) 1", str(caught.exception))

    def test_polling_reaches_the_deadline(self):
        """wait(timeout) in short slices: the operation's deadline counts from its issue."""
        request = tutti.local_group(2)[0].iallreduce(np.ones(4, np.float32), timeout=0.3)
        with self.assertRaises(tutti.Timeout):
            for _ in range(200):  # 10 s of slices
                self.assertFalse(request.wait(timeout=0.05))

    def test_mismatch(self):
        def body(comm):
            try:
                comm.allreduce(np.ones(4 + comm.rank, np.float32), timeout=30)
            except tutti.Error as e:
                return type(e), str(e)
            return None, ""

        results = run_ranks(2, body)
        for rank, (cls, message) in enumerate(results):
            self.assertIs(cls, tutti.Mismatch, f"rank {rank}: {cls} {message}")
            self.assertIn("rank 0 called allreduce(#0, count=4, f32", message)
            self.assertIn("rank 1 called allreduce(#0, count=5, f32", message)


if __name__ == "__main__":
    unittest.main()
