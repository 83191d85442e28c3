"""Runs a test script's test_* functions in order on every rank of a tutti-run job.

Each rank prints one line per test and exits non-zero when any test failed on it (tutti-run then
exits non-zero). Tests check exact values: integer-valued data, every element, on every rank.
"""

import sys
import traceback

import torch


def check_equal(actual, expected, what):
    """Every element equal, same shape and type (NaN never expected)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError("%s: got %s %s, expected %s %s" % (what, actual.dtype, tuple(actual.shape),
                                                               expected.dtype, tuple(expected.shape)))
    if not torch.equal(actual, expected):
        wrong = (actual != expected).nonzero()[:4].tolist()
        raise AssertionError("%s: %d wrong elements, first at %s: got %s, expected %s" % (
            what, int((actual != expected).sum()), wrong, actual[tuple(wrong[0])].item(),
            expected[tuple(wrong[0])].item()))


def expect_error(cls, call, *fragments):
    """Calls `call`, which must raise `cls` with every fragment in its message."""
    try:
        call()
    except cls as e:
        for f in fragments:
            if f not in str(e):
                raise AssertionError("%s raised without %r in its message: %s" % (cls.__name__, f, e))
        return e
    raise AssertionError("expected %s, nothing was raised" % cls.__name__)


def run(namespace, rank_of):
    """Runs every test_* function of `namespace` in definition order."""
    tests = [(name, f) for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    failed = []
    for name, f in tests:
        try:
            f()
            print("[rank %d] PASS %s" % (rank_of(), name), flush=True)
        except Exception:
            failed.append(name)
            print("[rank %d] FAIL %s\n%s" % (rank_of(), name, traceback.format_exc()), flush=True)
    print("[rank %d] %d passed, %d failed" % (rank_of(), len(tests) - len(failed), len(failed)), flush=True)
    if failed:
        sys.exit(1)
