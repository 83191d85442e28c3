"""hvd.elastic under tutti-run --elastic -n 3: rank 2 kills itself (SIGKILL) at step 20; the
survivors go back to their last commit (step 20) and on as 2 ranks; at step 40 rank 0 asks
tutti-run for a rank that joins (SIGUSR1), which comes in at the next commit after it started
(steps on 2 ranks take 0.2 s, giving it 12 s); the job ends on 3 ranks. Every step is checked exactly: the model is one weight vector w, the loss sum(w), so each
rank's gradient is ones and the averaged one too, and SGD with lr 1 takes exactly 1 from every
element per step: w = -step on every rank whatever was rolled back, lost or joined. A momentum
optimizer's state and an ObjectState attribute travel with the state.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 3 --elastic python3 tests/python/horovod/elastic_test.py
"""

import os
import signal
import time

import torch

import tutti
import tutti.horovod.torch as hvd

STEPS = 100
torch.set_num_threads(1)
hvd.init()
first_rank = os.environ.get("TUTTI_RANK")  # None on a rank that joined
joiner = os.environ.get("TUTTI_ELASTIC_JOIN") == "1"


class Weights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(16))
        self.register_buffer("seen", torch.zeros(1))

    def forward(self):
        return self.w.sum()


model = Weights()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0, log=[])
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
asked_for_joiner = False


@hvd.elastic.run
def train(state):
    global asked_for_joiner
    while state.step < STEPS:
        if first_rank == "2" and hvd.elastic.generation() == 0 and state.step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        if hvd.rank() == 0 and state.step == 40 and not asked_for_joiner and hvd.size() == 2:
            asked_for_joiner = True
            os.kill(os.getppid(), signal.SIGUSR1)  # tutti-run starts a rank that joins
        if hvd.size() == 2 and state.step >= 40:
            time.sleep(0.2)
        optimizer.zero_grad()
        model().backward()
        optimizer.step()
        state.step += 1
        model.seen += 1
        expected = torch.full((16,), -float(state.step))
        if not torch.equal(model.w.detach(), expected):
            raise AssertionError("step %d on rank %d of %d: w = %s" % (state.step, hvd.rank(), hvd.size(),
                                                                       model.w.detach()[:3].tolist()))
        if state.step % 5 == 0:
            state.log.append((state.step, hvd.size()))
            state.commit()
    return hvd.size()


size = train(state)
# Every rank holds the same weights, buffer and log, and the job went 3 -> 2 -> 3.
weights = hvd.allgather(model.w.detach().reshape(1, 16), name="final.w")
assert torch.equal(weights, torch.full((size, 16), -float(STEPS))), weights
assert float(model.seen) == STEPS, float(model.seen)
logs = hvd.allgather_object(state.log, name="final.log")
assert all(log == logs[0] for log in logs), logs
sizes = [s for _, s in state.log]
assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, state.log
assert hvd.elastic.generation() == 2, hvd.elastic.generation()
print("done rank %d of %d generation %d joined %s resets %s log %s" % (
    hvd.rank(), hvd.size(), hvd.elastic.generation(), joiner, resets, state.log), flush=True)
