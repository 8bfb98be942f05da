"""`mindvl plan --dryrun`: MindSpore's dry run needs an Ascend build, which this machine lacks, so the
refusal is run and the commands and the log reading are checked statically (README: what runs where)."""
from pathlib import Path

from mindvl.cli import main
from mindvl.parallel.dryrun import dryrun_command, read_memory, simulated_ranks
from mindvl.parallel.strategy import create_strategy


def test_one_rank_per_pipeline_stage_in_stage_major_order():
    assert simulated_ranks(create_strategy("dp2-mp2-pp2")) == [0, 4]
    assert simulated_ranks(create_strategy("dp32-mp8-pp4")) == [0, 256, 512, 768]
    assert simulated_ranks(create_strategy("dp8")) == [0]


def test_the_command_simulates_one_rank_of_the_whole_cluster(tmp_path):
    command = dryrun_command("tiny", ["data.root=/data"], "dp2-mp2-pp2", create_strategy("dp2-mp2-pp2"), 4, tmp_path)
    assert Path(command[0]).name == "msrun"
    for flag in ("--worker_num=8", "--local_worker_num=1", "--sim_level=1", "--sim_rank_id=4", "--join=True"):
        assert flag in command
    train = command.index("train")
    assert Path(command[train - 1]).name == "mindvl" and command[train + 1:train + 3] == ["--config", "tiny"]
    assert set(command[train + 3::2]) == {"--set"}
    assert {"data.root=/data", "train.parallel=dp2-mp2-pp2", "train.max_steps=1"} <= set(command[train + 4::2])


def test_the_memory_lines_of_the_documented_format_are_read():
    log = ("[INFO] Device MOC memory size: 65536M\n[INFO] MindSpore Used memory size: 59392M\n"
           "[INFO] Used peak memory usage (without fragments): 23716M\n"
           "[INFO] Actual peak memory usage (with fragments): 26244M\n")
    assert read_memory(log) == {"used_peak_mb": 23716, "actual_peak_mb": 26244}
    assert read_memory("nothing here") == {"used_peak_mb": None, "actual_peak_mb": None}


def test_a_cpu_build_refuses_with_the_reason(tmp_path, capsys):
    assert main(["plan", "--config", "tiny", "--strategy", "dp2-mp4", "--dryrun", str(tmp_path)]) == 2
    assert "needs an Ascend build of MindSpore" in capsys.readouterr().err
