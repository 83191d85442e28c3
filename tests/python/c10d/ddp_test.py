"""DistributedDataParallel over "tutti" learns what it learns over "gloo".

One job, two process groups: the default one over "tutti" and a "gloo" group of the same ranks.
Two copies of a small network start from the same weights; each trains the same steps on the same
per-rank data, one under DDP over tutti, the other under DDP over gloo. Afterwards:
every rank holds the same parameters under tutti, equal to gloo's (against_gloo.py says how
exactly).
Run one process per rank, as collectives_test.py.
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tutti.distributed
from against_gloo import agreement, check_parameters  # this file's directory

STEPS = 6


def network():
    torch.manual_seed(1234)  # the same weights on every rank (DDP would broadcast rank 0's anyway)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 5))


def train(model, group, rank):
    # Two buckets at least (bucket_cap_mb small), so several allreduces overlap backward.
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.004)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(16, 20, generator=data)
        y = torch.randint(0, 5, (16,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    tutti.distributed.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    base = network()
    over_tutti = train(copy.deepcopy(base), dist.group.WORLD, rank)
    over_gloo = train(copy.deepcopy(base), gloo, rank)
    start = torch.cat([p.detach().reshape(-1) for p in base.parameters()])
    check_parameters("ddp_test", rank, size, gloo, start, over_tutti, over_gloo)
    dist.barrier()
    if rank == 0:
        print(f"ddp_test: {STEPS} steps at p = {size}: tutti's parameters equal gloo's "
              f"({agreement(size)}) and agree on every rank")
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 — report and fail this rank
        print(f"FAILED: {error}", file=sys.stderr)
        raise
