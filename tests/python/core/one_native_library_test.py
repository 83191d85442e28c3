"""The package's modules share one native library: run under tutti-run -n 2 (ctest
python.core.one_native_library). The core module, the torch.distributed backend and Horovod's API,
all used in one process, map one libtutti_native.so and run one progress engine (one thread named
tutti-progress, where each module's private copy of the library used to start its own), and a
tutti.Communicator travels between modules as the same group: the torch backend's default group
and Horovod's API run over one handed to them (tutti.distributed.init_process_group(communicator=),
hvd.init(comm=)).
"""

import glob
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import tutti
import tutti.distributed  # noqa: F401  (registers the backend "tutti")
import tutti.horovod.torch as hvd


def threads_named(name):
    count = 0
    for comm in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(comm) as f:
                count += f.read().strip() == name
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return count


def main():
    world = tutti.init()
    x = np.full(8, world.rank + 1, dtype=np.int64)
    world.allreduce(x)
    assert (x == world.size * (world.size + 1) // 2).all(), x
    x[:] = 1

    # Horovod's API and the torch backend over communicators of ours: the world in reverse order.
    reverse = world.split(0, key=world.size - world.rank)
    assert reverse.rank == world.size - 1 - world.rank
    try:
        hvd.init(comm=[0, 1])
        raise AssertionError("hvd.init(comm=[0, 1]) did not raise")
    except tutti.Unsupported as error:
        assert "tutti.Communicator" in str(error), error
    hvd.init(comm=reverse)
    assert (hvd.rank(), hvd.size()) == (reverse.rank, reverse.size)
    hvd_ranks = hvd.allgather(torch.tensor([world.rank]), name="ranks")
    assert hvd_ranks.tolist() == list(reversed(range(world.size))), hvd_ranks
    t = hvd.allreduce(torch.full((5,), float(world.rank)), op=hvd.Sum, name="one")
    assert torch.equal(t, torch.full((5,), float(sum(range(world.size))))), t

    tutti.distributed.init_process_group(communicator=reverse,
                                         init_method=os.environ["TUTTI_STORE"].rstrip("/") + "/c10d")
    assert (dist.get_rank(), dist.get_world_size()) == (reverse.rank, reverse.size)
    group = dist.group.WORLD
    if not isinstance(group, tutti.distributed.ProcessGroupTutti):  # torch 2.x wraps the backend
        group = group._get_backend(torch.device("cpu"))
    handed = tutti.Communicator._from_capsule(group._capsule())
    assert handed == reverse and handed != world, "the group runs over another communicator"
    assert tutti.Communicator._from_capsule(world._capsule()) == world
    y = torch.arange(4, dtype=torch.float32) * (world.rank + 1)
    dist.all_reduce(y)
    ranks = [torch.zeros(1, dtype=torch.int64) for _ in range(world.size)]
    dist.all_gather(ranks, torch.tensor([world.rank]))  # in the group's order: the world reversed
    assert [int(r) for r in ranks] == list(reversed(range(world.size))), ranks
    assert torch.equal(y, torch.arange(4, dtype=torch.float32) * world.size * (world.size + 1) / 2), y

    # Each rank in turn starts a nonblocking call its peers join 0.3 s later, in the core module and
    # in the torch backend: the call is outstanding, so the module's progress engine takes it.
    for late in range(world.size):
        if world.rank == late:
            time.sleep(0.3)
        r = world.iallreduce(x)
        work = dist.all_reduce(torch.ones(3), async_op=True)
        r.wait()
        work.wait()

    mapped = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if path.endswith(".so") and os.path.basename(path).startswith("libtutti_native"):
                mapped.add(os.path.realpath(path))
    assert len(mapped) == 1, f"libtutti_native.so mapped {len(mapped)} times: {mapped}"
    progress = threads_named("tutti-progress")
    assert progress == 1, f"{progress} progress engines in one process"

    # A communicator handed over as a capsule is the same group: usable, same rank and size.
    capsule = world._capsule()
    assert type(capsule).__name__ == "PyCapsule"

    dist.destroy_process_group()
    hvd.shutdown()
    print(f"rank {world.rank}: ok, one native library ({mapped.pop()}), one progress engine")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001
        print(f"rank {os.environ.get('TUTTI_RANK')}: FAILED: {error}", file=sys.stderr)
        raise
