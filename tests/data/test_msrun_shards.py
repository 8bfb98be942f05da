"""Two real msrun ranks on CPU take their shard from the communication context: each reads half of every
global batch, the halves disjoint and together the single worker's batch."""
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from mindvl.data.loader import TrainStream


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_msrun_ranks_each_read_their_half_of_every_global_batch(small_cfg, small_report, tmp_path):
    msrun = shutil.which("msrun")
    assert msrun, "msrun ships with mindspore; it should be on PATH next to python"
    worker = Path(__file__).with_name("msrun_shard_worker.py")
    command = [msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
               f"--log_dir={tmp_path / 'logs'}", "--join=True", str(worker), small_cfg.data.root, str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "logs").glob("*.log"))
    assert done.returncode == 0, logs
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["shard"] for r in ranks] == [r["context"] for r in ranks] == [[0, 2], [1, 2]]
    assert [r["micro_batch_size"] for r in ranks] == [4, 4]  # data.batch_size 8 is the global batch
    single = TrainStream(small_cfg, shard_id=0, num_shards=1)  # the same recipe on one worker
    want = single.epoch_rows(0).reshape(single.steps_per_epoch, -1).tolist()
    assert len(ranks[0]["ids"]) == len(ranks[1]["ids"]) == len(want)  # equal steps: no rank waits in a collective
    assert [a + b for a, b in zip(ranks[0]["ids"], ranks[1]["ids"])] == want
    assert {i for r in ranks for batch in r["ids"] for i in batch} == {i for step in want for i in step}
