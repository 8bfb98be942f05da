"""Data parallelism under msrun: the communication context, a gradient-correct AllGather, gradient averaging.

`msrun --worker_num=R ... train.py` starts R workers (and a scheduler process running the same script);
each must call `init_data_parallel()` before building the network. Every rank reads its own micro-batches
(mindvl.data.reading.stream.TrainStream), computes its gradients, and `gradient_reducer` averages them over the
ranks before the optimizer; ranks must seed identically before building the net (parameters are not
broadcast). Without msrun everything here is a no-op, so one code path serves both.

A loss over the whole global batch (the contrastive objective's negatives) gathers the ranks' embeddings
with `GatherWithGrad`: every rank then computes the same loss over the same (R*B, D) rows, and the
gathered gradient flows back to the rank that produced each row. Local terms (means over the rank's own
rows) need nothing: the reducer's mean over equal shares is the mean over the global batch.
"""
from __future__ import annotations

import os
from typing import Tuple

import mindspore as ms
import numpy as np
from mindspore import nn, ops

# Set by msrun (mindspore/parallel/cluster/process_entity/_api.py) in every process it starts: MS_ROLE is
# MS_WORKER in a worker and MS_SCHED in the scheduler (which runs the same script: its init() serves the
# cluster), with MS_WORKER_NUM, MS_SCHED_HOST and MS_SCHED_PORT; workers also get RANK_ID and DEVICE_ID.
MSRUN_ROLES = ("MS_WORKER", "MS_SCHED")


def launched_by_msrun() -> bool:
    """Whether this process was started by msrun (dynamic cluster), whose init() joins the cluster."""
    return os.environ.get("MS_ROLE") in MSRUN_ROLES and bool(os.environ.get("MS_SCHED_HOST"))


def init_data_parallel() -> Tuple[int, int]:
    """(rank, world). Under msrun: initialise communication once and set DATA_PARALLEL with
    gradients_mean; otherwise (0, 1) and nothing is initialised. Idempotent: a second call only reports."""
    from mindspore.communication import management as communication

    if not communication.GlobalComm.INITED:
        if not launched_by_msrun():
            return 0, 1
        communication.init()
    rank, world = communication.get_rank(), communication.get_group_size()
    if ms.get_auto_parallel_context("parallel_mode") != ms.ParallelMode.DATA_PARALLEL:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return int(rank), int(world)


def world_group() -> str:
    """The communication group of all ranks (its name depends on the backend: hccl, nccl, mccl)."""
    from mindspore.communication import GlobalComm

    return GlobalComm.WORLD_COMM_GROUP


class _SumOverRanks(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, world_group())

    def construct(self, x):
        return self.all_reduce(x)


def sum_over_ranks(values: np.ndarray) -> np.ndarray:
    """`values` summed element-wise over every rank (each rank passes an array of the same shape), e.g. the
    kernel timings every rank must decide on alike (train.kernels auto)."""
    return _SumOverRanks()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()


class GatherWithGrad(nn.Cell):
    """(B, ...) on each of `world` ranks -> (world * B, ...) on every rank, rank 0's rows first.

    Backward: the incoming gradient summed over the ranks (AllReduce), then this rank's B rows. When
    every rank computes the same loss over the gathered rows, each rank's gradient for its rows is then
    world x the single-process one, which `gradient_reducer`'s mean over the ranks cancels: the
    parameters get exactly the gradient of that loss over the whole batch. (AllGather's own backward is
    a ReduceScatter, which the CPU backend lacks.) With world 1 it is the identity and needs no
    communication. B must be the same on every rank (TrainStream's micro-batches are).
    """

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"GatherWithGrad: rank={rank}, world={world}: expected 0 <= rank < world")
        self.rank = rank
        self.world = world
        if world > 1:
            group = world_group()
            self.all_gather = ops.AllGather(group)
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, group)

    def construct(self, x):
        if self.world == 1:
            return x
        return self.all_gather(x)  # (world * B, ...)

    def bprop(self, x, out, dout):
        if self.world == 1:
            return (dout,)
        total = self.all_reduce(dout)  # (world * B, ...): every rank's gradient of its loss
        rows = x.shape[0]
        return (total[self.rank * rows:(self.rank + 1) * rows],)


class _KeepGradients(nn.Cell):
    """The single-process stand-in for DistributedGradReducer: gradients unchanged."""

    def construct(self, grads):
        return grads


def gradient_reducer(parameters, world: int) -> nn.Cell:
    """grads (tuple, in `parameters` order) -> their mean over the `world` ranks:
    `nn.DistributedGradReducer(parameters, mean=True, degree=world)` when world > 1, else a cell that
    returns them unchanged, so a train step calls it unconditionally, after computing the gradients and
    before unscaling / clipping / the update (clipping must see the averaged gradients)."""
    if world == 1:
        return _KeepGradients()
    return nn.DistributedGradReducer(parameters, mean=True, degree=world, group=world_group())


class RankMean(nn.Cell):
    """A tensor's mean over the ranks (AllReduce), so that what rank 0 logs is the global batch's loss;
    the identity on one process."""

    def __init__(self, world: int = 1) -> None:
        super().__init__()
        self.world = world
        if world > 1:
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, world_group())

    def construct(self, x):
        if self.world == 1:
            return x
        return self.all_reduce(x) / self.world
