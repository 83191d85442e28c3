"""Checks of every collective of tutti.Communicator, run by every rank of a communicator.

Shared by the thread tests (tutti.local_group, threads_test.py) and the process tests (tutti.init()
under tutti-run, processes_test.py). Each check fills integer-valued inputs, poisons the outputs,
runs the collective (blocking or through its i... twin and Request.wait), and compares every
element of this rank's result with the value computed here; it raises AssertionError naming the
collective, type, library, form and rank otherwise.
"""

import numpy as np

import tutti

try:
    import torch
except ImportError:  # the torch cases need Debian's python3-torch
    torch = None

NUMPY_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]
TORCH_TYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]
POISON = 77
# The (library, type) pairs every collective other than allreduce runs with.
CASES = [("numpy", "int32"), ("numpy", "float16"), ("torch", "float32"), ("torch", "bfloat16")]


def make(lib, dtype, values):
    if lib == "numpy":
        return np.array(values, dtype=dtype)
    return torch.tensor(values, dtype=getattr(torch, dtype))


def poison(lib, dtype, n):
    return make(lib, dtype, [POISON] * n)


def expect(got, want, what):
    g = [float(v) for v in got.tolist()]
    w = [float(v) for v in want]
    if g != w:
        wrong = [i for i in range(min(len(g), len(w))) if g[i] != w[i]]
        raise AssertionError(f"{what}: got {g[:12]}... want {w[:12]}... (lengths {len(g)}, {len(w)}; wrong at {wrong[:8]})")


def call(comm, name, nonblocking, *args, **kwargs):
    """Runs comm.NAME, or comm.iNAME and waits on its Request (also through test())."""
    if not nonblocking:
        result = getattr(comm, name)(*args, **kwargs)
        assert result is None, f"{name} returned {result!r}"
        return
    request = getattr(comm, "i" + name)(*args, **kwargs)
    assert isinstance(request, tutti.Request), f"i{name} returned {request!r}"
    assert request.wait() is True
    assert request.test() is True and request.wait(timeout=0) is True


def data(op, rank, i):
    """Rank's i-th input: small integers, so that every result is exact in every type (bf16 too)."""
    return (i + rank) % 2 + 1 if op == "prod" else i % 5 + 2 * rank + 1


def reduced(op, p, i):
    values = [data(op, r, i) for r in range(p)]
    if op == "prod":
        return int(np.prod(values))
    if op == "avg":  # the sum is p * (i % 5 + p) by construction
        return sum(values) // p
    return {"sum": sum, "min": min, "max": max}[op](values)


def block(src, dst, i):
    """The i-th element rank src sends to rank dst (alltoall, scatter)."""
    return 3 * src + dst + i % 3


def check_allreduce(comm, lib, dtype, op, n, nonblocking, in_place):
    what = f"allreduce {lib} {dtype} {op} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    inputs = [data(op, r, i) for i in range(n)]
    want = [reduced(op, p, i) for i in range(n)]
    send = make(lib, dtype, inputs)
    op_arg = op if nonblocking else getattr(tutti.ReduceOp, op)  # names and enum values alike
    if in_place:
        call(comm, "allreduce", nonblocking, send, op=op_arg)
        expect(send, want, what)
    else:
        recv = poison(lib, dtype, n)
        call(comm, "allreduce", nonblocking, send, recv, op_arg)
        expect(recv, want, what)
        expect(send, inputs, what + " (send unchanged)")


def check_reduce(comm, lib, dtype, n, nonblocking, in_place):
    what = f"reduce {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    root = p - 1
    send = make(lib, dtype, [data("max", r, i) for i in range(n)])
    want = [reduced("max", p, i) for i in range(n)]
    if in_place and r == root:
        call(comm, "reduce", nonblocking, send, op="max", root=root)
        expect(send, want, what)
        return
    recv = poison(lib, dtype, n)
    call(comm, "reduce", nonblocking, send, recv, tutti.ReduceOp.max, root)
    expect(recv, want if r == root else [POISON] * n, what)


def check_reduce_scatter(comm, lib, dtype, n, nonblocking, in_place):
    what = f"reduce_scatter {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    send = make(lib, dtype, [data("sum", r, i) for i in range(p * n)])
    want = [reduced("sum", p, r * n + j) for j in range(n)]
    if in_place:  # the result at the start of send
        call(comm, "reduce_scatter", nonblocking, send)
        expect(send[:n], want, what)
    else:
        recv = poison(lib, dtype, n)
        call(comm, "reduce_scatter", nonblocking, send, recv, op="sum")
        expect(recv, want, what)


def check_allgather(comm, lib, dtype, n, nonblocking, in_place):
    what = f"allgather {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    mine = [data("sum", r, i) for i in range(n)]
    want = [data("sum", q, i) for q in range(p) for i in range(n)]
    if in_place:  # this rank's block at its place, the others poisoned
        buffer = make(lib, dtype, [POISON] * (r * n) + mine + [POISON] * ((p - r - 1) * n))
        call(comm, "allgather", nonblocking, buffer)
        expect(buffer, want, what)
    else:
        recv = poison(lib, dtype, p * n)
        call(comm, "allgather", nonblocking, make(lib, dtype, mine), recv)
        expect(recv, want, what)


def check_allgatherv(comm, lib, dtype, n, nonblocking, in_place):
    what = f"allgatherv {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    counts = [(2 * q + n) % 5 for q in range(p)]  # zeros among them
    want = [data("sum", q, i) for q in range(p) for i in range(counts[q])]
    mine = [data("sum", r, i) for i in range(counts[r])]
    if in_place:
        before = sum(counts[:r])
        buffer = make(lib, dtype, [POISON] * before + mine + [POISON] * (sum(counts) - before - counts[r]))
        call(comm, "allgatherv", nonblocking, buffer, counts)
        expect(buffer, want, what)
    else:
        recv = poison(lib, dtype, sum(counts))
        call(comm, "allgatherv", nonblocking, make(lib, dtype, mine), counts, recv)
        expect(recv, want, what)


def check_broadcast(comm, lib, dtype, n, nonblocking, in_place):
    what = f"broadcast {lib} {dtype} n={n} nb={nonblocking} rank {comm.rank}"
    root = 1 % comm.size
    want = [data("sum", root, i) for i in range(n)]
    buffer = make(lib, dtype, want) if comm.rank == root else poison(lib, dtype, n)
    call(comm, "broadcast", nonblocking, buffer, root=root)
    expect(buffer, want, what)


def check_alltoall(comm, lib, dtype, n, nonblocking, in_place):
    what = f"alltoall {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    send = make(lib, dtype, [block(r, j, i) for j in range(p) for i in range(n)])
    want = [block(q, r, i) for q in range(p) for i in range(n)]
    if in_place:
        call(comm, "alltoall", nonblocking, send)
        expect(send, want, what)
    else:
        recv = poison(lib, dtype, p * n)
        call(comm, "alltoall", nonblocking, send, recv)
        expect(recv, want, what)


def check_alltoallv(comm, lib, dtype, n, nonblocking, in_place):
    what = f"alltoallv {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    send_counts = [(r + j + n) % 3 for j in range(p)]  # what rank r sends to j
    recv_counts = [(q + r + n) % 3 for q in range(p)]  # what q sends to r
    send = make(lib, dtype, [block(r, j, i) for j in range(p) for i in range(send_counts[j])])
    want = [block(q, r, i) for q in range(p) for i in range(recv_counts[q])]
    if in_place:  # the sums are equal here (the counts are symmetric)
        call(comm, "alltoallv", nonblocking, send, send_counts, recv_counts)
        expect(send, want, what)
    else:
        recv = poison(lib, dtype, sum(recv_counts))
        call(comm, "alltoallv", nonblocking, send, send_counts, recv_counts, recv)
        expect(recv, want, what)


def check_gather(comm, lib, dtype, n, nonblocking, in_place):
    what = f"gather {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    root = p // 2
    mine = [data("sum", r, i) for i in range(n)]
    want = [data("sum", q, i) for q in range(p) for i in range(n)]
    if in_place and r == root:
        buffer = make(lib, dtype, [POISON] * (r * n) + mine + [POISON] * ((p - r - 1) * n))
        call(comm, "gather", nonblocking, buffer, root=root)
        expect(buffer, want, what)
        return
    recv = poison(lib, dtype, p * n) if r == root else None
    call(comm, "gather", nonblocking, make(lib, dtype, mine), recv, root)
    if r == root:
        expect(recv, want, what)


def check_scatter(comm, lib, dtype, n, nonblocking, in_place):
    what = f"scatter {lib} {dtype} n={n} nb={nonblocking} in_place={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    root = p // 2
    send = make(lib, dtype, [block(root, q, i) for q in range(p) for i in range(n)]) if r == root else None
    want = [block(root, r, i) for i in range(n)]
    if in_place and r == root:
        call(comm, "scatter", nonblocking, send, root=root)
        expect(send, [block(root, q, i) for q in range(p) for i in range(n)], what)
        return
    recv = poison(lib, dtype, n)
    call(comm, "scatter", nonblocking, send, recv, root=root)
    expect(recv, want, what)


def check_send_recv(comm, lib, dtype, n, nonblocking, in_place):
    """A ring: every rank sends to the next and receives from the previous (tag 5). Point to point
    has no in-place form: `in_place` runs sendrecv instead (blocking whatever `nonblocking` says:
    it has no nonblocking twin), with a tag of each sender's own."""
    what = f"send/recv {lib} {dtype} n={n} nb={nonblocking} sendrecv={in_place} rank {comm.rank}"
    p, r = comm.size, comm.rank
    if p == 1:
        return
    out = make(lib, dtype, [block(r, 0, i) for i in range(n)])
    got = poison(lib, dtype, n)
    prev, nxt = (r - 1) % p, (r + 1) % p
    if in_place:
        sender = comm.sendrecv(out, nxt, got, prev, send_tag=10 + r, recv_tag=10 + prev)
        assert sender == prev, f"{what}: sendrecv returned {sender}, want {prev}"
    elif nonblocking:
        receiving = comm.irecv(got, prev, tag=5)
        sending = comm.isend(out, nxt, 5)
        assert sending.wait() and receiving.wait()
    elif r % 2 == 0:  # blocking: even ranks send first, odd ranks receive first
        comm.send(out, nxt, tag=5)
        comm.recv(got, prev, tag=5)
    else:
        comm.recv(got, prev, tag=5)
        comm.send(out, nxt, tag=5)
    expect(got, [block(prev, 0, i) for i in range(n)], what)


COLLECTIVES = [check_reduce, check_reduce_scatter, check_allgather, check_allgatherv, check_broadcast,
               check_alltoall, check_alltoallv, check_gather, check_scatter, check_send_recv]


def libraries():
    return ["numpy", "torch"] if torch is not None else ["numpy"]


def run_allreduce(comm):
    """Every type of both libraries, every op, four forms. Returns the number of checks."""
    count = 0
    for lib in libraries():
        for dtype in NUMPY_TYPES if lib == "numpy" else TORCH_TYPES:
            for op in OPS:
                for form in range(4):
                    check_allreduce(comm, lib, dtype, op, 7 if form != 3 else 0, form % 2 == 1, form >= 2)
                    count += 1
    return count


def run_collectives(comm):
    """Every other collective (and barrier), CASES x blocking/nonblocking x in/out of place x n in 1, 7."""
    count = 0
    for check in COLLECTIVES:
        for lib, dtype in CASES:
            if lib == "torch" and torch is None:
                continue
            for n in (1, 7):
                for form in range(4):
                    check(comm, lib, dtype, n, form % 2 == 1, form >= 2)
                    count += 1
    call(comm, "barrier", False)
    call(comm, "barrier", True, timeout=30)
    return count + 2


def run_split(comm):
    """split(color = rank % 2, key = -rank): sizes, reversed ranks, and an allreduce inside."""
    p, r = comm.size, comm.rank
    sub = comm.split(r % 2, -r)
    members = [q for q in range(p) if q % 2 == r % 2]
    assert sub.size == len(members), f"split: size {sub.size}, want {len(members)}"
    want_rank = sorted(members, reverse=True).index(r)
    assert sub.rank == want_rank, f"split: rank {sub.rank}, want {want_rank} (rank {r})"
    x = np.full(5, r, dtype=np.int64)
    sub.allreduce(x)
    expect(x, [sum(members)] * 5, f"split allreduce rank {r}")
    empty = comm.split(-1, 0)
    assert empty.size == 0 and empty.rank == -1, f"split(-1): size {empty.size}, rank {empty.rank}"
