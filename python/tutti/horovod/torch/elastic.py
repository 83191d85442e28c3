"""Horovod Elastic's API over Tutti's elastic jobs (docs/elastic.md): `hvd.elastic.run`,
`hvd.elastic.State`, `ObjectState`, `TorchState` and `HostsUpdatedInterrupt`, with Horovod's names
and semantics.

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
"""

import copy
import functools

import tutti
from tutti.horovod import _horovod
from tutti.horovod.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

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


class TorchState(ObjectState):
    """A model's and an optimizer's state (state_dict, copied at each commit) and any other
    attributes given as keyword arguments."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._model_state = None
        self._optimizer_state = None
        super().__init__(**kwargs)
        self._save_torch()

    def _save_torch(self):
        if self.model is not None:
            self._model_state = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())

    def save(self):
        self._save_torch()
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._model_state)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._optimizer_state)
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()
        self._save_torch()

    def on_reset(self):
        # A hvd.DistributedOptimizer drops its handles of the failed job (a plain optimizer has none).
        rebuilt = getattr(self.optimizer, "_job_rebuilt", None)
        if rebuilt is not None:
            rebuilt()
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
            state.on_reset()

    return wrapper
