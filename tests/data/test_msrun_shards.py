"""Two real msrun ranks on CPU take their shard from the communication context: disjoint, equal, covering."""
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from mindvl.data.loader import load_meta


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_msrun_ranks_read_disjoint_equal_shards(small_cfg, small_report, tmp_path):
    msrun = shutil.which("msrun")
    assert msrun, "msrun ships with mindspore; it should be on PATH next to python"
    worker = Path(__file__).with_name("msrun_shard_worker.py")
    command = [msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
               f"--log_dir={tmp_path / 'logs'}", "--join=True", str(worker), small_cfg.data.root, str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "logs").glob("*.log"))
    assert done.returncode == 0, logs
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["shard"] for r in ranks] == [[0, 2], [1, 2]]
    seen = [{i for batch in r["ids"] for i in batch} for r in ranks]
    assert len(ranks[0]["ids"]) == len(ranks[1]["ids"])  # equal steps: no rank waits in a collective
    assert seen[0].isdisjoint(seen[1])
    examples = load_meta(small_cfg.data.root)["counts"]["train"]["examples"]
    assert len(seen[0] | seen[1]) == 2 * (examples // 2 // 4) * 4  # everything but the dropped remainder
