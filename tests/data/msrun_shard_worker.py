"""Run by tests/data/test_msrun_shards.py under msrun: each rank records the sample ids it reads."""
import json
import sys

import mindspore as ms

from mindvl.config import load_config
from mindvl.data.loader import TrainStream
from mindvl.train.distributed import init_data_parallel

root, out = sys.argv[1], sys.argv[2]
ms.set_context(mode=ms.GRAPH_MODE)
rank, world = init_data_parallel()
stream = TrainStream(load_config("tiny", [f"data.root={root}", "data.batch_size=8", "data.num_workers=1"]))
ids = []
for sample_ids, _ in stream:
    ids.append(sample_ids.tolist())
    if len(ids) == stream.steps_per_epoch * stream.accumulation:
        break
with open(f"{out}/rank_{rank}.json", "w") as handle:
    json.dump({"shard": [stream.shard_id, stream.num_shards], "context": [rank, world],
               "micro_batch_size": stream.micro_batch_size, "ids": ids}, handle)
