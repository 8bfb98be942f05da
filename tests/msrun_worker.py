"""Run under msrun (2 ranks) by tests/conftest.py's msrun_ranks fixture, once per session, and as one plain
process by tests/train/test_distributed.py. Every rank writes to OUT (`msrun_worker.py OUT [DATA_ROOT]`):

rank_<r>_of_<world>.npz: the gradients of a group-contrastive loss over a fixed batch of 8, each rank
embedding its half of the batch and gathering the embeddings with GatherWithGrad, then averaging gradients
with gradient_reducer: the loss, the gathered image embeddings and every parameter's gradient (after the
reducer), by parameter name.

rank_<r>.json, given DATA_ROOT: the shard the rank's TrainStream took from the communication context and
the sample ids it read over one epoch.
"""
import json
import sys
from typing import Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from mindvl.config import load_config
from mindvl.data.reading.stream import TrainStream
from mindvl.train.distributed import GatherWithGrad, gradient_reducer, init_data_parallel

BATCH, INPUT, EMBED = 8, 6, 4
GROUPS = np.array([0, 1, 2, 0, 3, 1, 4, 0], np.int32)  # repeated groups: rows with several positives


class GroupContrastive(nn.Cell):
    """Symmetric contrastive loss over the gathered batch with every same-group pair a positive (targets
    spread evenly over a row's positives), plus a local term over this rank's rows only."""

    def __init__(self, rank: int, world: int, weights) -> None:
        super().__init__()
        self.image = nn.Dense(INPUT, EMBED, weight_init=Tensor(weights[0]), bias_init=Tensor(weights[1]))
        self.text = nn.Dense(INPUT, EMBED, weight_init=Tensor(weights[2]), bias_init=Tensor(weights[3]))
        self.gather = GatherWithGrad(rank, world)
        self.gather_groups = GatherWithGrad(rank, world)
        self.log_softmax = ops.LogSoftmax(axis=-1)

    def construct(self, image, text, group):
        local = self.image(image)  # (B, E), this rank's rows
        images = self.gather(local)  # (world * B, E)
        texts = self.gather(self.text(text))
        groups = self.gather_groups(group)  # (world * B,)
        images = images / ops.sqrt((images * images).sum(-1, keepdims=True))
        texts = texts / ops.sqrt((texts * texts).sum(-1, keepdims=True))
        logits = 5.0 * ops.matmul(images, texts.T)  # (N, N)
        positives = ops.cast(groups.reshape(-1, 1) == groups.reshape(1, -1), ms.float32)
        targets = positives / positives.sum(-1, keepdims=True)
        contrastive = -(targets * self.log_softmax(logits)).sum(-1).mean() \
            - (targets * self.log_softmax(logits.T)).sum(-1).mean()
        return 0.5 * contrastive + 0.1 * (local * local).mean(), images


class Gradients(nn.Cell):
    def __init__(self, net: nn.Cell, world: int) -> None:
        super().__init__()
        self.net = net
        self.weights = ms.ParameterTuple(net.trainable_params())
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.reducer = gradient_reducer(self.weights, world)

    def construct(self, image, text, group):
        loss, images = self.net(image, text, group)
        grads = self.grad(self.net, self.weights)(image, text, group, (ops.ones_like(loss), ops.zeros_like(images)))
        return loss, images, self.reducer(grads)


def gradients(rank: int, world: int, out: str) -> None:
    rng = np.random.default_rng(0)  # the same batch and weights on every rank: parameters are not broadcast
    images, texts = (rng.normal(size=(BATCH, INPUT)).astype(np.float32) for _ in range(2))
    weights = [rng.normal(size=shape).astype(np.float32) * 0.5
               for shape in ((EMBED, INPUT), (EMBED,), (EMBED, INPUT), (EMBED,))]
    share = BATCH // world
    mine = slice(rank * share, (rank + 1) * share)
    net = Gradients(GroupContrastive(rank, world, weights), world)
    loss, gathered, grads = net(Tensor(images[mine]), Tensor(texts[mine]), Tensor(GROUPS[mine]))
    np.savez(f"{out}/rank_{rank}_of_{world}.npz", loss=loss.asnumpy(), gathered=gathered.asnumpy(),
             **{p.name: g.asnumpy() for p, g in zip(net.weights, grads)})


def shard_ids(rank: int, world: int, root: str, out: str) -> None:
    stream = TrainStream(load_config("tiny", [f"data.root={root}", "data.batch_size=8", "data.num_workers=1"]))
    ids = []
    for sample_ids, _ in stream:
        ids.append(sample_ids.tolist())
        if len(ids) == stream.steps_per_epoch * stream.accumulation:
            break
    with open(f"{out}/rank_{rank}.json", "w") as handle:
        json.dump({"shard": [stream.shard_id, stream.num_shards], "context": [rank, world],
                   "micro_batch_size": stream.micro_batch_size, "ids": ids}, handle)


def main(out: str, root: Optional[str] = None) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    rank, world = init_data_parallel()
    assert init_data_parallel() == (rank, world)  # idempotent
    gradients(rank, world, out)
    if root is not None:
        shard_ids(rank, world, root, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
