"""local_rank, local_size, cross_rank, cross_size on ranks spread over emulated hosts: run under
tutti-run with TUTTI_HOST=host<rank // 2> set per rank (ranks 2h and 2h+1 share host h; with an
odd number of ranks the last host has one), so that collectives also cross hosts (TCP).

Run: PYTHONPATH=build/python build/tools/tutti-run -n 3 \
       bash -c 'TUTTI_HOST=host$((TUTTI_RANK / 2)) exec python3 tests/python/horovod/hosts_test.py'
"""

import os

import torch

from harness import check_equal, run

import tutti.horovod.torch as hvd  # noqa: E402

hvd.init()
P, R = hvd.size(), hvd.rank()


def test_host_of_every_rank():
    assert os.environ["TUTTI_HOST"] == "host%d" % (R // 2), os.environ["TUTTI_HOST"]
    hosts = (P + 1) // 2
    local_size = 2 if R // 2 < P // 2 else 1
    got = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    assert got == (R % 2, local_size, R // 2, hosts), got
    assert hvd.is_homogeneous() == (P % 2 == 0)


def test_collectives_across_hosts():
    check_equal(hvd.allreduce(torch.full((1000,), float(R + 1)), op=hvd.Sum), torch.full((1000,), P * (P + 1) / 2),
                "allreduce")
    check_equal(hvd.allgather(torch.full((R + 1, 2), R)), torch.cat([torch.full((r + 1, 2), r) for r in range(P)]),
                "allgather")
    every = hvd.allgather_object((R, hvd.local_rank(), hvd.cross_rank()))
    assert every == [(r, r % 2, r // 2) for r in range(P)], every


run(globals(), lambda: R)
