"""ZeroRedundancyOptimizer and FSDP over "tutti" learn what they learn over "gloo".

One job, two process groups, as ddp_test.py: the default one over "tutti" and a "gloo" group of the
same ranks. Each case trains copies of one small network from the same weights on the same per-rank
data, once over each group, and afterwards checks that
- the tutti run issued operations on the tutti group (its sequence number), the parameters moved,
  and every rank holds the same full parameters under tutti (compared exactly, through gloo);
- they equal gloo's: exactly at p = 2 (each reduced element is the sum of two numbers, which
  commutes; the dividing by p = 2 or 4 is exact), to 1e-6 relative at p > 2 (the libraries may add
  the ranks' numbers in different orders).

The cases, where the torch at hand supports them on the CPU:
- zero: DDP + torch.distributed.optim.ZeroRedundancyOptimizer (SGD with momentum), and its
  consolidate_state_dict(): rank 0's consolidated momentum buffers equal gloo's;
- zero_bucket_view: the same with parameters_as_bucket_view=True (SGD with Nesterov momentum and
  weight decay; not Adam, which at p = 4 turns the last-bit differences of the gradients' sums into
  differences of 7e-7 in the parameters after 6 steps, under plain DDP as under ZeRO);
- zero_overlap: ZeRO with overlap_with_ddp=True, its step run by DDP's comm hook
  hook_with_zero_step. Torch 2.x refuses that hook for "gloo" (pytorch issue 62300), so the
  reference is gloo's plain DDP + ZeRO with the same two first iterations without an update (the
  overlapped ZeRO updates nothing until DDP has rebuilt its buckets). Torch 1.13 refuses the hook
  for every backend but NCCL/HCCL: skipped there, said why;
- fsdp_full_shard, fsdp_shard_grad_op: torch 2.x's FullyShardedDataParallel with
  device_id=cpu, each Linear its own FSDP unit (full parameters through summon_full_params);
- fsdp_no_device_id: the same without device_id, which torch 2.15 refuses on a machine without an
  accelerator ("FSDP needs a non-CPU accelerator device"), for gloo as for any backend: skipped
  then, said why;
- fsdp2: torch 2.x's fully_shard (FSDP2) on a DeviceMesh of the group (full parameters through
  DTensor.full_tensor()).
A case torch itself does not support on this version (the FSDP cases on Debian's torch 1.13, whose
FSDP does not import on Python 3.11 and needs CUDA anyway) prints "zero_fsdp_test: NAME skipped:
REASON"; it never passes silently. Each case that runs prints one line ending in "passed".
Run one process per rank, as collectives_test.py.
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tutti.distributed
from against_gloo import agreement, check_close, check_parameters  # this file's directory

STEPS = 6
WARMUP = 2  # iterations the overlapped ZeRO spends learning DDP's buckets, without an update
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


class Skip(Exception):
    """Torch itself does not support the case on this version (said why)."""


def network():
    torch.manual_seed(1234)  # the same weights on every rank
    # Linear(32, 5): 165 parameters and 5 rows, which neither 2 nor 4 ranks divide (padded shards).
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 5))


def batches(rank, count):
    data = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 20, generator=data), torch.randint(0, 5, (16,), generator=data)) for _ in range(count)]


def loss_of(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def train(model, optimizer, rank, steps=STEPS, warmup=0):
    """`warmup` iterations of forward and backward without an update, then `steps` with one."""
    for i, batch in enumerate(batches(rank, warmup + steps)):
        optimizer.zero_grad()
        loss_of(model, batch).backward()
        if i >= warmup:
            optimizer.step()


def zero_optimizer(ddp, group, optimizer_class, **kwargs):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer_class, process_group=group, **kwargs)


def zero(base, group, rank, backend, warmup=0):
    ddp = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=0.004)
    optimizer = zero_optimizer(ddp, group, torch.optim.SGD, lr=0.05, momentum=0.9)
    train(ddp, optimizer, rank, warmup=warmup)
    # Every rank's shard of the optimizer's state, gathered on rank 0 over the group.
    optimizer.consolidate_state_dict(to=0)
    extra = None
    if rank == 0:
        state = optimizer.state_dict()["state"]
        extra = flat([state[i]["momentum_buffer"] for i in sorted(state)])
    return flat(ddp.module.parameters()), extra


def zero_bucket_view(base, group, rank, backend):
    ddp = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=0.004)
    optimizer = zero_optimizer(ddp, group, torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01,
                               parameters_as_bucket_view=True)
    train(ddp, optimizer, rank)
    return flat(ddp.module.parameters()), None


def zero_overlap(base, group, rank, backend):
    if backend == "gloo":
        # Torch refuses hook_with_zero_step for gloo: the reference is plain ZeRO over gloo, its
        # first WARMUP iterations without an update, as the overlapped one's.
        return zero(base, group, rank, backend, warmup=WARMUP)[0], None
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=0.004)
    optimizer = zero_optimizer(ddp, group, torch.optim.SGD, lr=0.05, momentum=0.9, overlap_with_ddp=True)
    try:
        hook = hook_with_zero_step(allreduce_hook, ddp, optimizer)
    except RuntimeError as error:
        if TORCH2:
            raise
        raise Skip(f"torch {torch.__version__}'s hook_with_zero_step refuses every backend but NCCL/HCCL "
                   f"(\"{error}\")") from error
    ddp.register_comm_hook(group, hook)
    start = flat(ddp.module.parameters())
    for i, batch in enumerate(batches(rank, WARMUP + STEPS)):
        ddp.zero_grad(set_to_none=True)
        loss_of(ddp, batch).backward()  # the last bucket's hook steps ZeRO and broadcasts the shards
        moved = not torch.equal(flat(ddp.module.parameters()), start)
        if moved != (i >= WARMUP):
            raise AssertionError(f"rank {rank}: overlapped ZeRO {'updated' if moved else 'did not update'} "
                                 f"the parameters in iteration {i} (expected updates from iteration {WARMUP})")
    return flat(ddp.module.parameters()), None


def import_fsdp():
    try:
        import torch.distributed.fsdp as fsdp
    except Exception as error:  # noqa: BLE001 — torch 1.13's does not import on Python 3.11
        reason = f"torch {torch.__version__}'s torch.distributed.fsdp does not import ({type(error).__name__}: {error})"
        if not TORCH2:
            reason += "; its FSDP runs on CUDA only anyway (FullyShardedDataParallel creates torch.cuda streams)"
        raise Skip(reason) from error
    if not TORCH2:
        raise Skip(f"torch {torch.__version__}'s FSDP runs on CUDA only (FullyShardedDataParallel creates "
                   "torch.cuda streams)")
    return fsdp


def fsdp1(strategy, device_id=torch.device("cpu")):
    def case(base, group, rank, backend):
        fsdp = import_fsdp()
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if device_id is None and torch.cuda.is_available():
            raise Skip("a CUDA device is present: FSDP without device_id would move the module to it, and tutti "
                       "is registered for the CPU only")
        try:
            model = fsdp.FullyShardedDataParallel(copy.deepcopy(base), process_group=group, device_id=device_id,
                                                  sharding_strategy=getattr(fsdp.ShardingStrategy, strategy),
                                                  auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
        except RuntimeError as error:
            if device_id is not None or backend != "gloo":
                raise
            # Without device_id, FSDP wants an accelerator, for every backend.
            raise Skip(f"torch {torch.__version__} refuses FSDP without device_id for gloo too (\"{error}\"); "
                       "device_id=cpu runs (fsdp_full_shard)") from error
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        train(model, optimizer, rank)
        with fsdp.FullyShardedDataParallel.summon_full_params(model):  # an allgather over the group
            return flat(model.parameters()), None

    return case


def fsdp2(base, group, rank, backend):
    try:
        fsdp = import_fsdp()
    except Skip as skip:
        if TORCH2:
            raise
        raise Skip(f"torch {torch.__version__} has no fully_shard (FSDP2 is torch 2.x's); {skip}") from skip
    if not hasattr(fsdp, "fully_shard"):
        raise Skip(f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2)")
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(group, "cpu")
    model = copy.deepcopy(base)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fsdp.fully_shard(layer, mesh=mesh)
    fsdp.fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train(model, optimizer, rank)
    return flat(p.full_tensor() for p in model.parameters()), None  # an allgather over the group


CASES = [
    ("zero", zero, "DDP + ZeroRedundancyOptimizer (SGD, momentum; consolidate_state_dict)"),
    ("zero_bucket_view", zero_bucket_view, "DDP + ZeroRedundancyOptimizer (parameters_as_bucket_view)"),
    ("zero_overlap", zero_overlap, "DDP + ZeroRedundancyOptimizer overlap_with_ddp (hook_with_zero_step; "
     "gloo's reference without overlap, which torch refuses for gloo)"),
    ("fsdp_full_shard", fsdp1("FULL_SHARD"), "FullyShardedDataParallel FULL_SHARD, device_id=cpu"),
    ("fsdp_shard_grad_op", fsdp1("SHARD_GRAD_OP"), "FullyShardedDataParallel SHARD_GRAD_OP, device_id=cpu"),
    ("fsdp_no_device_id", fsdp1("FULL_SHARD", None), "FullyShardedDataParallel FULL_SHARD without device_id"),
    ("fsdp2", fsdp2, "fully_shard (FSDP2) on a DeviceMesh of the group"),
]


def check(name, rank, size, gloo, start, over_tutti, over_gloo):
    params, extra = over_tutti
    check_parameters(name, rank, size, gloo, start, params, over_gloo[0])
    if extra is not None:
        check_close(name, rank, size, "the consolidated optimizer state", extra, over_gloo[1])


def main():
    tutti.distributed.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"tutti": dist.group.WORLD, "gloo": dist.new_group(list(range(size)), backend="gloo")}
    gloo = groups["gloo"]
    base = network()
    start = flat(base.parameters())
    passed = skipped = 0
    for name, case, what in CASES:
        results = {}
        reason = None
        operations = 0  # issued by the tutti group during its run: the case did run over tutti
        for backend in ("gloo", "tutti"):  # gloo first: what it cannot run, torch does not support
            before = groups["tutti"]._get_sequence_number_for_group()
            try:
                results[backend] = case(base, groups[backend], rank, backend)
            except Skip as skip:
                reason = str(skip)
                break
            if backend == "tutti":
                operations = groups["tutti"]._get_sequence_number_for_group() - before
            dist.barrier(group=gloo)
        # Every rank must have decided alike (a skip is torch's, the same on every rank).
        flag = torch.tensor([0 if reason is None else 1])
        dist.all_reduce(flag, group=gloo)
        if flag.item() not in (0, size):
            raise AssertionError(f"{name}: rank {rank}: the ranks disagree on whether torch supports the case")
        if reason is not None:
            skipped += 1
            if rank == 0:
                print(f"zero_fsdp_test: {name} skipped: {reason}", flush=True)
            continue
        if operations == 0:
            raise AssertionError(f"{name}: rank {rank}: the tutti run issued no operation on the tutti group")
        check(name, rank, size, gloo, start, results["tutti"], results["gloo"])
        dist.barrier(group=gloo)
        passed += 1
        if rank == 0:
            print(f"zero_fsdp_test: {name}: {what}: {STEPS} steps at p = {size} on torch {torch.__version__}: "
                  f"tutti's parameters equal gloo's ({agreement(size)}) and agree "
                  f"on every rank ({operations} operations over tutti): passed", flush=True)
    dist.barrier(group=gloo)
    if rank == 0:
        print(f"zero_fsdp_test: {passed} cases passed, {skipped} skipped at p = {size} on torch {torch.__version__}")
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 — report and fail this rank
        print(f"FAILED: {error}", file=sys.stderr)
        raise
