"""The compiled train step: one graph per input shape (and per micro-batch role)."""
from typing import Sequence

from mindspore import nn, ops


def _average(count, accumulated, grad):
    return (accumulated + grad) / count


def _times(factor, grad):
    return grad * factor


def _zero(accumulated):
    return ops.assign(accumulated, ops.zeros_like(accumulated))


class ScaledLoss(nn.Cell):
    """The objective times the loss scale, so that float16 gradients do not underflow."""

    def __init__(self, loss_net: nn.Cell, scaler):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.scaler = scaler

    def construct(self, *batch):
        loss, parts = self.loss_net(*batch)
        return self.scaler.scale(loss), (loss, parts)


class TrainStep(nn.Cell):
    """Forward, backward and update in one graph.

    construct(apply, *batch) with `apply` a Python bool (one graph each): the micro-batch's gradients are
    added to the accumulators; when `apply`, the accumulated gradients are averaged over the
    micro-batches and the data-parallel ranks, unscaled, their norms per module taken, checked for
    finiteness through those norms (a non-finite step updates nothing and lowers the loss scale), clipped
    and applied.
    Without accumulation (1 micro-batch) nothing is stored between calls. `reducer`: the data-parallel
    gradient mean (mindvl.train.distributed.gradient_reducer; a pass-through on one process); `rank_mean`
    averages the reported losses over the ranks (RankMean).

    Returns (loss, parts, per-module gradient norms in `groups` order, finite, loss scale).
    """

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, scaler, grad_clip: float,
                 groups: Sequence[Sequence[int]], accumulation: int, reducer: nn.Cell, rank_mean: nn.Cell):
        super().__init__()
        self.optimizer = optimizer
        self.scaler = scaler
        self.grad_clip = grad_clip
        self.groups = tuple(tuple(g) for g in groups)
        self.accumulation = accumulation
        self.reducer = reducer
        self.rank_mean = rank_mean
        self.grad_fn = ops.value_and_grad(ScaledLoss(loss_net, scaler), None, optimizer.parameters, has_aux=True)
        if accumulation > 1:
            self.accumulated = optimizer.parameters.clone(prefix="accumulated", init="zeros")
        self.hyper_map = ops.HyperMap()

    def _norms(self, grads):
        norms = ()
        for group in self.groups:
            total = ops.zeros((), grads[0].dtype)
            for index in group:
                total = total + ops.square(grads[index]).sum()
            norms = norms + (ops.sqrt(total),)
        return ops.stack(norms)

    def construct(self, apply, *batch):
        (_, (loss, parts)), grads = self.grad_fn(*batch)
        if self.accumulation > 1:
            if not apply:
                self.hyper_map(ops.assign_add, self.accumulated, grads)
                return (self.rank_mean(loss), self.rank_mean(parts), ops.zeros(len(self.groups), loss.dtype), True,
                        self.scaler.scale_value)
            grads = self.hyper_map(ops.partial(_average, self.accumulation), self.accumulated, grads)
            self.hyper_map(_zero, self.accumulated)
        grads = self.reducer(grads)
        loss, parts = self.rank_mean(loss), self.rank_mean(parts)
        grads = self.scaler.unscale(grads)
        norms = self._norms(grads)
        # a NaN or inf in any gradient makes its module's norm non-finite: checking the few norms replaces
        # amp.all_finite's pass over every gradient (on the CPU ~170 IsFinite kernels, 10% of the tiny step)
        finite = ops.isfinite(norms).all()
        self.scaler.adjust(finite)
        if self.grad_clip > 0:  # the global norm from the module norms: no second pass over the gradients
            factor = self.grad_clip / ops.maximum(ops.sqrt(ops.square(norms).sum()), self.grad_clip)
            grads = self.hyper_map(ops.partial(_times, factor), grads)
        if finite:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, parts, norms, finite, self.scaler.scale_value
