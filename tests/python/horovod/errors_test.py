"""tutti.horovod.torch's errors under tutti-run -n P: each is the tutti exception of its code on
every rank, names the operation, and leaves the job usable.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 2 python3 tests/python/horovod/errors_test.py
"""

import os

import torch

from harness import check_equal, expect_error, run

import tutti._errors as errors  # noqa: E402
import tutti.horovod.torch as hvd  # noqa: E402

R = int(os.environ["TUTTI_RANK"])
P = int(os.environ["TUTTI_SIZE"])


def test_before_init():
    expect_error(errors.InvalidArgument, hvd.size, "hvd.init()")
    expect_error(ValueError, lambda: hvd.start_timeline("/tmp/never.json"), "hvd.init()")  # as Horovod
    expect_error(ValueError, hvd.stop_timeline, "hvd.init()")
    assert not hvd.is_initialized()


def test_malformed_horovod_variables():
    for name, value in (("HOROVOD_FUSION_THRESHOLD", "lots"), ("HOROVOD_FUSION_THRESHOLD", "-1"),
                        ("HOROVOD_CYCLE_TIME", "soon"), ("HOROVOD_CYCLE_TIME", "-3")):
        os.environ[name] = value
        try:
            expect_error(errors.InvalidArgument, hvd.init, name)
        finally:
            del os.environ[name]
        assert not hvd.is_initialized()
    hvd.init()
    assert hvd.size() == P


def test_mismatched_shapes_named_on_every_rank():
    x = torch.ones(4 + R)  # another count on every rank
    e = expect_error(errors.Mismatch, lambda: hvd.allreduce(x, name="grad.fc1"), "grad.fc1")
    assert isinstance(e, errors.Error)
    # poll says a failed operation has finished; synchronize raises its error.
    h = hvd.allreduce_async(x, name="grad.polled")
    while not hvd.poll(h):
        pass
    expect_error(errors.Mismatch, lambda: hvd.synchronize(h), "grad.polled")
    # The job goes on.
    check_equal(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after"), torch.full((3,), float(P)), "after")


def test_mismatched_types():
    x = torch.ones(4, dtype=torch.float32 if R == 0 else torch.float64)
    expect_error(errors.Mismatch, lambda: hvd.allreduce(x, name="typed"), "typed")
    y = torch.ones(2, dtype=torch.int32 if R == 0 else torch.int64)
    expect_error(errors.Mismatch, lambda: hvd.broadcast_(y, 0, name="typed.broadcast"), "typed.broadcast")


def test_mismatched_ops():
    expect_error(errors.Mismatch, lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum if R == 0 else hvd.Max,
                                                        name="ops"), "ops")


def test_allgather_other_trailing_dimensions():
    x = torch.ones(2, 3) if R == 0 else torch.ones(2, 2)
    expect_error(errors.Mismatch, lambda: hvd.allgather(x, name="gathered"), "gathered", "dimensions after the first")
    expect_error(errors.InvalidArgument, lambda: hvd.allgather(torch.tensor(1.0)), "scalar")


def test_alltoall_errors():
    expect_error(errors.InvalidArgument, lambda: hvd.alltoall(torch.ones(2 * P + 1)), "divisible")
    expect_error(errors.InvalidArgument, lambda: hvd.alltoall(torch.ones(P), splits=torch.ones(P + 1)), "splits")
    expect_error(errors.InvalidArgument, lambda: hvd.alltoall(torch.ones(P), splits=torch.full((P,), 2)), "sum")
    x = torch.ones(P, 3) if R == 0 else torch.ones(P, 4)
    expect_error(errors.Mismatch, lambda: hvd.alltoall(x, name="a2a"), "a2a", "dimensions after the first")


def test_local_errors():
    expect_error(errors.InvalidArgument, lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)), "Bool")
    expect_error(errors.InvalidArgument, lambda: hvd.allreduce(torch.ones(2, device="meta")), "CPU tensors only")
    expect_error(errors.InvalidArgument, lambda: hvd.synchronize(12345), "12345")
    expect_error(errors.Unsupported, lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "Adasum")
    expect_error(errors.InvalidArgument, lambda: hvd.allreduce(torch.ones(2), process_set=object()), "ProcessSet")
    expect_error(errors.InvalidArgument, lambda: hvd.broadcast(torch.ones(2), P), "root")


def test_still_usable():
    check_equal(hvd.allreduce(torch.full((5,), float(R)), op=hvd.Sum), torch.full((5,), float(P * (P - 1) // 2)),
                "final allreduce")
    assert hvd._horovod.pending() == 0, hvd._horovod.pending()


run(globals(), lambda: R)
