"""The `mindvl` command line: clear errors with exit code 2, and the quickstart end to end."""
import json
import subprocess
import sys

import pytest

from conftest import SMALL_MODEL, TEST_VOICES, TRAIN_VOICES, small_overrides


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mindvl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=900)


def test_misspelled_config_key_exits_2_naming_the_key():
    result = run_cli("train", "--set", "train.lrr=0.1")
    assert result.returncode == 2
    assert "train.lrr: unknown key" in result.stderr and "'lr'" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_run_folder_exits_2_with_the_fix(tmp_path):
    result = run_cli("eval", "--run", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "no checkpoint found" in result.stderr and "mindvl train" in result.stderr


def test_a_negative_eval_limit_exits_2_naming_it(tmp_path):
    result = run_cli("eval", "--run", str(tmp_path), "--limit", "-3")
    assert result.returncode == 2 and "-3: a count of questions" in result.stderr


def test_weights_for_a_classifiers_eval_exit_2_naming_the_flag(trained_run, capsys):
    from mindvl.cli import main

    assert main(["eval", "--run", str(trained_run[1].output_dir), "--weights", "int8"]) == 2
    error = capsys.readouterr().err
    assert "--weights: " in error and "is for a generative run's generated answers" in error


def test_training_without_built_data_tells_how_to_build_it(tmp_path):
    result = run_cli("train", "--set", f"data.root={tmp_path / 'missing'}")
    assert result.returncode == 2
    assert "mindvl data build" in result.stderr


def test_plot_of_a_folder_that_is_neither_a_run_nor_a_data_set_exits_2_naming_both(tmp_path, capsys):
    from mindvl.cli import main

    assert main(["plot", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("mindvl: error:") and "holds none of metrics.jsonl, report.json, calibration.json" in error
    assert "mindvl train" in error and "mindvl data build" in error
    assert main(["plot", str(tmp_path / "nowhere")]) == 2 and "does not exist" in capsys.readouterr().err


def test_plot_draws_a_run_into_its_plots_folder_and_a_data_set_where_asked(trained_run, small_cfg, tmp_path, capsys):
    from mindvl.cli import main
    from mindvl.cli.plot import KINDS
    from mindvl.runs import METRICS_FILE

    assert KINDS[0].marker == METRICS_FILE
    run = trained_run[1].output_dir
    assert main(["plot", run]) == 0
    assert capsys.readouterr().out.split() == ["plots:", f"{run}/plots/training.png,", f"{run}/plots/training.svg"]
    overrides = [arg for override in small_overrides(small_cfg.data.root) if not override.startswith("data.root=")
                 for arg in ("--set", override)]
    assert main(["plot", small_cfg.data.root, "--out", str(tmp_path), *overrides]) == 0
    printed = capsys.readouterr().out
    for name in ("data_lengths.png", "data_packing.svg"):
        assert str(tmp_path / name) in printed and (tmp_path / name).is_file()


@pytest.mark.slow
def test_quickstart_runs_every_stage_and_prints_the_summary(tmp_path):
    overrides = ["data.limit=6", "data.batch_size=8", "data.num_workers=1", "train.max_steps=12",
                 "train.warmup_steps=2", "train.checkpoint_every=100", "data.speech_rates=[175]",
                 f"data.train_voices=[{', '.join(TRAIN_VOICES)}]", f"data.test_voices=[{', '.join(TEST_VOICES)}]",
                 *SMALL_MODEL]
    args = ["quickstart", "--workdir", str(tmp_path / "qs")]
    for override in overrides:
        args += ["--set", override]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ("VQA, text question", "VQA, spoken question", "majority baseline", "image -> caption",
                 "speech -> text", "model package", "serving", "device", "C++ runner", "cascade"):
        assert line in result.stdout
    summary = json.loads((tmp_path / "qs" / "summary.json").read_text())
    assert summary["export"]["verify"]["ok"] is True
    assert summary["train"]["steps"] == 12
    assert summary["eval"]["vqa_text"]["count"] == summary["data"]["counts"]["test"]["examples"]
    served = summary["serve"]  # the package answered over REST and gRPC, alike, typed and spoken questions
    assert served["questions"] == 8 and served["protocols_agree"]
    assert not any(answer.startswith("error") for answer in served["answers"]["rest"])
    device = summary["device"]  # the same questions on the device runtime, the C++ runner and the cascade
    assert device["questions"] == 8 and device["same_as_server"] == 8
    assert device["runner"]["ran"] is (device["backend"] == "lite2")
    if device["runner"]["ran"]:
        assert device["runner"]["same_as_device"] == device["runner"]["questions"] == 4
    assert sum(device["cascade"]["sources"].values()) == 8 and device["cascade"]["sources"]["edge_fallback"] == 0
    assert {c["graph"] for c in summary["export"]["verify"]["checks"] if c["graph"].startswith("lite2/")} == \
        ({"lite2/vqa", "lite2/image_embed", "lite2/text_embed", "lite2/audio_embed"} if device["backend"] == "lite2"
         else set())
    assert (tmp_path / "qs" / "package" / "manifest.json").is_file()
    assert summary["try_it"] in result.stdout and (tmp_path / "qs" / "servables" / "vqa" / "1").is_dir()
    plots = summary["plots"]  # the pictures next to the summary, named in it
    assert {"training.png", "data_lengths.png", "data_packing.png", "cascade.png"} <= set(plots["files"])
    assert "plots" in result.stdout
    assert all((tmp_path / "qs" / "plots" / name).is_file() for name in plots["files"])
    assert run_cli("export", "verify", str(tmp_path / "qs" / "package")).returncode == 0
