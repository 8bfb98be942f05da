"""Two real msrun ranks on CPU take their shard from the communication context: each reads half of every
global batch, the halves disjoint and together the single worker's batch."""
import json

import pytest

from mindvl.data.reading.stream import TrainStream


@pytest.mark.slow
def test_two_msrun_ranks_each_read_their_half_of_every_global_batch(small_cfg, msrun_ranks):
    ranks = [json.loads((msrun_ranks / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["shard"] for r in ranks] == [r["context"] for r in ranks] == [[0, 2], [1, 2]]
    assert [r["micro_batch_size"] for r in ranks] == [4, 4]  # data.batch_size 8 is the global batch
    single = TrainStream(small_cfg, shard_id=0, num_shards=1)  # the same recipe on one worker
    want = single.epoch_rows(0).reshape(single.steps_per_epoch, -1).tolist()
    assert len(ranks[0]["ids"]) == len(ranks[1]["ids"]) == len(want)  # equal steps: no rank waits in a collective
    assert [a + b for a, b in zip(ranks[0]["ids"], ranks[1]["ids"])] == want
    assert {i for r in ranks for batch in r["ids"] for i in batch} == {i for step in want for i in step}
