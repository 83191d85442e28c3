"""Horovod's DistributedOptimizer: averages gradients over the ranks while backward runs.

A hook on each parameter's gradient accumulator enqueues that gradient's allreduce on Tutti's
engine the moment backward has produced it, so the last layers' gradients travel while backward
computes the first ones (the engine fuses the small ones); step() waits for all of them, then
steps the wrapped optimizer.
"""

import contextlib
import warnings

import torch

from tutti._errors import InvalidArgument, Unsupported
from tutti.horovod.torch.collectives import Adasum, Average, allreduce_async_, sparse_allreduce_async, synchronize
from tutti.horovod.torch.compression import Compression
from tutti.horovod.torch.process_sets import _size_of, global_process_set


class _DistributedOptimizer:
    """Placed before the wrapped optimizer's class, so that the result is still an instance of
    that class (learning-rate schedulers, isinstance checks) and shares its state."""

    def _tutti_setup(self, named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                     process_set):
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._process_set = process_set
        self._names = _parameter_names(self.param_groups, named_parameters)
        self._parameter_names = self._names  # Horovod's attribute
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for p in self._names}
        self._handles = {}  # parameter -> (handle or None, compression context)
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        # Ranks outside the process set reduce nothing (their step() applies their own gradients).
        self._included = process_set is None or process_set.included() is not False
        if self._included and _size_of(process_set) > 1:
            self._register_hooks()

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                # p.grad is left as it is (None until backward): a sparse gradient must stay sparse.
                self._requires_update.add(p)
                # The AccumulateGrad node of p (reached through a view of it) runs once backward
                # has added this pass's gradient into p.grad.
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._make_hook(p))
                self._grad_accs.append(accumulator)

    def _make_hook(self, p):
        def hook(*_):
            handle, _ctx = self._handles.get(p, (None, None))
            if handle is not None and self._delay[p] <= 0:
                raise AssertionError("tutti.horovod DistributedOptimizer: the gradient of %s was computed more than "
                                     "backward_passes_per_step (%d) times before step(); raise "
                                     "backward_passes_per_step to accumulate gradients locally"
                                     % (self._names[p], self.backward_passes_per_step))
            self._delay[p] -= 1
            self._handles[p] = self._allreduce_grad_async(p) if self._delay[p] == 0 else (None, None)

        return hook

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                # Horovod's way: the indices and values are allgathered (the handle is a function).
                return sparse_allreduce_async(grad, name=self._names[p], op=self._op,
                                              process_set=self._process_set), None
            grad = grad.to_dense()  # reduced dense, made sparse again at synchronize (as Horovod)
        compressed, ctx = self._compression.compress(grad)
        prescale, postscale = 1.0, 1.0
        if self._op == Average and self._predivide != 1.0:
            prescale, postscale = 1.0 / self._predivide, self._predivide
        handle = allreduce_async_(compressed, name=self._names[p], op=self._op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self._process_set)
        return handle, ctx

    def synchronize(self):
        """Completes the allreduce of every gradient (enqueueing those backward did not), so that
        p.grad holds the reduced gradient; raises the first tutti.Error after waiting for all."""
        if not self._included:
            self._synchronized = True
            return
        for p in self._requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        error = None
        for p, (handle, ctx) in self._handles.items():
            try:
                if callable(handle):  # a sparse gradient's: its aggregate
                    reduced = handle()
                else:
                    reduced = self._compression.decompress(synchronize(handle), ctx)
                if p.grad.is_sparse:
                    # Sparse tensors have no copy_ from another layout; as Horovod does.
                    p.grad.zero_().add_(reduced if reduced.is_sparse else reduced.to_sparse())
                elif reduced is not p.grad:
                    p.grad.copy_(reduced)
            except Exception as e:  # every handle is waited for, so none is left in flight
                error = error or e
        self._handles.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._synchronized = True
        if error is not None:
            raise error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, step() does not synchronize (the caller did, e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are reduced again")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("tutti.horovod DistributedOptimizer: zero_grad() was called after backward() "
                                 "but before step() or synchronize()")
        return super().zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self._forget_handles()
        return super().load_state_dict(*args, **kwargs)

    def _forget_handles(self):
        """Drops the gradients in flight: the state they would reduce into is replaced, or the job
        that reduced them is gone."""
        self._handles.clear()
        self._synchronized = False
        self._should_synchronize = True
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def _job_rebuilt(self):
        """After hvd.elastic rebuilt the job: the failed job's handles are gone, and an optimizer
        made in a job of one rank gets the hooks it did not need there."""
        self._forget_handles()
        if not self._grad_accs and self._included and _size_of(self._process_set) > 1:
            self._register_hooks()

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes


def _parameter_names(param_groups, named_parameters):
    """parameter -> name. Unnamed parameters are named as Horovod names them (allreduce.noname.I,
    I counting over every param group, so names never repeat)."""
    params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: "allreduce.noname.%d" % i for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise InvalidArgument("DistributedOptimizer: named_parameters must be (name, parameter) pairs, e.g. "
                              "model.named_parameters()")
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgument("DistributedOptimizer: duplicate parameter names: " + ", ".join(duplicates))
    by_param = {p: name for name, p in named}
    missing = [i for i, p in enumerate(params) if p not in by_param]
    if missing:
        raise InvalidArgument("DistributedOptimizer: named_parameters lacks %d of the optimizer's parameters "
                              "(positions %s)" % (len(missing), missing[:8]))
    return {p: by_param[p] for p in params}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False, process_set=global_process_set):
    """Wraps `optimizer` (any torch.optim optimizer) so that step() applies gradients reduced over
    the ranks with `op` (Average or Sum; Adasum raises tutti.Unsupported), after
    `backward_passes_per_step` backward passes summed locally, as Horovod: call step() once per
    that many backward passes. `compression` is Compression.none or Compression.fp16. num_groups
    and groups are accepted and ignored (the engine fuses by itself); sparse gradients are
    reduced as Horovod does (indices and values allgathered) unless sparse_as_dense=True. With
    `process_set`, the gradients are reduced over its ranks. The result shares the optimizer's
    param groups and state."""
    if op == Adasum:
        raise Unsupported("DistributedOptimizer: op Adasum is not supported by Tutti (use Average or Sum)")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidArgument("DistributedOptimizer: gradient_predivide_factor needs op Average")
    if int(backward_passes_per_step) < 1:
        raise InvalidArgument("DistributedOptimizer: backward_passes_per_step must be at least 1, not %r"
                              % (backward_passes_per_step,))
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._sparse_as_dense = sparse_as_dense
    wrapped._tutti_setup(named_parameters, compression, int(backward_passes_per_step), op,
                         gradient_predivide_factor, process_set)
    return wrapped
