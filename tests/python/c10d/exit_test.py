"""A job that ends without destroy_process_group(), as many scripts do, must exit cleanly.

Each rank joins backend "tutti", runs one blocking all_reduce (checked), then issues asynchronous
all_reduces on fresh tensors and drops them at once, unwaited: the group's progress thread holds
the last references to those works and their tensors. Then it returns from the script with the
group alive. The check is every rank's exit status, 0: the interpreter's exit must not end the
process (once it finalizes, a thread that takes the GIL to drop a tensor's Python object is
unwound, and std::terminate()s: "terminate called without an active exception", code 134).

    tutti-run -n 4 python3 exit_test.py
"""

import atexit

import torch
import torch.distributed as dist

import tutti.distributed

atexit.register(lambda: print(f"exit_test: rank {rank} at exit", flush=True))  # registered first, runs last

tutti.distributed.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
expected = float(size * (size + 1) // 2)
assert torch.equal(t, torch.full((1000,), expected)), (rank, t[:4])
for i in range(32):
    dist.all_reduce(torch.full((4096,), float(i)), async_op=True)  # the work is dropped unwaited
print(f"exit_test: rank {rank} of {size}: all_reduce checked, 32 works left in flight", flush=True)
