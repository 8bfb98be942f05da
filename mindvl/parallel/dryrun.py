"""`mindvl plan --dryrun`: MindSpore's own dry run compiles a strategy per rank without the cluster.

MindSpore's DryRun mocks the device side: `msrun --sim_level=1 --sim_rank_id=R` starts one process that
believes it is rank R of `--worker_num` devices, compiles the training graph under the strategy (shapes,
collectives, pipeline stages) and logs the device memory that rank would use ("Used peak memory usage
(without fragments): 23716M", "Actual peak memory usage (with fragments): 26244M"). mindvl runs
`mindvl train` that way for one step, one rank per pipeline stage (ranks of a stage compile the same
graph), and reads those lines back.

It needs an Ascend build of MindSpore (the dry run simulates Ascend devices); the CPU build refuses
semi-auto-parallel graphs altogether. Here (CPU only) the commands and the log reading are checked,
not run (tests/parallel/test_dryrun.py).
"""
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mindvl.errors import ConfigError
from mindvl.parallel.strategy import ParallelStrategy

SIM_LEVEL = 1  # compile + the operators' memory statistics (level 0 compiles only)
MEMORY_LINES = {"used_peak_mb": re.compile(r"Used peak memory usage \(without fragments\): (\d+)M"),
                "actual_peak_mb": re.compile(r"Actual peak memory usage \(with fragments\): (\d+)M")}


def require_ascend_build() -> None:
    import mindspore as ms

    if not ms.hal.is_available("Ascend"):
        raise ConfigError(f"--dryrun: MindSpore's dry run simulates Ascend devices and needs an Ascend build of "
                          f"MindSpore; this one (mindspore {ms.__version__}) has no Ascend backend. Install "
                          f"mindspore for Ascend (CANN) to compile the strategy per rank, or use `mindvl plan` "
                          f"without --dryrun for the model's prediction")


def simulated_ranks(strategy: ParallelStrategy) -> List[int]:
    """The first rank of every pipeline stage (stage-major rank order, as MindSpore assigns stages)."""
    per_stage = strategy.data_parallel * strategy.model_parallel
    return [stage * per_stage for stage in range(strategy.pipeline_stage)]


def dryrun_command(config: str, overrides: Sequence[str], given: str, strategy: ParallelStrategy, rank: int,
                   folder: Path) -> List[str]:
    """The msrun command that compiles one training step as `rank` of the strategy's devices; `given` is
    the strategy as the user named it (a shipped name or a path)."""
    msrun, mindvl = shutil.which("msrun") or "msrun", shutil.which("mindvl") or "mindvl"
    settings = [*overrides, f"train.parallel={given}", "train.max_steps=1", "train.checkpoint_every=1",
                f"train.output_dir={folder / f'rank_{rank}'}"]
    return [msrun, f"--worker_num={strategy.devices}", "--local_worker_num=1", f"--sim_level={SIM_LEVEL}",
            f"--sim_rank_id={rank}", f"--log_dir={folder / f'logs_{rank}'}", "--join=True",
            mindvl, "train", "--config", config, *[arg for value in settings for arg in ("--set", value)]]


def read_memory(log: str) -> Dict[str, Optional[int]]:
    """The dry run's peak memory lines of one rank's log, in MB (None: the line is missing)."""
    found = {}
    for key, pattern in MEMORY_LINES.items():
        values = [int(v) for v in pattern.findall(log)]
        found[key] = max(values) if values else None
    return found


def run_dryrun(config: str, overrides: Sequence[str], given: str, strategy: ParallelStrategy, folder: Path,
               timeout: float = 3600) -> Dict[int, dict]:
    """Compile the strategy for each simulated rank -> {rank: {"ok", "used_peak_mb", "actual_peak_mb",
    "log"}}. The recipe's data set must be built (`mindvl train` reads one batch's shapes)."""
    require_ascend_build()
    results = {}
    for rank in simulated_ranks(strategy):
        command = dryrun_command(config, overrides, given, strategy, rank, folder)
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "GLOG_v": "1"})  # the memory lines are INFO
        logs = "\n".join(p.read_text(errors="replace") for p in (folder / f"logs_{rank}").glob("*.log"))
        results[rank] = {"ok": done.returncode == 0, **read_memory(logs + done.stdout + done.stderr),
                         "log": str(folder / f"logs_{rank}")}
    return results
