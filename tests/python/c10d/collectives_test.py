"""Every collective of the torch.distributed backend "tutti", checked exactly on every rank.

Run one process per rank, under tutti-run, torchrun (env://) or mpirun (with MASTER_ADDR and
MASTER_PORT): tutti.distributed.init_process_group() finds the rendezvous. Data are integer-valued
(sums exact in every type), outputs are poisoned first, and every element is compared. Each check
prints nothing when it passes; the first failure raises with the rank and the check's name, and
the script exits 1. The last line on rank 0 counts the checks.
"""

import functools
import gc
import json
import operator
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef

import tutti
import tutti.distributed

POISON = -7
TORCH_MAJOR = int(torch.__version__.split(".")[0])
TYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

checks = 0


def expect_equal(name, got, want):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"rank {RANK}: {name}: got {got.tolist()} ({got.dtype}), want {want.tolist()} ({want.dtype})")


def expect_raises(name, kind, text, call):
    global checks
    checks += 1
    try:
        call()
    except kind as e:
        if text not in str(e):
            raise AssertionError(f"rank {RANK}: {name}: message '{e}' lacks '{text}'") from e
        return
    raise AssertionError(f"rank {RANK}: {name}: no {kind.__name__} raised")


def data(rank, n, dtype, offset=0):
    """Rank `rank`'s input: small integers that differ by rank and element."""
    values = (torch.arange(n, dtype=torch.int64) + rank + offset) % 5 + 1
    return values.to(dtype)


def check_allreduce():
    n = 13
    for dtype in TYPES:
        inputs = [data(r, n, torch.int64) for r in range(P)]
        stacked = torch.stack(inputs)
        # (ReduceOp values are not hashable in torch 1.13: a list, not a dict.)
        cases = (
            ("SUM", dist.ReduceOp.SUM, stacked.sum(0)),
            ("MIN", dist.ReduceOp.MIN, stacked.min(0).values),
            ("MAX", dist.ReduceOp.MAX, stacked.max(0).values),
            ("PRODUCT", dist.ReduceOp.PRODUCT, torch.stack([(x % 2) + 1 for x in inputs]).prod(0)),
        )
        for name, op, want in cases:
            source = inputs[RANK] % 2 + 1 if name == "PRODUCT" else inputs[RANK]
            t = source.to(dtype).clone()  # .to() of the same type is no copy
            dist.all_reduce(t, op=op)
            expect_equal(f"allreduce {name} {dtype}", t, want.to(dtype))
    for dtype in FLOATS:  # AVG: the sum of small multiples of P divided by P is exact
        t = (data(RANK, n, torch.int64) * P).to(dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        expect_equal(f"allreduce AVG {dtype}", t, torch.stack([data(r, n, torch.int64) for r in range(P)]).sum(0).to(dtype))
    # Bool: SUM and BOR are "any", PRODUCT and BAND "all".
    flags = [torch.tensor([r == 0, True, False, r % 2 == 1]) for r in range(P)]
    any_, all_ = torch.stack(flags).any(0), torch.stack(flags).all(0)
    for name, want in (("SUM", any_), ("BOR", any_), ("MAX", any_), ("PRODUCT", all_), ("BAND", all_), ("MIN", all_)):
        t = flags[RANK].clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        expect_equal(f"allreduce {name} bool", t, want)
    # A non-contiguous tensor: reduced through a contiguous copy, written back; the rest untouched.
    base = torch.full((4, 6), POISON, dtype=torch.int32)
    view = base[:, ::2]
    view.copy_(data(RANK, 12, torch.int32).view(4, 3))
    dist.all_reduce(view)
    expect_equal("allreduce non-contiguous", view,
                 torch.stack([data(r, 12, torch.int32) for r in range(P)]).sum(0).to(torch.int32).view(4, 3))
    expect_equal("allreduce non-contiguous, the rest", base[:, 1::2], torch.full((4, 3), POISON, dtype=torch.int32))
    # Zero elements, and a 0-d tensor.
    empty = torch.empty(0)
    dist.all_reduce(empty)
    expect_equal("allreduce empty", empty, torch.empty(0))
    scalar = torch.tensor(RANK + 1, dtype=torch.int64)
    dist.all_reduce(scalar)
    expect_equal("allreduce 0-d", scalar, torch.tensor(P * (P + 1) // 2))


def sparse_input(rank, dtype, hybrid=False):
    """Rank `rank`'s uncoalesced COO tensor of sizes (9,) or (9, 3): rows {rank, rank + 2, 7}, row 7
    given twice (a duplicate the allreduce sums); in the hybrid one, none on the last rank."""
    if hybrid and rank == P - 1:
        rows = []
    else:
        rows = [rank % 9, (rank + 2) % 9, 7, 7]
    n = len(rows)
    values = data(rank, n * 3 if hybrid else n, torch.int64).view(n, 3) if hybrid else data(rank, n, torch.int64)
    return torch.sparse_coo_tensor(torch.tensor([rows], dtype=torch.int64).view(1, n), values.to(dtype),
                                   (9, 3) if hybrid else (9,))


def sparse_sum(tensors):
    """The coalesced sum of sparse tensors: what Gloo's sparse allreduce gives (indices: the union)."""
    return functools.reduce(operator.add, tensors).coalesce()


def expect_sparse(name, got, want):
    """`got` is the coalesced sparse tensor `want` (coalesced): same sizes, dims, indices and values."""
    expect_equal(f"{name}: sparse and coalesced", torch.tensor([got.is_sparse, got.is_coalesced()]),
                 torch.tensor([True, True]))
    expect_equal(f"{name}: sizes", torch.tensor(list(got.shape) + [got.sparse_dim(), got.dense_dim()]),
                 torch.tensor(list(want.shape) + [want.sparse_dim(), want.dense_dim()]))
    expect_equal(f"{name}: indices", got._indices(), want._indices())
    expect_equal(f"{name}: values", got._values(), want._values())
    expect_equal(f"{name}: dense", got.to_dense(), want.to_dense())


def check_sparse_allreduce():
    """A sparse COO tensor's allreduce (SUM only, as Gloo): the caller's tensor becomes the coalesced
    sum, whose indices are the union of the ranks' (docs/torch-distributed.md)."""
    for dtype in (torch.float32, torch.int64):
        for hybrid in (False, True):
            t = sparse_input(RANK, dtype, hybrid)
            dist.all_reduce(t)
            want = sparse_sum([sparse_input(r, dtype, hybrid) for r in range(P)])
            expect_sparse(f"sparse allreduce {dtype}{' hybrid' if hybrid else ''}", t, want)
    # Two sparse dimensions (row-major over them) and a dense one; nonblocking, with its future.
    def grid(rank):
        indices = torch.tensor([[rank % 4, 3, 0], [rank % 5, 4, 0]], dtype=torch.int64)
        return torch.sparse_coo_tensor(indices, data(rank, 6, torch.float64).view(3, 2), (4, 5, 2))
    t = grid(RANK)
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    work.wait()
    want = sparse_sum([grid(r) for r in range(P)])
    expect_sparse("sparse allreduce 2 sparse dims, async", t, want)
    expect_sparse("sparse allreduce's future", future.wait()[0], want)
    # Every rank with nothing.
    t = torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.int64), torch.empty(0), (5,))
    dist.all_reduce(t)
    expect_sparse("sparse allreduce nnz 0", t, torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.int64),
                                                                       torch.empty(0), (5,)).coalesce())
    # Refused: other ops, locally (nothing issued); sizes that differ, on every rank.
    t = sparse_input(RANK, torch.float32)
    expect_raises("sparse allreduce MAX", tutti.Unsupported, "ReduceOp.MAX",
                  lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
    expect_raises("sparse allreduce AVG", tutti.Unsupported, "ReduceOp.AVG",
                  lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG))
    for name, sizes in (("sizes", (9,) if RANK == 0 else (10,)),             # different dimensions
                        ("shapes", (2, 6) if RANK == 0 else (6, 2))):         # the same number of elements
        t = torch.sparse_coo_tensor(torch.tensor([[1], [1]]), torch.ones(1), sizes) if len(sizes) == 2 else \
            torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1), sizes)
        expect_raises(f"sparse allreduce of different {name}", tutti.Mismatch, "differ", lambda: dist.all_reduce(t))
    t = sparse_input(RANK, torch.int64)
    dist.all_reduce(t)  # still in step
    expect_sparse("sparse allreduce after a mismatch", t,
                  sparse_sum([sparse_input(r, torch.int64) for r in range(P)]))


def check_allreduce_coalesced():
    tensors = [data(RANK, n, torch.float32, n).view(-1) for n in (3, 1, 8)]
    dist.all_reduce_coalesced(tensors)
    for i, n in enumerate((3, 1, 8)):
        expect_equal(f"allreduce_coalesced {i}", tensors[i], torch.stack([data(r, n, torch.float32, n) for r in range(P)]).sum(0))


def check_broadcast():
    for root in range(P):
        for dtype in (torch.float32, torch.int8, torch.bool):
            t = data(root, 9, dtype) if RANK == root else torch.full((9,), POISON).to(dtype)
            dist.broadcast(t, src=root)
            expect_equal(f"broadcast root {root} {dtype}", t, data(root, 9, dtype))


def check_reduce():
    for root in range(P):
        for name, fold in (("SUM", lambda s: s.sum(0)), ("MAX", lambda s: s.max(0).values)):
            t = data(RANK, 7, torch.float64)
            dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, name))
            if RANK == root:
                expect_equal(f"reduce {name} root {root}", t, fold(torch.stack([data(r, 7, torch.float64) for r in range(P)])))


def check_allgather():
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        out = [torch.full((2, 3), POISON).to(dtype) for _ in range(P)]
        dist.all_gather(out, data(RANK, 6, dtype).view(2, 3))
        for r in range(P):
            expect_equal(f"allgather {dtype} block {r}", out[r], data(r, 6, dtype).view(2, 3))
    # Blocks of different sizes (rank r gives r + 1 elements): allgatherv.
    out = [torch.full((r + 1,), POISON, dtype=torch.int32) for r in range(P)]
    dist.all_gather(out, data(RANK, RANK + 1, torch.int32))
    for r in range(P):
        expect_equal(f"allgather uneven block {r}", out[r], data(r, r + 1, torch.int32))
    flat = torch.full((P * 5,), POISON, dtype=torch.float32)
    dist.all_gather_into_tensor(flat, data(RANK, 5, torch.float32))
    expect_equal("all_gather_into_tensor", flat, torch.cat([data(r, 5, torch.float32) for r in range(P)]))
    # Coalesced: output_lists[r][i] is rank r's input i.
    inputs = [data(RANK, 2, torch.int64, offset=10), data(RANK, 3, torch.int64, offset=20).view(3, 1)]
    outputs = [[torch.full((2,), POISON, dtype=torch.int64), torch.full((3, 1), POISON, dtype=torch.int64)]
               for _ in range(P)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(P):
        expect_equal(f"allgather_coalesced {r} 0", outputs[r][0], data(r, 2, torch.int64, offset=10))
        expect_equal(f"allgather_coalesced {r} 1", outputs[r][1], data(r, 3, torch.int64, offset=20).view(3, 1))
    flat = torch.full((P * 5,), POISON, dtype=torch.float32)
    dist._all_gather_base(flat, data(RANK, 5, torch.float32))
    expect_equal("_all_gather_base", flat, torch.cat([data(r, 5, torch.float32) for r in range(P)]))


def check_reduce_scatter():
    n = 4
    inputs = [data(RANK, n, torch.int64, offset=j) for j in range(P)]  # block j goes to rank j
    out = torch.full((n,), POISON, dtype=torch.int64)
    dist.reduce_scatter(out, inputs)
    expect_equal("reduce_scatter", out, torch.stack([data(r, n, torch.int64, offset=RANK) for r in range(P)]).sum(0))
    out = torch.full((n,), POISON, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.cat(inputs), op=dist.ReduceOp.MAX)
    expect_equal("reduce_scatter_tensor MAX", out,
                 torch.stack([data(r, n, torch.int64, offset=RANK) for r in range(P)]).max(0).values)
    out = torch.full((n,), POISON, dtype=torch.int64)
    dist._reduce_scatter_base(out, torch.cat(inputs))
    expect_equal("_reduce_scatter_base", out, torch.stack([data(r, n, torch.int64, offset=RANK) for r in range(P)]).sum(0))


def check_coalesced_tensors():
    """torch 2.x: all_gather_into_tensor and reduce_scatter_tensor under _coalescing_manager, which
    issue one allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced for all of them."""
    if TORCH_MAJOR < 2:
        return
    from torch.distributed.distributed_c10d import _coalescing_manager
    sizes = (3, 1, 6)
    inputs = [data(RANK, n, torch.int32, offset=10 * i) for i, n in enumerate(sizes)]
    outputs = [torch.full((P * n,), POISON, dtype=torch.int32) for n in sizes]
    outputs[2] = torch.full((P * 2, 3), POISON, dtype=torch.int32)  # not flat: filled in row order
    with _coalescing_manager(async_ops=True) as cm:
        for out, inp in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    for i, n in enumerate(sizes):
        want = torch.cat([data(r, n, torch.int32, offset=10 * i) for r in range(P)]).view(outputs[i].shape)
        expect_equal(f"allgather_into_tensor_coalesced {i}", outputs[i], want)
    inputs = [data(RANK, P * n, torch.int64, offset=7 * i) for i, n in enumerate(sizes)]
    outputs = [torch.full((n,), POISON, dtype=torch.int64) for n in sizes]
    with _coalescing_manager(async_ops=True) as cm:
        for out, inp in zip(outputs, inputs):
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
    cm.wait()
    for i, n in enumerate(sizes):
        want = torch.stack([data(r, P * n, torch.int64, offset=7 * i) for r in range(P)]).sum(0)[RANK * n:(RANK + 1) * n]
        expect_equal(f"reduce_scatter_tensor_coalesced {i}", outputs[i], want)

    # A pair whose big tensor is not P times its small one is refused on every rank, before any
    # rank sends: the message names the list, the index and both counts.
    def gather_one_too_many():
        with _coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(torch.empty(P * 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
            dist.all_gather_into_tensor(torch.empty(P * 3 + 1, dtype=torch.int32), torch.ones(3, dtype=torch.int32))
        cm.wait()

    def scatter_one_too_few():
        with _coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.int64), torch.ones(P * 2 - 1, dtype=torch.int64))
        cm.wait()

    expect_raises("allgather_into_tensor_coalesced, an output too large", tutti.InvalidArgument,
                  f"output[1] has {P * 3 + 1} elements, expected {P * 3}", gather_one_too_many)
    expect_raises("reduce_scatter_tensor_coalesced, an input too small", tutti.InvalidArgument,
                  f"input[0] has {P * 2 - 1} elements, expected {P * 2}", scatter_one_too_few)


def check_profiler():
    """The works' profiling titles reach torch.profiler and its Chrome trace, as Gloo's
    "gloo:all_reduce" does. With TRACE_DIR in the environment the trace stays there
    (trace-rankR.json), else in a temporary directory."""
    from torch.profiler import ProfilerActivity, profile
    t = data(RANK, 8, torch.float32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.barrier()
    names = {e.name for e in prof.events()}
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(os.environ.get("TRACE_DIR", scratch), f"trace-rank{RANK}.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)  # a list of events (torch 1.13), or an object with them (2.x)
        traced = {event.get("name") for event in (trace["traceEvents"] if isinstance(trace, dict) else trace)}
    for title in ("tutti:all_reduce", "tutti:broadcast", "tutti:barrier"):
        expect_equal(f"profiler event {title}", torch.tensor(title in names), torch.tensor(True))
        expect_equal(f"trace event {title}", torch.tensor(title in traced), torch.tensor(True))
    expect_equal("allreduce under the profiler", t, torch.stack([data(r, 8, torch.float32) for r in range(P)]).sum(0))


def check_gather_scatter():
    for root in range(P):
        gathered = [torch.full((3,), POISON, dtype=torch.float32) for _ in range(P)] if RANK == root else None
        dist.gather(data(RANK, 3, torch.float32), gather_list=gathered, dst=root)
        if RANK == root:
            for r in range(P):
                expect_equal(f"gather root {root} block {r}", gathered[r], data(r, 3, torch.float32))
        pieces = [data(root, 3, torch.int32, offset=r) for r in range(P)] if RANK == root else None
        out = torch.full((3,), POISON, dtype=torch.int32)
        dist.scatter(out, scatter_list=pieces, src=root)
        expect_equal(f"scatter root {root}", out, data(root, 3, torch.int32, offset=RANK))


def check_alltoall():
    # all_to_all_single, equal parts: block j of rank i goes to rank j as its block i.
    send = torch.cat([data(RANK, 2, torch.float32, offset=10 * j) for j in range(P)])
    out = torch.full((2 * P,), POISON, dtype=torch.float32)
    dist.all_to_all_single(out, send)
    expect_equal("all_to_all_single", out, torch.cat([data(i, 2, torch.float32, offset=10 * RANK) for i in range(P)]))
    # With split sizes along the first dimension: rank i sends i + j + 1 rows of 2 to rank j.
    in_splits = [RANK + j + 1 for j in range(P)]
    out_splits = [i + RANK + 1 for i in range(P)]
    send = torch.cat([data(RANK, 2 * s, torch.int64, offset=j).view(s, 2) for j, s in enumerate(in_splits)])
    out = torch.full((sum(out_splits), 2), POISON, dtype=torch.int64)
    dist.all_to_all_single(out, send, output_split_sizes=out_splits, input_split_sizes=in_splits)
    want = torch.cat([data(i, 2 * s, torch.int64, offset=RANK).view(s, 2) for i, s in enumerate(out_splits)])
    expect_equal("all_to_all_single with splits", out, want)
    # all_to_all on lists, blocks of different sizes.
    sends = [data(RANK, RANK + j + 1, torch.int32, offset=j) for j in range(P)]
    outs = [torch.full((i + RANK + 1,), POISON, dtype=torch.int32) for i in range(P)]
    dist.all_to_all(outs, sends)
    for i in range(P):
        expect_equal(f"all_to_all block {i}", outs[i], data(i, i + RANK + 1, torch.int32, offset=RANK))


def check_point_to_point():
    right, left = (RANK + 1) % P, (RANK - 1) % P
    for dtype in (torch.float32, torch.int64):
        got = torch.full((5,), POISON).to(dtype)
        if RANK % 2 == 0:
            dist.send(data(RANK, 5, dtype), dst=right, tag=3)
            sender = dist.recv(got, src=left, tag=3)
        else:
            sender = dist.recv(got, src=left, tag=3)
            dist.send(data(RANK, 5, dtype), dst=right, tag=3)
        expect_equal(f"send/recv {dtype}", got, data(left, 5, dtype))
        expect_equal("recv's sender", torch.tensor(sender), torch.tensor(left))
    got = torch.full((4,), POISON, dtype=torch.float64)
    works = [dist.irecv(got, src=left), dist.isend(data(RANK, 4, torch.float64), dst=right)]
    for w in works:
        w.wait()
    expect_equal("isend/irecv", got, data(left, 4, torch.float64))
    ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, data(RANK, 4, torch.float64, 1), right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    expect_equal("batch_isend_irecv", got, data(left, 4, torch.float64, 1))
    check_recv_from_any_source()


def check_recv_from_any_source():
    """dist.recv with src=None takes the first message from any rank and returns its sender: rank 0
    takes two messages from every other rank, each sender's in order, each message once."""
    if RANK != 0:
        for k in range(2):
            dist.send(data(RANK, 3, torch.int64, offset=k), dst=0, tag=7)
        return
    taken = {}
    for _ in range(2 * (P - 1)):
        got = torch.full((3,), POISON, dtype=torch.int64)
        sender = dist.recv(got, tag=7)
        k = taken.get(sender, 0)
        expect_equal(f"recv from any source: message {k} of rank {sender}", got, data(sender, 3, torch.int64, offset=k))
        taken[sender] = k + 1
    expect_equal("recv from any source: senders", torch.tensor(sorted(taken.items())),
                 torch.tensor([[r, 2] for r in range(1, P)]))


def check_async_and_futures():
    t = data(RANK, 6, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    want = torch.stack([data(r, 6, torch.float32) for r in range(P)]).sum(0)
    expect_equal("async allreduce", t, want)
    expect_equal("future.then", future.wait(), want * 2)
    expect_equal("is_completed", torch.tensor(work.is_completed()), torch.tensor(True))
    # Many in flight, waited in reverse: collectives complete in issue order.
    tensors = [data(RANK, 3, torch.int64, offset=i) for i in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(tensors):
        expect_equal(f"in flight {i}", x, torch.stack([data(r, 3, torch.int64, offset=i) for r in range(P)]).sum(0))
    dist.barrier()
    # Futures only: nobody calls wait, the progress thread completes them.
    futures = [dist.all_reduce(torch.ones(4) * (RANK + 1), async_op=True).get_future() for _ in range(3)]
    for f in torch.futures.collect_all(futures).wait():
        expect_equal("future only", f.value()[0], torch.full((4,), float(P * (P + 1) // 2)))


def check_buffer_lifetime():
    """A receive's tensor keeps its memory while its work runs (docs/python.md): rank 0 posts an
    irecv that rank 1 answers only once told to through the store; meanwhile resize_ raises and
    the storage outlives t.set_(...); once the work completed, both are undone."""
    store = dist.distributed_c10d._get_default_store()
    n = 1 << 16
    want = torch.arange(n, dtype=torch.int64) * 3 + 1
    for case in ("resize", "set"):
        if RANK == 0:
            t = torch.zeros(n, dtype=torch.int64)
            old = StorageWeakRef(t.storage())
            work = dist.irecv(t, src=1)
            if case == "resize":
                expect_raises("resize_ under irecv", RuntimeError, "resiz", lambda: t.resize_(16 * n))
                t.resize_(n)  # torch set the new shape before it raised
            else:
                t.set_(torch.zeros(4, dtype=torch.int64))
                gc.collect()
                expect_equal("storage alive under irecv after set_", torch.tensor(old.expired()), torch.tensor(False))
            store.set(f"lifetime/{case}", "go")
            work.wait()
            gc.collect()
            if case == "resize":
                expect_equal("irecv after a refused resize_", t, want)
                t.resize_(16 * n)  # allowed once the work completed
            else:
                expect_equal("storage released after irecv", torch.tensor(old.expired()), torch.tensor(True))
        elif RANK == 1:
            store.wait([f"lifetime/{case}"])
            dist.send(want, dst=0)
    dist.barrier()


def check_groups():
    evens = list(range(0, P, 2))
    group = dist.new_group(evens, backend="tutti")
    if RANK in evens:
        t = torch.tensor([RANK + 1], dtype=torch.int64)
        dist.all_reduce(t, group=group)
        expect_equal("new_group allreduce", t, torch.tensor([sum(r + 1 for r in evens)]))
        got = torch.full((1,), POISON, dtype=torch.int64)
        dist.broadcast(got if RANK != evens[-1] else torch.tensor([42]), src=evens[-1], group=group)
        if RANK != evens[-1]:
            expect_equal("new_group broadcast", got, torch.tensor([42]))


def check_errors():
    t = torch.ones(3, dtype=torch.int32)
    expect_raises("BXOR", tutti.Unsupported, "not supported by tutti", lambda: dist.all_reduce(t, op=dist.ReduceOp.BXOR))
    expect_raises("BAND on int", NotImplementedError, "ReduceOp.BAND", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND))
    expect_raises("int16", tutti.InvalidArgument, "Short", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)))
    if TORCH_MAJOR < 2:
        with torch.inference_mode():  # no autograd key: c10d's dispatcher passes a meta tensor through
            expect_raises("a tensor not on the CPU", tutti.Unsupported, "CPU tensors only",
                          lambda: dist.all_reduce(torch.ones(2, device="meta")))
    else:
        # torch 2.x runs c10d's meta kernels for meta tensors, and gives other devices to the backend
        # registered for them (tutti: the CPU only); the backend itself still refuses them.
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        expect_equal("the CPU backend", torch.tensor(isinstance(backend, tutti.distributed.ProcessGroupTutti)),
                     torch.tensor(True))
        expect_raises("a tensor not on the CPU", tutti.Unsupported, "CPU tensors only",
                      lambda: backend.allreduce([torch.ones(2, device="meta")]))
    expect_raises("allgather into a wrong size", tutti.InvalidArgument, "elements",
                  lambda: dist.all_gather_into_tensor(torch.ones(P * 2 + 1), torch.ones(2)))
    # ("ProcessGroup tutti ..." on torch 1.x, "Backend tutti ..." on 2.x)
    expect_raises("not implemented", RuntimeError, "tutti does not support monitoredBarrier",
                  lambda: dist.distributed_c10d._get_default_group().monitored_barrier())
    dist.barrier()  # nothing was issued by the refusals: the ranks are still in step


def main():
    global RANK, P
    tutti.distributed.init_process_group()
    RANK, P = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "tutti", dist.get_backend()
    for check in (check_allreduce, check_sparse_allreduce, check_allreduce_coalesced, check_broadcast, check_reduce, check_allgather,
                  check_reduce_scatter, check_coalesced_tensors, check_gather_scatter, check_alltoall,
                  check_point_to_point, check_async_and_futures, check_buffer_lifetime, check_groups, check_profiler,
                  check_errors):
        check()
    dist.barrier()
    if RANK == 0:
        print(f"collectives_test: {checks} checks passed on each of {P} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 — report and fail this rank
        print(f"FAILED: {error}", file=sys.stderr)
        raise
