"""A torch tensor handed to a nonblocking call keeps its memory until the call completes
(ctest python.core.buffer_lifetime; docs/python.md, "Buffer lifetime").

Rank 0 of a local_group(2) posts an irecv, then, while rank 1 has not sent yet, does what would
free or move the tensor's memory: t.set_(other) and del t (the old storage must stay alive until
the request completes, and go once it has: StorageWeakRef), t.resize_(bigger) (must raise
RuntimeError while the call runs, and work after wait()). Every scenario runs in a subprocess of
its own: writing into freed memory may crash the interpreter, which must fail the test, not end
the test runner.
"""

import gc
import subprocess
import sys
import threading
import unittest

N = 1 << 16  # int64 elements: 512 KiB, so that the allocator hands the memory back on free
TIMEOUT_S = 120
FILE = __file__

try:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
except ImportError:  # the torch cases need python3-torch
    torch = None


def storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def expected():
    return torch.arange(N, dtype=torch.int64) * 3 + 1


def two_ranks(receiver):
    """Rank 1 sends expected() once rank 0 says so; rank 0 runs receiver(comm, go), which must set
    `go` while its irecv is in flight."""
    import tutti

    comms = tutti.local_group(2)
    go = threading.Event()
    errors = []

    def sender():
        try:
            if not go.wait(60):
                raise AssertionError("rank 0 never let rank 1 send")
            comms[1].send(expected(), 0)
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        receiver(comms[0], go)
    finally:
        go.set()
        thread.join(60)
    if errors:
        raise errors[0]
    if thread.is_alive():
        raise AssertionError("rank 1 did not finish its send")


def scenario_set(comm, go):
    t = torch.zeros(N, dtype=torch.int64)
    old = StorageWeakRef(storage(t))
    request = comm.irecv(t, 1)
    t.set_(torch.zeros(4, dtype=torch.int64))  # the tensor lets go of the storage irecv writes
    gc.collect()
    assert not old.expired(), "set_: the storage freed while irecv runs"
    go.set()
    assert request.wait() is True
    gc.collect()
    assert old.expired(), "set_: the old storage still held after the request completed"
    assert t.tolist() == [0, 0, 0, 0], "set_: the new storage was written"


def scenario_del(comm, go):
    t = torch.zeros(N, dtype=torch.int64)
    old = StorageWeakRef(storage(t))
    request = comm.irecv(t, 1)
    del t
    gc.collect()
    assert not old.expired(), "del: the storage freed while irecv runs"
    go.set()
    assert request.wait() is True
    gc.collect()
    assert old.expired(), "del: the storage still held after the request completed"


def scenario_resize(comm, go):
    t = torch.zeros(N, dtype=torch.int64)
    request = comm.irecv(t, 1)
    try:
        t.resize_(16 * N)
    except RuntimeError as e:
        assert "resiz" in str(e), f"resize_: unexpected message {e}"
    else:
        raise AssertionError("resize_ to a larger size during irecv did not raise RuntimeError")
    # torch sets the new shape before it finds the storage not resizable (as for any such
    # storage, torch.from_numpy's too): the tensor must be resized back; the storage is intact.
    assert storage(t).size() == N, "resize_: the storage changed although resize_ raised"
    t.resize_(N)
    go.set()
    assert request.wait() is True
    assert torch.equal(t, expected()), "resize_: irecv's data wrong after the refused resize"
    t.resize_(16 * N)  # allowed again once the call completed
    assert torch.equal(t[:N], expected())
    # A storage that was not resizable before (torch.from_numpy) stays so.
    import numpy as np

    import tutti

    fixed = torch.from_numpy(np.zeros(4, dtype=np.int64))
    tutti.local_group(1)[0].allreduce(fixed)
    try:
        fixed.resize_(1000)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a NumPy-backed tensor became resizable after a call")


def scenario_fallback(comm, go):
    """Without tutti._storage, the storage object is held: set_ and del are still safe."""
    sys.modules["tutti._storage"] = None  # import tutti._storage now raises ImportError
    t = torch.zeros(N, dtype=torch.int64)
    old = StorageWeakRef(storage(t))
    request = comm.irecv(t, 1)
    t.set_(torch.zeros(4, dtype=torch.int64))
    gc.collect()
    assert not old.expired(), "fallback: the storage freed while irecv runs"
    go.set()
    assert request.wait() is True
    gc.collect()
    assert old.expired(), "fallback: the old storage still held after the request completed"


SCENARIOS = {"set": scenario_set, "del": scenario_del, "resize": scenario_resize, "fallback": scenario_fallback}


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class BufferLifetime(unittest.TestCase):
    def run_scenario(self, name):
        result = subprocess.run([sys.executable, FILE, name], capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(result.returncode, 0, f"scenario {name}: exit {result.returncode}\n{result.stderr[-3000:]}")

    def test_set(self):
        self.run_scenario("set")

    def test_del(self):
        self.run_scenario("del")

    def test_resize(self):
        self.run_scenario("resize")

    def test_fallback_without_pins(self):
        self.run_scenario("fallback")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in SCENARIOS:
        two_ranks(SCENARIOS[sys.argv[1]])
        print(f"scenario {sys.argv[1]}: ok")
    else:
        unittest.main()
