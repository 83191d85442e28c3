"""The comparison of ddp_test.py and zero_fsdp_test.py: training over "tutti" against the same
training over "gloo", in one job.

Over tutti the parameters must have moved from `start`, be the same on every rank (compared
exactly, gathered through the gloo group), and equal gloo's: exactly at p = 2, where each gradient
element is the sum of two numbers (a + b == b + a in floating point, whatever the algorithm), and
to 1e-6 relative at p > 2, where the two libraries may add the ranks' gradients in different orders
(float32 addition is not associative).
"""

import torch
import torch.distributed as dist


def agrees_with_gloo(a, b, size):
    """Whether a (over tutti) equals b (over gloo) as the rule above says for `size` ranks."""
    return torch.equal(a, b) if size == 2 else torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def agreement(size):
    """The rule's words for `size` ranks, for the closing line."""
    return "exactly" if size == 2 else "to 1e-6 relative"


def check_parameters(what, rank, size, gloo, start, over_tutti, over_gloo):
    """Raises AssertionError naming `what` and the rank unless the flat parameters over tutti moved,
    agree on every rank, and agree with gloo's."""
    if over_tutti.shape != start.shape:
        raise AssertionError(f"{what}: rank {rank}: {over_tutti.numel()} parameters, not {start.numel()}")
    if torch.equal(over_tutti, start):
        raise AssertionError(f"{what}: rank {rank}: the parameters did not move")
    everyone = [torch.empty_like(over_tutti) for _ in range(size)]
    dist.all_gather(everyone, over_tutti, group=gloo)
    for r, other in enumerate(everyone):
        if not torch.equal(other, over_tutti):
            raise AssertionError(f"{what}: rank {rank}: rank {r}'s parameters differ from this rank's under tutti")
    check_close(what, rank, size, "the parameters", over_tutti, over_gloo)


def check_close(what, rank, size, name, over_tutti, over_gloo):
    """Raises AssertionError unless `name` over tutti agrees with gloo's (the rule above)."""
    if not agrees_with_gloo(over_tutti, over_gloo, size):
        worst = (over_tutti - over_gloo).abs().max().item()
        raise AssertionError(f"{what}: rank {rank}: {name} over tutti and over gloo differ "
                             f"(largest difference {worst})")
