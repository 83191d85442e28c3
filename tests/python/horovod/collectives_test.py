"""tutti.horovod.torch's collectives under tutti-run -n P: every function, async handles, names
negotiated in different orders, fusion, Horovod's variables, the timeline.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 2 python3 tests/python/horovod/collectives_test.py
"""

import gc
import os
import tempfile

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness import check_equal, expect_error, run

# Horovod's variables, read by init(): a long cycle so that the many small tensors below are
# negotiated together, and a timeline (rank 0 writes it).
_timeline_dir = tempfile.mkdtemp(prefix="tutti-hvd-")
os.environ["HOROVOD_CYCLE_TIME"] = "5"
os.environ["HOROVOD_FUSION_THRESHOLD"] = str(1 << 20)
os.environ["HOROVOD_TIMELINE"] = os.path.join(_timeline_dir, "timeline.json")

import tutti._errors as errors  # noqa: E402
import tutti.horovod.torch as hvd  # noqa: E402

hvd.init()
P, R = hvd.size(), hvd.rank()

FLOATS = [torch.float32, torch.float64]
TYPES = FLOATS + [torch.int32, torch.int64, torch.float16, torch.uint8]


def data(rank, n, dtype, low=1, high=9):
    """Rank `rank`'s integer-valued input: the same on every rank that computes it."""
    g = torch.Generator().manual_seed(1000 * rank + n)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def expected_reduce(n, dtype, op):
    inputs = torch.stack([data(r, n, torch.int64, 1, 4 if op == hvd.Product else 9) for r in range(P)])
    if op == hvd.Sum:
        out = inputs.sum(0)
    elif op == hvd.Min:
        out = inputs.min(0).values
    elif op == hvd.Max:
        out = inputs.max(0).values
    elif op == hvd.Product:
        out = inputs.prod(0)
    elif dtype.is_floating_point:  # Average: sums of integers divided by 2 or 4 are exact
        return (inputs.to(torch.float64).sum(0) / P).to(dtype)
    else:
        out = torch.div(inputs.sum(0), P, rounding_mode="trunc")
    return out.to(dtype)


def test_topology():
    # tutti-run, or torchrun (python.horovod.collectives.torchrun_p3: hvd.init() through its store)
    size, rank = ("TUTTI_SIZE", "TUTTI_RANK") if "TUTTI_SIZE" in os.environ else ("WORLD_SIZE", "RANK")
    assert P == int(os.environ[size]) > 1 and R == int(os.environ[rank]), (P, R)
    # Every rank runs on this host.
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (R, P, 0, 1)
    assert hvd.is_initialized() and hvd.is_homogeneous()


def test_horovod_variables_set_engine_options():
    options = hvd._horovod.engine_options()
    assert options["cycle_time_us"] == 5000, options
    assert options["fusion_threshold"] == 1 << 20, options
    assert options["timeline"] == os.environ["HOROVOD_TIMELINE"], options


def test_allreduce_every_type_and_op():
    for dtype in TYPES:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            if dtype == torch.uint8 and op == hvd.Average:
                continue
            for n in (0, 1, P + 1, 1031):
                x = data(R, n, dtype, 1, 4 if op == hvd.Product else 9)
                before = x.clone()
                what = "allreduce %s op %d n %d" % (dtype, op, n)
                check_equal(hvd.allreduce(x, op=op), expected_reduce(n, dtype, op), what)
                check_equal(x, before, what + " (input)")
                y = x.clone()
                assert hvd.allreduce_(y, op=op) is y
                check_equal(y, expected_reduce(n, dtype, op), what + " in place")


def test_allreduce_average_default_and_deprecated_flag():
    x = data(R, 64, torch.float32)
    check_equal(hvd.allreduce(x), expected_reduce(64, torch.float32, hvd.Average), "default op")
    check_equal(hvd.allreduce(x, average=False), expected_reduce(64, torch.float32, hvd.Sum), "average=False")


def test_allreduce_scale_factors():
    x = data(R, 32, torch.float64)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    check_equal(out, expected_reduce(32, torch.float64, hvd.Sum), "prescale 2, postscale 0.5")


def test_allreduce_non_contiguous_in_place():
    base = data(R, 48, torch.float32).reshape(6, 8)
    view = base.t()  # not contiguous
    expected = expected_reduce(48, torch.float32, hvd.Sum).reshape(6, 8).t()
    hvd.allreduce_(view, op=hvd.Sum)
    check_equal(view, expected, "transposed view")


def test_async_handles_in_rank_dependent_order():
    # Rank r enqueues the names in another order than rank 0: the engine negotiates by name.
    names = ["async.%d" % i for i in range(8)]
    order = names if R % 2 == 0 else list(reversed(names))
    tensors = {n: data(R, 10 + i, torch.float32) + 1000 for i, n in enumerate(names)}
    for n in tensors:
        tensors[n][0] = -7.0  # poison check below: the result overwrites it
    handles = {n: hvd.allreduce_async_(tensors[n], name=n, op=hvd.Sum) for n in order}
    done = set()
    while len(done) < len(names):
        for n, h in handles.items():
            if n not in done and hvd.poll(h):
                done.add(n)
    for i, n in enumerate(names):
        want = torch.stack([data(r, 10 + i, torch.float32) + 1000 for r in range(P)])
        want[:, 0] = -7.0
        check_equal(hvd.synchronize(handles[n]), want.sum(0), n)


def test_out_of_place_async():
    h = hvd.allreduce_async(data(R, 100, torch.int64), op=hvd.Max)
    check_equal(hvd.synchronize(h), expected_reduce(100, torch.int64, hvd.Max), "allreduce_async")


def test_handle_keeps_the_tensor_memory():
    """An in-flight handle pins its tensor's storage (docs/python.md): resize_ raises and the
    storage outlives t.set_(...) until synchronize(); then both are undone."""
    t = data(R, 4096, torch.int64)
    h = hvd.allreduce_async_(t, name="lifetime.resize", op=hvd.Sum)
    expect_error(RuntimeError, lambda: t.resize_(1 << 20), "resiz")
    t.resize_(4096)  # torch set the new shape before it raised
    check_equal(hvd.synchronize(h), expected_reduce(4096, torch.int64, hvd.Sum), "allreduce after a refused resize_")
    t.resize_(1 << 20)  # allowed once synchronized
    t = data(R, 4096, torch.int64)
    old = StorageWeakRef(t.storage())
    h = hvd.allreduce_async_(t, name="lifetime.set", op=hvd.Sum)
    t.set_(torch.zeros(4, dtype=torch.int64))
    gc.collect()
    assert not old.expired(), "the storage was freed under a running allreduce"
    hvd.synchronize(h)
    gc.collect()
    assert old.expired(), "the storage is still held after synchronize()"


def test_fusion_of_many_small_tensors():
    tensors = [data(R, 1 + i % 17, torch.float32) for i in range(200)]
    # Enqueued within a cycle or two of 5 ms (about 2 ms here), they travel in fewer messages than
    # tensors (usually 1 to 3; how many depends on where the cycles fall). A rank starved of its
    # core while it enqueues (the test suite runs two tests at once on two cores) hands them over
    # one a cycle, as its peer waits and negotiates at once: then the ranks agree to try again,
    # up to three times; every result is checked each time.
    tries = []
    for attempt in range(3):
        hvd.barrier()  # the ranks enqueue at the same time, within a cycle or two
        before = hvd._horovod.stats()
        handles = [
            hvd.allreduce_async(t, name="small.%d.%d" % (attempt, i), op=hvd.Sum) for i, t in enumerate(tensors)
        ]
        for i, h in enumerate(handles):
            expected = expected_reduce(1 + i % 17, torch.float32, hvd.Sum)
            check_equal(hvd.synchronize(h), expected, "small.%d" % i)
        after = hvd._horovod.stats()
        assert after["tensors"] - before["tensors"] == 200, (before, after)
        calls = after["collectives"] - before["collectives"]
        tries.append((calls, before, after))
        # Every rank sees the same calls (they run the same fused collectives); agree all the same.
        fused = hvd.allreduce(torch.tensor([1 if calls < 200 else 0]), name="fused.%d" % attempt, op=hvd.Min)
        if int(fused[0]) == 1:
            break
    assert tries[-1][0] < 200, "200 small tensors took %s collective calls in %d tries: not fused (%s)" % (
        [t[0] for t in tries], len(tries), tries)


def test_allgather_different_first_dimensions():
    for dtype in (torch.float32, torch.int64, torch.uint8):
        for rows_of in (lambda r: r + 1, lambda r: 3, lambda r: 0 if r == 1 else 2 * r + 1):
            def block(r):
                n = rows_of(r)
                return (torch.arange(n * 3 * 2).reshape(n, 3, 2) + 100 * r).to(dtype) % 251
            expected = torch.cat([block(r) for r in range(P)])
            check_equal(hvd.allgather(block(R)), expected, "allgather %s" % dtype)
            h = hvd.allgather_async(block(R), name="gather.%s" % dtype)
            check_equal(hvd.synchronize(h), expected, "allgather_async %s" % dtype)


def test_allgather_async_in_rank_dependent_order():
    # An allgather has two phases; waiting on one must advance the others, or ranks that wait on
    # different handles first would wait for each other for ever.
    names = ["ag.%d" % i for i in range(5)]
    order = names if R % 2 == 0 else list(reversed(names))
    handles = {}
    for n in order:
        i = names.index(n)
        handles[n] = hvd.allgather_async(torch.full((R + i + 1, 2), float(R * 10 + i)), name=n)
    for n in reversed(order):
        i = names.index(n)
        expected = torch.cat([torch.full((r + i + 1, 2), float(r * 10 + i)) for r in range(P)])
        check_equal(hvd.synchronize(handles[n]), expected, n)


def test_broadcast_from_every_root():
    for root in range(P):
        x = data(R, 77, torch.float64)
        before = x.clone()
        check_equal(hvd.broadcast(x, root), data(root, 77, torch.float64), "broadcast root %d" % root)
        check_equal(x, before, "broadcast input")
        y = torch.full((77,), -1.0, dtype=torch.float64) if R != root else data(R, 77, torch.float64)
        assert hvd.broadcast_(y, root) is y
        check_equal(y, data(root, 77, torch.float64), "broadcast_ root %d" % root)
        h = hvd.broadcast_async(data(R, 5, torch.int32), root)
        check_equal(hvd.synchronize(h), data(root, 5, torch.int32), "broadcast_async")


def test_alltoall_with_and_without_splits():
    # Row k that rank s sends to rank d holds 1000*s + 100*d + k in both columns.
    def rows(s, d, n):
        k = torch.arange(n, dtype=torch.int64)
        return torch.stack([1000 * s + 100 * d + k] * 2, dim=1)

    def count(s, d):
        return (s + 2 * d) % 3

    send = torch.cat([rows(R, d, count(R, d)) for d in range(P)])
    splits = torch.tensor([count(R, d) for d in range(P)], dtype=torch.int32)
    out, received = hvd.alltoall(send, splits=splits)
    check_equal(out, torch.cat([rows(s, R, count(s, R)) for s in range(P)]), "alltoall with splits")
    check_equal(received, torch.tensor([count(s, R) for s in range(P)], dtype=torch.int32), "received splits")
    equal = torch.cat([rows(R, d, 2) for d in range(P)]).float()
    check_equal(hvd.alltoall(equal), torch.cat([rows(s, R, 2) for s in range(P)]).float(), "alltoall equal")
    h = hvd.alltoall_async(send, splits)
    out, _ = hvd.synchronize(h)
    check_equal(out, torch.cat([rows(s, R, count(s, R)) for s in range(P)]), "alltoall_async")


def test_objects():
    obj = {"rank": R, "list": list(range(R + 3)), "text": "x" * (100 * R)}
    got = hvd.broadcast_object(obj if R == P - 1 else None, root_rank=P - 1)
    assert got == {"rank": P - 1, "list": list(range(P + 2)), "text": "x" * (100 * (P - 1))}, got
    every = hvd.allgather_object(obj)
    assert every == [{"rank": r, "list": list(range(r + 3)), "text": "x" * (100 * r)} for r in range(P)]


def test_autograd():
    x = data(R, 6, torch.float32).requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum) * (R + 1)).sum().backward()
    # d/dx_R of sum_r (r+1) * sum_s x_s = sum_r (r+1)
    check_equal(x.grad, torch.full((6,), float(P * (P + 1) // 2)), "allreduce gradient")
    y = torch.ones(R + 1, 2, requires_grad=True)
    (hvd.allgather(y) * 2).sum().backward()
    check_equal(y.grad, torch.full((R + 1, 2), 2.0), "allgather gradient (averaged)")
    z = torch.full((3,), float(R)).requires_grad_()
    out = hvd.broadcast(z, root_rank=1)
    check_equal(out.detach(), torch.full((3,), 1.0), "broadcast forward")
    (out * 4).sum().backward()  # root gets the gradient averaged over ranks, the others zero
    check_equal(z.grad, torch.full((3,), 4.0 if R == 1 else 0.0), "broadcast gradient")


def test_join_and_barrier():
    hvd.barrier()
    last = hvd.join()
    assert 0 <= last < P, last
    assert hvd.join() in range(P)


def test_no_handle_left_in_flight():
    assert hvd._horovod.pending() == 0, hvd._horovod.pending()
    assert isinstance(hvd.Compression.fp16.compress(torch.ones(1))[0], torch.Tensor)
    assert issubclass(errors.Unsupported, errors.Error)


def test_timeline_written_at_shutdown():
    hvd.allreduce(torch.ones(3), name="timeline.marker")
    hvd.shutdown()
    if R == 0:
        with open(os.environ["HOROVOD_TIMELINE"]) as f:
            text = f.read()
        assert "timeline.marker" in text, text[:400]


run(globals(), lambda: R)
