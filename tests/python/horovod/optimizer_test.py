"""tutti.horovod.torch's training helpers under tutti-run -n P: broadcast_parameters,
broadcast_optimizer_state, DistributedOptimizer (against a single process on the whole batch),
backward_passes_per_step, fp16 compression, op Sum, Adasum refused.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 2 python3 tests/python/horovod/optimizer_test.py
"""

import torch

from harness import check_equal, expect_error, run

import tutti._errors as errors  # noqa: E402
import tutti.horovod.torch as hvd  # noqa: E402

hvd.init()
P, R = hvd.size(), hvd.rank()
torch.set_num_threads(1)


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))


def batch(rows):
    """The whole batch (the same on every rank): integer-valued inputs and targets."""
    g = torch.Generator().manual_seed(7)
    return (torch.randint(-3, 4, (rows, 8), generator=g).float(), torch.randint(-2, 3, (rows, 3), generator=g).float())


def shard(x, rows_per_rank):
    return x[R * rows_per_rank:(R + 1) * rows_per_rank]


def same_on_every_rank(tensor, what):
    """Every rank's tensor equals rank 0's, bit for bit."""
    every = hvd.allgather(tensor.detach().reshape(1, -1))
    for r in range(P):
        check_equal(every[r], every[0], "%s: rank %d against rank 0" % (what, r))


def test_broadcast_parameters_from_last_rank():
    root = P - 1
    m = model(seed=R)
    hvd.broadcast_parameters(m.state_dict(), root_rank=root)
    for (name, got), (_, want) in zip(m.state_dict().items(), model(seed=root).state_dict().items()):
        check_equal(got, want, "state_dict " + name)
    m = model(seed=R)
    hvd.broadcast_parameters(list(m.named_parameters()), root_rank=0)
    for (name, got), (_, want) in zip(m.named_parameters(), model(seed=0).named_parameters()):
        check_equal(got.detach(), want.detach(), "named_parameters " + name)


def one_step(optimizer_class, seed, **options):
    """A model and optimizer that took one step on a seed-dependent gradient."""
    m = model(seed)
    opt = optimizer_class(m.parameters(), **options)
    x, y = batch(4)
    torch.nn.functional.mse_loss(m(x * seed), y).backward()
    opt.step()
    return m, opt


def test_broadcast_optimizer_state_sgd_and_adam():
    root = P - 1
    for cls, options in ((torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.Adam, dict(lr=0.01))):
        if R == root:
            m, opt = one_step(cls, seed=5, **options)
        else:  # no state yet, other settings
            m = model(R)
            opt = cls(m.parameters(), **dict(options, lr=0.5))
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        _, want = one_step(cls, seed=5, **options)
        assert opt.param_groups[0]["lr"] == options["lr"], opt.param_groups[0]
        got_state, want_state = opt.state_dict()["state"], want.state_dict()["state"]
        assert sorted(got_state) == sorted(want_state), (sorted(got_state), sorted(want_state))
        for index in want_state:
            for key, value in want_state[index].items():
                if torch.is_tensor(value):
                    check_equal(got_state[index][key], value, "%s state %d %s" % (cls.__name__, index, key))
                else:
                    assert got_state[index][key] == value, (key, got_state[index][key], value)


def train(distributed, steps, rows_per_rank, passes=1, compression=hvd.Compression.none, op=hvd.Average):
    """SGD with momentum on the MSE of the batch. Distributed: each rank's shard, split into
    `passes` backward passes (each scaled by 1/passes, so that their sum is the shard's mean
    gradient). Otherwise: the whole batch in one process."""
    m = model(seed=11)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    x, y = batch(rows_per_rank * P)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), compression=compression,
                                       backward_passes_per_step=passes, op=op)
        x, y = shard(x, rows_per_rank), shard(y, rows_per_rank)
    for _ in range(steps):
        opt.zero_grad()
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            (torch.nn.functional.mse_loss(m(xs), ys) / passes).backward()
        opt.step()
    return m


def close(got, want, tolerance, what):
    error = ((got - want).abs().max() / want.abs().max().clamp(min=1)).item()
    if error > tolerance:
        raise AssertionError("%s: relative error %.3g over %.3g" % (what, error, tolerance))


def test_distributed_optimizer_equals_one_process_on_the_whole_batch():
    got = train(True, steps=4, rows_per_rank=6)
    want = train(False, steps=4, rows_per_rank=6)
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        same_on_every_rank(p, name)
        # The mean of the ranks' shard means is the whole batch's mean, summed in another order:
        # a few float32 roundings apart after four steps.
        close(p.detach(), q.detach(), 1e-5, name)


def test_backward_passes_per_step_reduces_once_per_step():
    before = hvd._horovod.stats()
    got = train(True, steps=3, rows_per_rank=8, passes=2)
    after = hvd._horovod.stats()
    want = train(False, steps=3, rows_per_rank=8)
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        same_on_every_rank(p, name)
        close(p.detach(), q.detach(), 1e-5, name)
    # 4 gradients per step, 3 steps: one allreduce each per step, not one per backward pass (the
    # same_on_every_rank allgathers above come after `after`).
    assert after["tensors"] - before["tensors"] == 12, (before, after)


def test_fp16_compression():
    x = torch.arange(40, dtype=torch.float32) * (R + 1) - 7  # |sums| < 2048: exact in float16
    want = torch.stack([torch.arange(40, dtype=torch.float32) * (r + 1) - 7 for r in range(P)]).sum(0)
    check_equal(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16), want, "fp16 allreduce")
    got = train(True, steps=3, rows_per_rank=6, compression=hvd.Compression.fp16)
    want = train(False, steps=3, rows_per_rank=6)
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        same_on_every_rank(p, name)
        assert p.grad.dtype == torch.float32
        # Gradients rounded to float16 (11 bits) before the sum: a relative error near 1e-3.
        close(p.detach(), q.detach(), 1e-2, name)


def test_op_sum():
    got = train(True, steps=1, rows_per_rank=4, op=hvd.Sum)
    m = model(seed=11)
    x, y = batch(4 * P)
    torch.nn.functional.mse_loss(m(x), y).backward()  # mean over P*4 rows; Sum of shard means is P times it
    for (name, p), (_, q) in zip(got.named_parameters(), m.named_parameters()):
        close(p.grad, q.grad * P, 1e-5, name)


def test_synchronize_then_skip_synchronize():
    # Horovod's pattern for clipping: synchronize(), work on the reduced gradients, then step()
    # inside skip_synchronize(), which must not reduce them again.
    m = model(seed=11)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05), named_parameters=m.named_parameters())
    x, y = batch(4 * P)
    torch.nn.functional.mse_loss(m(shard(x, 4)), shard(y, 4)).backward()
    opt.synchronize()
    reference = model(seed=11)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    for (name, p), (_, q) in zip(m.named_parameters(), reference.named_parameters()):
        close(p.grad, q.grad, 1e-5, name + " gradient after synchronize()")
    before = hvd._horovod.stats()["tensors"]
    with opt.skip_synchronize():
        opt.step()
    assert hvd._horovod.stats()["tensors"] == before, "step() in skip_synchronize() reduced again"


def test_refusals():
    m = model(0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    expect_error(errors.Unsupported, lambda: hvd.DistributedOptimizer(opt, op=hvd.Adasum), "Adasum")
    expect_error(errors.Unsupported, lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "Adasum")
    expect_error(errors.InvalidArgument, lambda: hvd.DistributedOptimizer(opt, named_parameters=[("a", p) for p in
                                                                                               m.parameters()]),
                 "duplicate")
    expect_error(errors.InvalidArgument,
                 lambda: hvd.DistributedOptimizer(opt, named_parameters=list(m.named_parameters())[:1]), "lacks")
    d = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters())
    assert isinstance(d, torch.optim.SGD)
    torch.nn.functional.mse_loss(m(batch(2)[0]), batch(2)[1]).backward()
    # backward's hooks have enqueued every gradient's allreduce already, before step().
    assert hvd._horovod.pending() == 4, hvd._horovod.pending()
    expect_error(AssertionError, d.zero_grad, "before step")
    d.step()


run(globals(), lambda: R)
