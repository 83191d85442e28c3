"""hvd.elastic under tutti-run --elastic -n 3: rank 2 kills itself (SIGKILL) at the start of step
23; the survivors go back to their last commit (step 20) and on as 2 ranks, to the end of epoch 0
(step 51); at step 60 rank 0 asks tutti-run for a rank that joins (SIGUSR1), which comes in at the
next commit after it started (steps on 2 ranks take 0.2 s from there, giving it about 20 s), in
the middle of epoch 1; the job ends on 3 ranks. Every step is checked exactly: the model
is one weight vector w, the loss sum(w), so each rank's gradient is ones and the averaged one too,
and SGD with lr 1 takes exactly 1 from every element per step: w = -step on every rank whatever
was rolled back, lost or joined. A momentum optimizer's state and an ObjectState attribute travel
with the state. Each rank's generator comes back with a rollback: a replayed step draws
what it drew before. A process set of the last rank is added again after every rebuild and
reduces exactly; the one from before the rebuild is refused by name.

The data come from an hvd.elastic.ElasticSampler in the TorchState (601 samples, batches of 5 per
rank, 3 epochs; commits every 5 steps but never at an epoch's last batch, and after set_epoch at
the end of each epoch). Every step, the ranks sum (allreduce) a count per sample of what they
trained into two buffers of the model (so they are rolled back, synced and committed with it):
`counts` for the samples at their own place in the partition, `pads` for Horovod's padding (the
places past the remaining samples). At the end of each epoch every rank checks, exactly, that
every sample was trained exactly once (counts all 1: none lost at the kill or the join, none
trained twice after a rollback or a re-partition) and that the padding is that of the epoch's last
partition, the remaining order's first total_size - remaining samples once more.

Run: PYTHONPATH=build/python build/tools/tutti-run -n 3 --elastic python3 tests/python/horovod/elastic_test.py
"""

import os
import signal
import time

import torch

import tutti
import tutti.horovod.torch as hvd

SAMPLES = 601  # 3 ranks: 201 each, 2 of them padding; 2 ranks: 301 each, 1 padding
BATCH = 5
EPOCHS = 3
torch.set_num_threads(1)
hvd.init()
first_rank = os.environ.get("TUTTI_RANK")  # None on a rank that joined
joiner = os.environ.get("TUTTI_ELASTIC_JOIN") == "1"


class Weights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(16))
        self.register_buffer("seen", torch.zeros(1))
        # This epoch's trainings of each sample, summed over the ranks (committed with the model).
        self.register_buffer("counts", torch.zeros(SAMPLES))
        self.register_buffer("pads", torch.zeros(SAMPLES))

    def forward(self):
        return self.w.sum()


model = Weights()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                     named_parameters=model.named_parameters())
dataset = torch.utils.data.TensorDataset(torch.arange(SAMPLES))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
# A generator of its own: a loader without one draws from the global generator for every iterator.
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
draws = {}  # this rank's draw at each step, kept through rollbacks: a replayed step draws the same
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0, epoch=0, log=[], epochs=[])
resets = []
state.register_reset_callbacks([lambda: resets.append((hvd.size(), sampler.num_replicas, len(sampler)))])
asked_for_joiner = False
# A process set of the last rank alone (one of two ranks would be the global set), added again after every rebuild (a reset callback;
# a joiner adds it here, at the point where the others run their callbacks). The one before is
# dropped by the rebuild: using it is an error that says so.
pair = None


def add_pair():
    global pair
    old = pair
    assert hvd.global_process_set.ranks == list(range(hvd.size())), hvd.global_process_set.ranks
    if old is not None:
        assert old.process_set_id is None, old
        try:
            hvd.allreduce(torch.ones(1), process_set=old, name="stale")
            raise AssertionError("a process set from before the rebuild was used")
        except tutti.InvalidArgument as e:
            assert "dropped when the elastic job was rebuilt" in str(e), e
    pair = hvd.add_process_set([hvd.size() - 1])


add_pair()
state.register_reset_callbacks([add_pair])


def count(batch_idx, indices):
    """This step's trainings of each sample over all ranks: [own places, padding places]."""
    mine = torch.zeros(2, SAMPLES)
    for j, index in enumerate(indices):
        place = sampler.rank + (batch_idx * BATCH + j) * sampler.num_replicas  # in the padded order
        mine[int(place >= len(sampler.remaining_indices)), index] += 1
    return hvd.allreduce(mine, op=hvd.Sum, name="counts")


def check_epoch():
    """Every sample trained exactly once this epoch, plus the last partition's padding."""
    where = "epoch %d on rank %d of %d (step %d)" % (state.epoch, hvd.rank(), hvd.size(), state.step)
    counts = model.counts
    if not torch.equal(counts, torch.ones(SAMPLES)):
        lost = (counts == 0).nonzero().flatten().tolist()
        twice = (counts > 1).nonzero().flatten().tolist()
        raise AssertionError("%s: samples never trained %s, trained more than once %s" % (where, lost[:20], twice[:20]))
    remaining = sampler.remaining_indices
    padding = sampler.total_size - len(remaining)
    expected = torch.zeros(SAMPLES)
    for index in (remaining * sampler.num_replicas)[:padding]:
        expected[index] += 1
    if not torch.equal(model.pads, expected):
        raise AssertionError("%s: padding %s, expected %s" % (where, model.pads.nonzero().flatten().tolist(),
                                                             expected.nonzero().flatten().tolist()))
    return padding


@hvd.elastic.run
def train(state):
    global asked_for_joiner
    assert (sampler.num_replicas, sampler.rank) == (hvd.size(), hvd.rank()), (sampler.num_replicas, hvd.size())
    while state.epoch < EPOCHS:
        batches = len(loader)
        for batch_idx, (indices,) in enumerate(loader):
            if first_rank == "2" and hvd.elastic.generation() == 0 and state.step == 22:
                os.kill(os.getpid(), signal.SIGKILL)  # after the commit at step 20: steps 21, 22 rolled back
            if hvd.rank() == 0 and state.step == 60 and not asked_for_joiner and hvd.size() == 2:
                asked_for_joiner = True
                os.kill(os.getppid(), signal.SIGUSR1)  # tutti-run starts a rank that joins
            if hvd.size() == 2 and state.step >= 60:
                time.sleep(0.2)
            drawn = torch.rand(1).item()
            assert draws.setdefault(state.step, drawn) == drawn, (state.step, draws[state.step], drawn)
            indices = indices.tolist()
            assert indices == state.sampler.get_indices(batch_idx, BATCH), (indices, batch_idx)
            trained = count(batch_idx, indices)
            if hvd.rank() in pair.ranks:
                alone = hvd.allreduce(torch.full((1,), 3.0), op=hvd.Sum, process_set=pair, name="pair")
                assert float(alone) == 3.0 and pair.size() == 1, (float(alone), pair)
            optimizer.zero_grad()
            model().backward()
            optimizer.step()
            with torch.no_grad():
                model.counts += trained[0]
                model.pads += trained[1]
            state.sampler.record_batch(batch_idx, BATCH)
            state.step += 1
            model.seen += 1
            expected = torch.full((16,), -float(state.step))
            if not torch.equal(model.w.detach(), expected):
                raise AssertionError("step %d on rank %d of %d: w = %s" % (state.step, hvd.rank(), hvd.size(),
                                                                           model.w.detach()[:3].tolist()))
            if state.step % 5 == 0 and batch_idx < batches - 1:
                state.log.append((state.step, hvd.size()))
                state.commit()
        padding = check_epoch()
        state.epochs.append((state.epoch, hvd.size(), padding))
        model.counts.zero_()
        model.pads.zero_()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()
    return hvd.size()


size = train(state)
# Every rank holds the same weights, buffer, step and logs, and the job went 3 -> 2 -> 3.
steps = hvd.allgather_object(state.step, name="final.step")
assert steps == [state.step] * size, steps
weights = hvd.allgather(model.w.detach().reshape(1, 16), name="final.w")
assert torch.equal(weights, torch.full((size, 16), -float(state.step))), weights
assert float(model.seen) == state.step, (float(model.seen), state.step)
logs = hvd.allgather_object((state.log, state.epochs), name="final.log")
assert all(log == logs[0] for log in logs), logs
sizes = [s for _, s in state.log]
assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, state.log
assert [e for e, _, _ in state.epochs] == list(range(EPOCHS)), state.epochs
# Epoch 0 ends on 2 ranks (1 sample padded), epoch 2 on 3 (2 padded).
assert state.epochs[0] == (0, 2, 1) and state.epochs[-1] == (EPOCHS - 1, 3, 2), state.epochs
assert hvd.elastic.generation() == 2, hvd.elastic.generation()
print("done rank %d of %d generation %d joined %s resets %s epochs %s steps %d log %s" % (
    hvd.rank(), hvd.size(), hvd.elastic.generation(), joiner, resets, state.epochs, state.step, state.log),
    flush=True)
