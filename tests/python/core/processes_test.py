"""tutti across processes: run under tutti-run -n P (ctest python.core.processes_pP), mpirun or
torchrun (python.core.torchrun_p3: tutti.init() joins through torchrun's store).

Every rank runs the same tests in the same order (unittest sorts them), so their collectives
match. Each rank checks its own results; tutti-run fails the job when any rank fails.
"""

import os
import unittest

import numpy as np

import checks
import tutti

WORLD = None


def world():
    global WORLD
    if WORLD is None:
        WORLD = tutti.init()
    return WORLD


class Processes(unittest.TestCase):
    def test_a_init(self):
        comm = world()
        # tutti-run, mpirun or torchrun
        rank, size = next((r, s) for r, s in (("TUTTI_RANK", "TUTTI_SIZE"), ("OMPI_COMM_WORLD_RANK",
                                                                           "OMPI_COMM_WORLD_SIZE"), ("RANK", "WORLD_SIZE"))
                          if s in os.environ)
        self.assertGreater(int(os.environ[size]), 1)
        self.assertEqual(comm.size, int(os.environ[size]))
        self.assertEqual(comm.rank, int(os.environ[rank]))

    def test_allreduce_every_type_and_op(self):
        self.assertGreaterEqual(checks.run_allreduce(world()), 9 * 5 * 4)

    def test_every_collective(self):
        self.assertGreater(checks.run_collectives(world()), 0)

    def test_split(self):
        checks.run_split(world())

    def test_large_nonblocking_overlap(self):
        """Several large requests in flight at once, completed in reverse order."""
        comm = world()
        n = 1 << 18
        buffers = [np.full(n, comm.rank + k, dtype=np.float32) for k in range(4)]
        requests = [comm.iallreduce(b) for b in buffers]
        for request in reversed(requests):
            self.assertTrue(request.wait(timeout=60))
        p = comm.size
        for k, b in enumerate(buffers):
            want = p * (p - 1) / 2 + k * p
            self.assertTrue(np.all(b == want), f"buffer {k}: {b[:4]} want {want}")

    def test_shared_buffers_zero_copy(self):
        """Buffers from allocate: numpy views of them reduce exactly, in and out of place."""
        comm = world()
        n = (1 << 16) + 3
        send_memory, recv_memory = comm.allocate(4 * n), comm.allocate(4 * n)
        self.assertEqual(len(send_memory), 4 * n)
        send = np.frombuffer(send_memory, dtype=np.float32)
        recv = np.frombuffer(recv_memory, dtype=np.float32)
        self.assertTrue(np.all(send == 0))
        send[:] = (comm.rank + 1) * (np.arange(n) % 7 + 1)
        recv[:] = np.nan
        comm.allreduce(send, recv)
        p = comm.size
        want = p * (p + 1) / 2 * (np.arange(n) % 7 + 1)
        self.assertTrue(np.array_equal(recv, want), f"{recv[:4]} want {want[:4]}")
        comm.allreduce(send)  # in place
        self.assertTrue(np.array_equal(send, want), f"{send[:4]} want {want[:4]}")

    def test_z_rank_out_of_range(self):
        """Rejected on every rank before anything moves; the world stays usable."""
        comm = world()
        with self.assertRaises(tutti.InvalidArgument) as caught:
            comm.broadcast(np.ones(3, np.int32), root=comm.size)
        self.assertIn(f"root {comm.size} is out of range [0, {comm.size})", str(caught.exception))
        with self.assertRaises(tutti.InvalidArgument):
            comm.isend(np.ones(3, np.int32), comm.size + 1)
        x = np.ones(3, np.int32)
        comm.allreduce(x)
        checks.expect(x, [comm.size] * 3, "allreduce after the rejected calls")


if __name__ == "__main__":
    unittest.main()
