"""init_process_group's timeout is Tutti's deadline: a collective that a peer never joins raises
tutti.Timeout from Work.wait() and from its future, within the timeout (and not much later).

Two ranks: rank 1 joins the group but never calls the allreduce; it waits for rank 0's verdict in
the c10d store, then both leave. Run under tutti-run -n 2.
"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import tutti
import tutti.distributed

TIMEOUT_S = 2


def main():
    tutti.distributed.init_process_group(timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["verdict"], timedelta(seconds=60))
        return 0
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(4), async_op=True)
    try:
        work.wait()
        verdict = "no error: the allreduce completed without rank 1"
    except tutti.Timeout as e:
        elapsed = time.monotonic() - start
        verdict = "ok" if TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + 10 else f"raised after {elapsed:.1f} s"
        if "rank(s) 1" not in str(e) and "rank 1" not in str(e):
            verdict = f"the message does not name rank 1: {e}"
    future_error = None
    try:
        work.get_future().wait()
    except Exception as e:  # noqa: BLE001 — the future carries the same error
        future_error = e
    if verdict == "ok" and not isinstance(future_error, tutti.Timeout):
        verdict = f"the future gave {future_error!r}, not tutti.Timeout"
    store.set("verdict", verdict)
    if verdict != "ok":
        print(f"FAILED: rank 0: {verdict}", file=sys.stderr)
        return 1
    print(f"timeout_test: the allreduce without rank 1 raised tutti.Timeout after the {TIMEOUT_S} s timeout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
