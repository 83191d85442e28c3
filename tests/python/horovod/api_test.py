"""The parts of Horovod 0.28's PyTorch API added after the first ones, under tutti-run -n P:
reducescatter, grouped operations, process sets, int16, integer scale factors, shape mismatches,
alltoall's gradient, sparse allreduce, Horovod's stall and log variables, the dynamic timeline.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 2 python3 tests/python/horovod/api_test.py
"""

import json
import os
import shutil
import tempfile

import torch

from harness import check_equal, expect_error, run

os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = "7.5"
os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = "40"
os.environ["HOROVOD_LOG_LEVEL"] = "warning"
os.environ["HOROVOD_CACHE_CAPACITY"] = "1024"
os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # Horovod's "started later": no timeline file here

import tutti  # noqa: E402
import tutti._errors as errors  # noqa: E402
import tutti.horovod  # noqa: E402
import tutti.horovod.torch as hvd  # noqa: E402

hvd.init()
P, R = hvd.size(), hvd.rank()


def rows(rank, n, width, dtype):
    """Rank `rank`'s integer-valued (n, width) input."""
    g = torch.Generator().manual_seed(100 * rank + n)
    return torch.randint(-9, 10, (n, width), generator=g).to(dtype)


def split_of(n, size, index):
    """Horovod's reducescatter split: n // size rows each, one more for the first n % size."""
    base, extra = divmod(n, size)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def test_settings():
    options = hvd._horovod.engine_options()
    assert options["stall_warning_ms"] == 7500 and options["stall_error_ms"] == 40000, options
    assert options["timeline"] == "", options
    assert os.environ["TUTTI_DEBUG"] == "warn"
    assert hvd.__version__ == tutti.__version__ == tutti.horovod.__version__
    assert hvd.global_process_set.ranks == list(range(P)) and hvd.global_process_set.process_set_id == 0


def test_reducescatter():
    for n in (0, 1, P - 1, P + 1, 4 * P, 31):
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.int16):
            inputs = [rows(r, n, 3, dtype) for r in range(P)]
            total = torch.stack([t.to(torch.int64) for t in inputs]).sum(0)
            offset, count = split_of(n, P, R)
            out = hvd.reducescatter(inputs[R], op=hvd.Sum)
            check_equal(out, total[offset:offset + count].to(dtype), "reducescatter sum %s n=%d" % (dtype, n))
            average = hvd.reducescatter(inputs[R] * P, name="rs.avg.%s.%d" % (dtype, n))  # op Average by default
            check_equal(average, total[offset:offset + count].to(dtype), "reducescatter average %s" % dtype)
    expect_error(errors.InvalidArgument, lambda: hvd.reducescatter(torch.ones(4), op=hvd.Max), "Average or Sum")
    expect_error(hvd.HorovodInternalError, lambda: hvd.reducescatter(torch.tensor(1.0)), "scalar")


def test_reducescatter_async_and_scale():
    t = torch.full((2 * P, 2), 10, dtype=torch.int32)
    handle = hvd.reducescatter_async(t, op=hvd.Sum, prescale_factor=0.55, postscale_factor=1.5)
    # Integers are scaled in float64 and truncated, before (5 each) and after (5 P × 1.5) the sum.
    check_equal(hvd.synchronize(handle), torch.full((2, 2), int(5 * P * 1.5), dtype=torch.int32), "scaled")


def test_integer_scale_factors():
    t = torch.full((5,), 7, dtype=torch.int64)
    check_equal(hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5), torch.full((5,), 3 * P), "prescale")
    check_equal(hvd.allreduce(t, op=hvd.Sum, postscale_factor=0.5), torch.full((5,), int(7 * P * 0.5)), "post")
    u = t.clone()
    hvd.allreduce_(u, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    check_equal(u, torch.full((5,), int(14 * P * 0.25)), "in place")


def test_int16():
    t = torch.tensor([30000, -5, 7], dtype=torch.int16)
    # Sums wrap modulo 2^16 as int16's own would.
    check_equal(hvd.allreduce(t, op=hvd.Sum), (t.to(torch.int64) * P).to(torch.int16), "int16 sum")
    check_equal(hvd.allreduce(t + R, op=hvd.Max), t + (P - 1), "int16 max")
    gathered = hvd.allgather(torch.full((R + 1, 2), R, dtype=torch.int16))
    check_equal(gathered, torch.cat([torch.full((r + 1, 2), r, dtype=torch.int16) for r in range(P)]), "gather")
    check_equal(hvd.broadcast(torch.full((3,), R, dtype=torch.int16), root_rank=P - 1),
                torch.full((3,), P - 1, dtype=torch.int16), "broadcast")
    b = torch.full((3,), R, dtype=torch.int16)
    hvd.broadcast_(b, root_rank=0)
    check_equal(b, torch.zeros(3, dtype=torch.int16), "broadcast_")
    out = hvd.alltoall(torch.full((P,), R, dtype=torch.int16))
    check_equal(out, torch.arange(P, dtype=torch.int16), "alltoall")


def test_shape_mismatch_raises_on_every_rank():
    shape = (6, 4) if R == 0 else (4, 6)  # the same count, another shape
    e = expect_error(errors.Mismatch, lambda: hvd.allreduce(torch.ones(shape), name="shape.mismatch"),
                     "shape.mismatch", "[6, 4]", "[4, 6]")
    assert isinstance(e, RuntimeError)
    check_equal(hvd.allreduce(torch.ones(2, 3), name="shape.after", op=hvd.Sum), torch.full((2, 3), float(P)),
                "the job goes on")


def test_duplicate_name():
    handle = hvd.allreduce_async(torch.ones(3), name="dup")
    expect_error(ValueError, lambda: hvd.allreduce_async(torch.ones(3), name="dup"), "dup", "already in flight")
    check_equal(hvd.synchronize(handle), torch.ones(3), "the first one")
    check_equal(hvd.allreduce(torch.ones(3), name="dup"), torch.ones(3), "reused once synchronized")


def test_grouped():
    tensors = [torch.full((k + 1,), float(R + k)) for k in range(5)]
    summed = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for k, s in enumerate(summed):
        check_equal(s, torch.full((k + 1,), float(sum(r + k for r in range(P)))), "grouped_allreduce %d" % k)
    copies = [t.clone() for t in tensors]
    hvd.grouped_allreduce_(copies, op=hvd.Max, name="grouped.max")
    for k, c in enumerate(copies):
        check_equal(c, torch.full((k + 1,), float(P - 1 + k)), "grouped_allreduce_ %d" % k)
    handle = hvd.grouped_allgather_async([torch.full((R + 1,), R), torch.full((1, 2), R)])
    assert hvd.poll(handle) in (True, False)
    first, second = hvd.synchronize(handle)
    check_equal(first, torch.cat([torch.full((r + 1,), r) for r in range(P)]), "grouped_allgather 0")
    check_equal(second, torch.cat([torch.full((1, 2), r) for r in range(P)]), "grouped_allgather 1")
    blocks = hvd.grouped_reducescatter([torch.arange(2 * P, dtype=torch.int64), torch.ones(P, 2)], op=hvd.Sum)
    check_equal(blocks[0], torch.arange(2 * R, 2 * R + 2) * P, "grouped_reducescatter 0")
    check_equal(blocks[1], torch.full((1, 2), float(P)), "grouped_reducescatter 1")


def test_gradients():
    x = torch.arange(2.0 * P).requires_grad_()
    hvd.reducescatter(x, op=hvd.Sum).sum().backward()
    check_equal(x.grad, torch.full((2 * P,), float(P)), "reducescatter Sum gradient")
    rows_sent = torch.arange(P, dtype=torch.float64).repeat_interleave(R + 1).reshape(-1, 1).requires_grad_()
    out, received = hvd.alltoall(rows_sent, splits=torch.full((P,), R + 1, dtype=torch.int32))
    check_equal(received, torch.arange(1, P + 1, dtype=torch.int32), "received splits")
    (out * torch.arange(1, out.shape[0] + 1, dtype=torch.float64).reshape(-1, 1)).sum().backward()
    # Row i of what rank j received from this rank came back with weight (its index there) + 1.
    expected = []
    for j in range(P):
        start = sum(r + 1 for r in range(R))  # rows rank j received from ranks before this one
        expected += [start + k + 1 for k in range(R + 1)]
    check_equal(rows_sent.grad, torch.tensor(expected, dtype=torch.float64).reshape(-1, 1), "alltoall gradient")
    ys = [torch.full((2,), float(R)).requires_grad_() for _ in range(2)]
    outs = hvd.grouped_allreduce(ys, op=hvd.Sum)
    (outs[0] * 2 + outs[1]).sum().backward()
    check_equal(ys[0].grad, torch.full((2,), 2.0 * P), "grouped gradient 0")
    check_equal(ys[1].grad, torch.full((2,), float(P)), "grouped gradient 1")


def test_sparse_allreduce():
    dense = torch.zeros(6, 2)
    dense[R % 6] = R + 1
    dense[5] = 1
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Sum)
    expected = torch.zeros(6, 2)
    for r in range(P):
        expected[r % 6] += r + 1
        expected[5] += 1
    check_equal(handle().to_dense(), expected, "sparse sum")


def test_process_sets():
    evens = hvd.add_process_set([r for r in range(P) if r % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([r for r in range(P) if r % 2 == 1]))
    mine, other = (evens, odds) if R % 2 == 0 else (odds, evens)
    assert mine.included() and not other.included() and mine.size() == len(mine.ranks)
    assert mine.rank() == mine.ranks.index(R)
    expect_error(ValueError, lambda: hvd.add_process_set(list(range(P))), "duplicate")
    expect_error(errors.InvalidArgument, lambda: hvd.allreduce(torch.ones(1), process_set=other), "not a member")
    # The same name in both sets: each set negotiates its own.
    summed = hvd.allreduce(torch.full((3,), float(R)), name="ps.sum", op=hvd.Sum, process_set=mine)
    check_equal(summed, torch.full((3,), float(sum(mine.ranks))), "allreduce in the set")
    gathered = hvd.allgather(torch.full((1,), R), process_set=mine)
    check_equal(gathered, torch.tensor(mine.ranks), "allgather in the set, in its rank order")
    root = mine.ranks[-1]  # a job rank
    check_equal(hvd.broadcast(torch.full((2,), R), root_rank=root, process_set=mine), torch.full((2,), root),
                "broadcast from a job rank")
    check_equal(hvd.reducescatter(torch.ones(2 * mine.size()), op=hvd.Sum, process_set=mine),
                torch.full((2,), float(mine.size())), "reducescatter in the set")
    check_equal(hvd.alltoall(torch.full((mine.size(),), R), process_set=mine), torch.tensor(mine.ranks),
                "alltoall in the set")
    hvd.barrier(process_set=mine)
    # DistributedOptimizer over the set: equal parameters within it after a step.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)  # the same on every rank; the inputs differ
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=mine)
    model(torch.full((2, 3), float(R))).sum().backward()
    opt.step()
    weights = hvd.allgather(model.weight.detach(), process_set=mine)
    for k in range(mine.size()):
        check_equal(weights[k], weights[0], "weights equal within the set")
    hvd.barrier()
    assert hvd.remove_process_set(odds)
    assert hvd.remove_process_set(evens) and not hvd.remove_process_set(hvd.global_process_set)
    assert evens.process_set_id is None
    expect_error(errors.InvalidArgument, lambda: hvd.allreduce(torch.ones(1), process_set=evens), "removed")
    assert hvd._horovod.process_set_ids() == [0]


def test_join():
    # Rank 0 runs out of data first: the others' allreduces go on with zeros from it, their
    # allgathers fail, and join() returns the rank that joined last on every rank.
    if R == 0:
        last = hvd.join()
    else:
        t = torch.full((4, 2), 10 * R, dtype=torch.int64)
        check_equal(hvd.allreduce(t, name="join.sum", op=hvd.Sum), torch.full((4, 2), 10 * sum(range(P))),
                    "allreduce with a joined rank")
        check_equal(hvd.allreduce(t.double(), name="join.avg"), torch.full((4, 2), 10.0 * sum(range(P)) / P,
                                                                           dtype=torch.float64), "average over P")
        expect_error(errors.Mismatch, lambda: hvd.allgather(torch.ones(1), name="join.gather"), "rank 0 joined")
        last = hvd.join()
    lasts = hvd.allgather_object(last)
    assert lasts == [last] * P and last != 0, lasts
    check_equal(hvd.allreduce(torch.ones(2), name="join.after", op=hvd.Sum), torch.full((2,), float(P)), "after")


def _timeline(path):
    """A timeline file, which must be complete JSON: {lane: its phases}, and its cycle markers."""
    with open(path) as f:
        events = json.load(f)
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    phases = {}
    for e in events:
        if e["ph"] == "X":
            phases.setdefault(lanes[e["tid"]], set()).add(e["name"])
    return phases, sum(1 for e in events if e["ph"] == "i" and e["name"] == "CYCLE_START")


def _allreduces(prefix, n):
    for i in range(n):
        check_equal(hvd.allreduce(torch.full((5,), float(R)), name="%s.%d" % (prefix, i), op=hvd.Sum),
                    torch.full((5,), float(sum(range(P)))), "allreduce %s.%d" % (prefix, i))


def test_dynamic_timeline():
    # HOROVOD_TIMELINE=DYNAMIC above: no file until start_timeline(). Rank 0 writes it.
    directory = tempfile.mkdtemp(prefix="tutti-hvd-timeline-")
    first, second = os.path.join(directory, "first.json"), os.path.join(directory, "second.json")
    _allreduces("tl.before", 1)
    hvd.start_timeline(first)
    _allreduces("tl.first", 3)
    check_equal(hvd.broadcast(torch.full((2,), float(R)), root_rank=P - 1, name="tl.first.bcast"),
                torch.full((2,), float(P - 1)), "broadcast")
    hvd.stop_timeline()
    if R == 0:
        phases, marks = _timeline(first)  # complete while the job goes on
        assert all("ALLREDUCE" in phases.get("tl.first.%d" % i, ()) for i in range(3)), phases
        assert "BROADCAST" in phases.get("tl.first.bcast", ()), phases
        assert "tl.before.0" not in phases and marks == 0, (phases, marks)
        with open(first) as f:
            first_text = f.read()
    else:
        assert os.listdir(directory) == [], os.listdir(directory)
    _allreduces("tl.between", 1)
    hvd.stop_timeline()  # none running: nothing to do

    hvd.start_timeline(second, mark_cycles=True)
    _allreduces("tl.second", 2)
    hvd.stop_timeline()
    _allreduces("tl.after", 1)
    if R == 0:
        phases, marks = _timeline(second)
        assert all("ALLREDUCE" in phases.get("tl.second.%d" % i, ()) for i in range(2)), phases
        assert not [lane for lane in phases if lane.startswith(("tl.first", "tl.between", "tl.after"))], phases
        assert marks >= 1, marks
        with open(first) as f:
            assert f.read() == first_text, "the first timeline changed after stop_timeline()"

    # Starting while one runs closes it and switches; "{rank}": every rank writes its own.
    third, per_rank = os.path.join(directory, "third.json"), os.path.join(directory, "rank{rank}.json")
    hvd.start_timeline(third)
    _allreduces("tl.third", 1)
    hvd.start_timeline(per_rank)
    _allreduces("tl.fourth", 1)
    hvd.stop_timeline()
    phases, _ = _timeline(os.path.join(directory, "rank%d.json" % R))
    assert "ALLREDUCE" in phases.get("tl.fourth.0", ()) and "tl.third.0" not in phases, phases
    if R == 0:
        phases, _ = _timeline(third)
        assert "ALLREDUCE" in phases.get("tl.third.0", ()) and "tl.fourth.0" not in phases, phases

    expect_error(errors.InvalidArgument, lambda: hvd.start_timeline(""), "empty")
    missing = os.path.join(directory, "missing", "x.json")
    if R == 0:  # the rank that opens it
        expect_error(ValueError, lambda: hvd.start_timeline(missing), missing)
    else:
        hvd.start_timeline(missing)
    hvd.stop_timeline()
    shutil.rmtree(directory)


def test_no_handle_left_in_flight():
    assert hvd._horovod.pending() == 0, hvd._horovod.pending()


run(globals(), lambda: R)
