"""Horovod Elastic's API over Tutti's elastic jobs (docs/elastic.md): `hvd.elastic.run`,
`hvd.elastic.State`, `ObjectState`, `TorchState`, `ElasticSampler` and `HostsUpdatedInterrupt`,
with Horovod's names and semantics.

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

Start the script with `tutti-run -n N --elastic python3 script.py` (hvd.init() then joins the
elastic job). When a rank dies, hangs or leaves, the survivors' collectives fail (tutti.PeerFailure,
tutti.Timeout or tutti.Aborted); `run` restores the last commit, rebuilds the job without the lost
rank and calls the function again. Ranks that join (SIGUSR1 to tutti-run) come in at the next
commit, where every rank raises HostsUpdatedInterrupt; `run` rebuilds the job with them and calls
the function again without going back. Each new job starts with `state.sync()`: rank 0's state to
every rank.

An `ElasticSampler` given to the TorchState splits an epoch's samples among the ranks and, after
every rebuild, splits the ones no rank has processed yet among the ranks there are now:

    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=B, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for batch_idx, batch in enumerate(loader):
                ...
                state.sampler.record_batch(batch_idx, B)
                state.commit()               # every so often
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
"""

import copy
import functools
import math
import numbers

import torch

import tutti
from tutti.horovod import _horovod
from tutti.horovod.torch import process_sets
from tutti.horovod.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                           broadcast_parameters)

# The failures of a peer after which the job goes on without it.
_RECOVERABLE = (tutti.PeerFailure, tutti.Timeout, tutti.Aborted)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() on every rank when ranks wait to join; `run` catches it."""

    def __init__(self, skip_sync=False):
        super().__init__("ranks wait to join: the job is rebuilt at this commit")
        self.skip_sync = skip_sync


def generation():
    """The elastic job's generation: 0 for the launcher's ranks, one more at each change of
    membership; -1 outside an elastic job."""
    return _horovod.elastic_generation()


class State:
    """What the job needs to go on. Subclasses define save(), restore() and sync()."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (without arguments) after every rebuild of the job."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state as the point to go back to, then lets ranks waiting to join in
        (collective: every rank commits at the same point)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when ranks wait to join."""
        if _horovod.elastic_waiting() > 0:
            raise HostsUpdatedInterrupt(False)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """Attributes given as keyword arguments, saved by deep copy and synced by broadcast_object."""

    def __init__(self, bcast_object=broadcast_object, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__()

    def save(self):
        self._saved_state = copy.deepcopy({name: getattr(self, name) for name in self._saved_state})

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def _world():
    """(size, rank) of the job now; the sampler partitions over it (tests replace it)."""
    return _horovod.size(), _horovod.rank()


def _check_int(what, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s: expected an integer, got %s" % (what, type(value).__name__))
    if minimum is not None and value < minimum:
        raise ValueError("%s: expected an integer >= %d, got %d" % (what, minimum, value))
    return int(value)


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: splits a dataset's indices among the ranks as DistributedSampler
    does (rank r takes positions r, r + size, ...), and keeps the indices processed in the
    current epoch, so that reset() splits only the others among the ranks there are after a
    change of membership. Give it to the TorchState (which gathers every rank's processed indices
    at each commit and re-partitions at each rebuild), call record_batch() (or record_indices())
    after each batch and set_epoch() at the end of each epoch.

    `dataset` needs a constant len(); `seed` must be the same on every rank. Each reset pads this
    rank's part as Horovod does: the remaining indices are repeated from their start until every
    rank has the same count: at most size - 1 trainings more than samples in each partition that
    is gone through to its end."""

    def __init__(self, dataset, shuffle=True, seed=0):
        if not isinstance(shuffle, bool):
            raise TypeError("ElasticSampler: shuffle: expected a bool, got %s" % type(shuffle).__name__)
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = _check_int("ElasticSampler: seed", seed)
        try:
            len(dataset)
        except TypeError:
            raise TypeError("ElasticSampler: the dataset has no len() (%s)" % type(dataset).__name__) from None
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: forgets the processed indices and orders the indices by the seed
        plus the epoch. Call it at the end of an epoch (before the commit), so that an epoch
        interrupted half way is not started again."""
        self.epoch = _check_int("ElasticSampler.set_epoch: epoch", epoch, 0)
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch `batch_idx` of size `batch_size` (the last one may be
        shorter), in the current partition."""
        batch_idx = _check_int("ElasticSampler: batch_idx", batch_idx, 0)
        batch_size = _check_int("ElasticSampler: batch_size", batch_size, 1)
        start = batch_idx * batch_size
        if start >= len(self.indices):
            raise ValueError("ElasticSampler: batch %d of size %d starts at %d, past this rank's %d samples"
                             % (batch_idx, batch_size, start, len(self.indices)))
        return self.indices[start:start + batch_size]

    def record_batch(self, batch_idx, batch_size):
        """Marks this rank's batch `batch_idx` (of size `batch_size`) processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        """Marks dataset indices (ints, or a tensor of them) processed."""
        if isinstance(indices, torch.Tensor):
            if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
                raise TypeError("ElasticSampler.record_indices: expected integer indices, got a %s tensor"
                                % indices.dtype)
            indices = indices.reshape(-1).tolist()
        try:
            items = list(indices)
        except TypeError:
            raise TypeError("ElasticSampler.record_indices: expected indices (an iterable of ints), got %s"
                            % type(indices).__name__) from None
        n = len(self.dataset)
        checked = []
        for index in items:
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise TypeError("ElasticSampler.record_indices: expected int indices, got %s"
                                % type(index).__name__)
            if not 0 <= index < n:
                raise ValueError("ElasticSampler.record_indices: index %d is outside the dataset (0 to %d)"
                                 % (index, n - 1))
            checked.append(int(index))
        self.processed_indices.update(checked)

    def state_dict(self):
        """The epoch and the indices processed in it (a copy)."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        """Takes a state_dict()'s epoch and processed indices, and resets."""
        if not isinstance(state_dict, dict) or not {"epoch", "processed_indices"} <= state_dict.keys():
            raise ValueError("ElasticSampler.load_state_dict: expected a dict with 'epoch' and "
                             "'processed_indices', got %r" % (state_dict,))
        epoch = _check_int("ElasticSampler.load_state_dict: epoch", state_dict["epoch"], 0)
        processed = set(state_dict["processed_indices"])
        self.epoch = epoch
        self.processed_indices = set()
        self.record_indices(processed)
        self.reset()

    def reset(self):
        """Splits the epoch's indices not processed yet among hvd.size() ranks; this rank's part
        (len(self) of them) is what iterating gives from now on."""
        self.num_replicas, self.rank = _world()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed((self.seed + self.epoch) % 2 ** 64)
            order = torch.randperm(len(order), generator=generator).tolist()
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        remaining = len(self.remaining_indices)
        self.num_samples = math.ceil(remaining / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = self.remaining_indices[:]
        while remaining and len(padded) < self.total_size:
            padded += self.remaining_indices[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class _SamplerHandler:
    """An ElasticSampler in a TorchState. save() (at each commit, collective) makes the sampler's
    processed indices the union of every rank's; restore() goes back to that union; sync() (in
    every new job) takes rank 0's epoch and the union of every rank's processed indices, and
    resets the sampler for the new world."""

    def __init__(self, name, sampler):
        self.name = name
        self.sampler = sampler
        self._keep(sampler.epoch, set(sampler.processed_indices))

    def _keep(self, epoch, processed):
        self._epoch = epoch
        self._processed = processed
        # The same on every rank once synced: a rank sends only what it processed since.
        self._mark = (epoch, len(processed), sum(processed))

    def save(self):
        s = self.sampler
        base = self._processed if s.epoch == self._epoch else set()
        gathered = allgather_object((s.epoch, self._mark, sorted(s.processed_indices - base)),
                                    name="elastic.sampler.%s.save" % self.name)
        epochs = sorted({epoch for epoch, _, _ in gathered})
        if len(epochs) != 1:
            raise ValueError("TorchState.%s: the ranks' ElasticSamplers are at different epochs (%s) at "
                             "commit; call set_epoch on every rank at the same point"
                             % (self.name, ", ".join(str(e) for e, _, _ in gathered)))
        if any(mark != self._mark for _, mark, _ in gathered):
            # The ranks' last commits differ (not synced): gather everything.
            gathered = allgather_object((s.epoch, None, sorted(s.processed_indices)),
                                        name="elastic.sampler.%s.save_all" % self.name)
            base = set()
        union = set(base)
        for _, _, indices in gathered:
            union.update(indices)
        s.processed_indices = union
        self._keep(s.epoch, set(union))

    def restore(self):
        self.sampler.load_state_dict({"epoch": self._epoch, "processed_indices": self._processed})

    def sync(self):
        s = self.sampler
        gathered = allgather_object((len(s.dataset), s.shuffle, s.seed, s.epoch, sorted(s.processed_indices)),
                                    name="elastic.sampler.%s.sync" % self.name)
        length, shuffle, seed, epoch, _ = gathered[0]
        for rank, (other_length, other_shuffle, other_seed, _, _) in enumerate(gathered):
            if (other_length, other_shuffle, other_seed) != (length, shuffle, seed):
                raise ValueError("TorchState.%s: rank %d's ElasticSampler has len(dataset) %d, shuffle %s, "
                                 "seed %d; rank 0's %d, %s, %d" % (self.name, rank, other_length, other_shuffle,
                                                                  other_seed, length, shuffle, seed))
        # A rank at another epoch (one that joined) has nothing of this epoch to add.
        union = set()
        for _, _, _, other_epoch, indices in gathered:
            if other_epoch == epoch:
                union.update(indices)
        s.load_state_dict({"epoch": epoch, "processed_indices": union})
        self._keep(epoch, set(union))

    def on_reset(self):
        self.sampler.reset()


class TorchState(ObjectState):
    """A model's and an optimizer's state (state_dict, copied at each commit), the ElasticSamplers
    among the keyword arguments (see _SamplerHandler: processed indices unioned over the ranks at
    each commit and sync, the sampler reset for the new world after every rebuild), this rank's
    torch CPU generator (its own: restored with the rest, never synced, so a rank draws after a
    rollback what it drew after the commit; a joiner keeps its own) and any other attributes given
    as keyword arguments."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._model_state = None
        self._optimizer_state = None
        self._samplers = {name: _SamplerHandler(name, value) for name, value in kwargs.items()
                          if isinstance(value, ElasticSampler)}
        for name, handler in self._samplers.items():
            del kwargs[name]
            object.__setattr__(self, name, handler.sampler)
        super().__init__(**kwargs)
        self._save_torch()

    def __setattr__(self, name, value):
        samplers = self.__dict__.get("_samplers")
        if samplers is not None and name in samplers:
            if not isinstance(value, ElasticSampler):
                raise TypeError("TorchState.%s holds an ElasticSampler; got %s" % (name, type(value).__name__))
            samplers[name] = _SamplerHandler(name, value)
        super().__setattr__(name, value)

    def _save_torch(self):
        self._rng = torch.get_rng_state()
        if self.model is not None:
            self._model_state = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())

    def save(self):
        self._save_torch()
        for handler in self._samplers.values():
            handler.save()
        super().save()

    def restore(self):
        torch.set_rng_state(self._rng)
        if self.model is not None:
            self.model.load_state_dict(self._model_state)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._optimizer_state)
        for handler in self._samplers.values():
            handler.restore()
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for handler in self._samplers.values():
            handler.sync()
        super().sync()
        self._save_torch()

    def on_reset(self):
        # A hvd.DistributedOptimizer drops its handles of the failed job (a plain optimizer has none).
        rebuilt = getattr(self.optimizer, "_job_rebuilt", None)
        if rebuilt is not None:
            rebuilt()
        # The samplers split what is left among the ranks there are now (sync() unions first).
        for handler in self._samplers.values():
            handler.on_reset()
        super().on_reset()


def run(func):
    """Decorates `func(state, *args, **kwargs)`: runs it until it returns, rebuilding the job
    after a lost rank (back to the last commit) and when ranks join (at a commit), and syncing
    the state from rank 0 in every new job. Other errors end it as they are."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            failure = ""
            if not skip_sync:
                state.sync()
            try:
                result = func(state, *args, **kwargs)
                _horovod.elastic_finish()
                return result
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            except _RECOVERABLE as e:
                failure = str(e)
                state.restore()
                skip_sync = False
            _horovod.elastic_rebuild(failure)
            process_sets._job_rebuilt()
            state.on_reset()

    return wrapper
