"""Knowledge distillation: a 2-step student run from the session's trained teacher, the default model path
untouched by feature taps, the distillation objectives against references, and the refusals that name
the key (a teacher of other data or preprocess, config errors)."""
import copy
import json
import shutil
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from safetensors.numpy import load_file

from mindvl.cli import main
from mindvl.errors import ConfigError
from mindvl.config import EncoderConfig, load_config
from mindvl.export.package_writer import count_cell_parameters
from mindvl.package_reader import read_manifest
from mindvl.train.distill import FeatureLoss, FrozenTeacher, SoftTargetKL, teacher_config

# A student smaller than the session teacher (widths 32, one block per stack): widths 16.
STUDENT = ["model.vision.width=16", "model.text.width=16", "model.audio.width=16", "model.fusion.width=16",
           "model.vision.layers=1", "model.text.layers=1", "model.audio.layers=1", "model.fusion.layers=1",
           "model.embed_dim=8"]


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)


def _student(trained_run, out, *extra):
    cfg, result = trained_run
    return load_config("tiny", [
        f"data.root={cfg.data.root}", f"train.output_dir={out}", "data.batch_size=8", "data.num_workers=1",
        "train.max_steps=2", "train.warmup_steps=1", "train.log_every=1", *STUDENT,
        f"train.distill.teacher={result.output_dir}", "train.distill.feature_layers=[[0, 0]]", *extra])


@pytest.fixture(scope="module")
def distilled(trained_run, tmp_path_factory):
    """(student config, TrainResult) of 2 distillation steps with every term on."""
    from mindvl.train import train

    cfg = _student(trained_run, tmp_path_factory.mktemp("student"))
    return cfg, train(cfg, progress=False)


# ----------------------------------------------------------------------------- a real run

def test_distillation_trains_the_student_and_logs_every_part_by_name(distilled):
    _, result = distilled
    names = ["loss", "contrastive", "answer", "lm", "kd_answer", "kd_lm", "kd_feature"]
    assert list(result.final_losses) == names
    assert all(np.isfinite(v) for v in result.final_losses.values())
    assert result.final_losses["kd_answer"] > 0 and result.final_losses["kd_feature"] > 0
    records = [json.loads(line) for line in (Path(result.output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert set(names) <= set(record) and all(np.isfinite(record[name]) for name in names)
        parts = [record[name] for name in names[1:]]
        # total = task weights (0.5, 1, 0.5) . task parts + distill weights (1, 0.5, 1) . distillation parts
        assert record["loss"] == pytest.approx(np.dot([0.5, 1, 0.5, 1, 0.5, 1], parts), rel=1e-3)


def test_the_checkpoint_holds_the_student_alone_and_loads_for_evaluation(distilled):
    from mindvl.cells import build_cells
    from mindvl.model_factory import load_model
    from mindvl.runs import parameter_paths

    cfg, result = distilled
    saved = load_file(str(Path(result.checkpoint) / "model.safetensors"))
    student = parameter_paths(build_cells(cfg.model, cfg.preprocess))
    assert set(saved) == set(student)  # no teacher, no feature map
    assert {name: value.shape for name, value in saved.items()} == {n: p.shape for n, p in student.items()}
    assert result.trainable_parameters == sum(value.size for value in saved.values())
    optimizer = load_file(str(Path(result.checkpoint) / "optimizer.safetensors"))
    assert {"extra/distill/projections.0.weight", "extra/distill/projections.0.bias"} <= set(optimizer)
    assert optimizer["extra/distill/projections.0.weight"].shape == (32, 16)  # student width -> teacher width
    loaded_cfg, model, _ = load_model(result.output_dir)
    assert loaded_cfg.model.fusion.width == 16
    for name, param in parameter_paths(model).items():
        np.testing.assert_array_equal(param.asnumpy(), saved[name])


def test_mindvl_export_distill_packages_the_completed_student(distilled, trained_run, tmp_path):
    """The command trains only when the student's run is incomplete; here it packages the finished one."""
    cfg, result = distilled
    teacher = trained_run[1].output_dir
    args = ["export", "distill", "--teacher", str(teacher), "--config", "tiny", "--run-dir", str(result.output_dir),
            "--out", str(tmp_path / "pkg"), "--graph", "image_embed", "--no-eval"]
    for override in (f"data.root={cfg.data.root}", *STUDENT):
        args += ["--set", override]
    assert main(args) == 0
    manifest = read_manifest(tmp_path / "pkg")
    compression = manifest["compression"]
    assert compression["method"] == "distilled" and compression["teacher"]["checkpoint"].startswith(str(teacher))
    from mindvl.model_factory import load_model

    _, teacher_model, _ = load_model(str(teacher))
    assert compression["teacher_parameters"] == count_cell_parameters(teacher_model) > manifest["parameters"]


def test_resume_restores_the_feature_map_and_never_optimizes_the_teacher(distilled):
    from mindvl.train import Trainer, TrainingArguments, create_model

    cfg, result = distilled
    resumed = copy.deepcopy(cfg)
    resumed.train.max_steps = 3
    trainer = Trainer(create_model(resumed), TrainingArguments(resumed, resume=result.checkpoint, progress=False))
    saved = load_file(str(Path(result.checkpoint) / "optimizer.safetensors"))
    for key, value in trainer.loss_net.projection_state().items():
        np.testing.assert_array_equal(value, saved[f"extra/{key}"])
    optimized = {id(p) for p in trainer.optimizer.parameters}
    teacher = list(trainer.loss_net.teacher.get_parameters())
    assert teacher and not any(p.requires_grad or id(p) in optimized for p in teacher)
    assert all(id(p) in optimized for p in trainer.loss_net.projections().values())
    assert not trainer.loss_net.teacher.model.training  # eval mode, whatever the trainer set


def test_the_frozen_teacher_stays_in_eval_mode():
    teacher = FrozenTeacher(nn.Dropout(p=0.5))
    nn.SequentialCell([teacher]).set_train(True)
    assert not teacher.model.training


# ----------------------------------------------------------------------------- feature taps

class _Tapped(nn.Cell):
    """A stack's construct_tapped as a graph of its own."""

    def __init__(self, stack):
        super().__init__(auto_prefix=False)
        self.stack = stack

    def construct(self, x):
        return self.stack.construct_tapped(x)


def test_feature_taps_leave_the_default_output_and_return_the_tapped_blocks():
    from mindvl.cells import TransformerStack

    ms.set_seed(0)
    plain = TransformerStack(EncoderConfig(width=16, layers=3, heads=2))
    tapped = TransformerStack(EncoderConfig(width=16, layers=3, heads=2))
    for mine, theirs in zip(tapped.get_parameters(), plain.get_parameters()):
        mine.set_data(theirs.data)
    tapped.taps = (2, 0)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32))
    output = plain(x)
    assert isinstance(output, Tensor) and plain.taps == ()  # the default path returns the output alone
    tapped_output, states = _Tapped(tapped)(x)
    np.testing.assert_array_equal(tapped_output.asnumpy(), output.asnumpy())
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the reference block by block, without a graph per block
    try:
        block_outputs, h = [], x
        for block in plain.blocks:
            h = block(h)
            block_outputs.append(h.asnumpy())
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    assert states.shape == (2, 2, 5, 16)
    np.testing.assert_allclose(states.asnumpy()[0], block_outputs[2], atol=1e-6)
    np.testing.assert_allclose(states.asnumpy()[1], block_outputs[0], atol=1e-6)


def test_feature_taps_outside_the_fusion_are_refused():
    from mindvl.cells import build_cells

    cfg = load_config("tiny", STUDENT + ["model.text.vocab_size=20"])
    model = build_cells(cfg.model, cfg.preprocess)
    assert model.fusion.encoder.taps == ()
    with pytest.raises(ValueError, match=r"feature taps \[1\]: the fusion has blocks 0..0"):
        model.set_feature_taps([1])


# ----------------------------------------------------------------------------- the objectives

def test_soft_target_kl_is_zero_for_equal_logits_and_matches_numpy():
    rng = np.random.default_rng(0)
    student = rng.standard_normal((4, 3, 7)).astype(np.float32)
    teacher = rng.standard_normal((4, 3, 7)).astype(np.float32)
    kl = SoftTargetKL(temperature=2.0)
    np.testing.assert_allclose(kl(Tensor(student), Tensor(student)).asnumpy(), 0.0, atol=1e-6)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p_teacher = log_softmax(teacher / 2)
    expected = (np.exp(p_teacher) * (p_teacher - log_softmax(student / 2))).sum(-1) * 4
    got = kl(Tensor(student), Tensor(teacher)).asnumpy()
    assert got.shape == (4, 3) and np.all(got > 0)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)  # float32 log-softmax differences


def test_feature_loss_averages_valid_slots_only():
    loss = FeatureLoss(student_width=2, teacher_width=3, pairs=[(1, 0)])
    weight = np.array([[1, 0], [0, 1], [1, 1]], np.float32)  # (teacher, student)
    loss.projections[0].weight.set_data(Tensor(weight))
    rng = np.random.default_rng(1)
    student = rng.standard_normal((1, 2, 4, 2)).astype(np.float32)  # (taps, R, S, width)
    teacher = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    segment = np.array([[1, 1, 2, 0], [1, 0, 0, 0]], np.int32)
    teacher[1] = student[0] @ weight.T  # tap 1 matches exactly on every slot...
    teacher[1, segment == 0] += 100.0  # ...except padding, which must not count
    got = loss(Tensor(student), Tensor(teacher), Tensor(segment)).asnumpy()
    np.testing.assert_allclose(got, 0.0, atol=1e-6)
    teacher[1, 0, 0] += 3.0  # one valid slot off by 3 in each of 3 channels: 27 / (4 valid slots x 3)
    got = loss(Tensor(student), Tensor(teacher), Tensor(segment)).asnumpy()
    np.testing.assert_allclose(got, 27 / 12, rtol=1e-5)


# ----------------------------------------------------------------------------- refusals

def _bound(cfg):
    from mindvl.model_factory import bind_config

    return bind_config(cfg)


@pytest.mark.parametrize("override, fragments", [
    ("preprocess.hop_length=160", ["preprocess.hop_length", "320", "160"]),
    ("model.vision.patch_size=8", ["model.vision.patch_size", "16", "8"]),
    ("train.distill.feature_layers=[[1, 0]]", ["train.distill.feature_layers[0]", "teacher fusion block 1",
                                               "blocks 0..0"]),
    ("train.distill.feature_layers=[[0, 0], [0, 2]]", ["train.distill.feature_layers[1]", "student fusion block 2"]),
    ("model.pretrained.cache=somewhere", ["train.distill.teacher", "model.pretrained.cache"]),
])
def test_a_teacher_that_reads_batches_differently_is_refused_naming_the_key(trained_run, tmp_path, override,
                                                                           fragments):
    cfg = _bound(_student(trained_run, tmp_path, override))
    with pytest.raises(ConfigError) as info:
        teacher_config(cfg)
    for fragment in fragments:
        assert fragment in str(info.value)


def _fake_teacher(trained_run, tmp_path, edit_config=None, edit_data=None):
    """A teacher run folder whose config.json (and data folder: tokenizer and meta) are edited copies."""
    cfg, result = trained_run
    data = tmp_path / "other_data"
    data.mkdir()
    for name in ("tokenizer.json", "meta.json"):
        shutil.copy(Path(cfg.data.root) / name, data / name)
    if edit_data:
        edit_data(data)
    run = tmp_path / "teacher"
    run.mkdir()
    saved = json.loads((Path(result.output_dir) / "config.json").read_text())
    saved["data"]["root"] = str(data)
    if edit_config:
        edit_config(saved)
    (run / "config.json").write_text(json.dumps(saved))
    shutil.copy(Path(result.checkpoint) / "model.safetensors", run / "model.safetensors")
    return run


def _swap_answers(data: Path):
    meta = json.loads((data / "meta.json").read_text())
    meta["answers"][:2] = meta["answers"][1::-1]
    (data / "meta.json").write_text(json.dumps(meta))


def _rename_token(data: Path):
    tokenizer = json.loads((data / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    word = next(w for w in vocab if w.isalpha())
    vocab["zzz" + word] = vocab.pop(word)
    (data / "tokenizer.json").write_text(json.dumps(tokenizer))


def _more_tokens(saved):
    saved["model"]["text"]["vocab_size"] += 1


@pytest.mark.parametrize("edit_config, edit_data, fragments", [
    (None, _swap_answers, ["data.root", "answers", "differ"]),
    (None, _rename_token, ["data.root", "tokenizer differs"]),
    (_more_tokens, None, ["model.text.vocab_size", "same data build"]),
])
def test_a_teacher_of_other_data_is_refused_naming_the_key(trained_run, tmp_path, edit_config, edit_data,
                                                           fragments):
    teacher = _fake_teacher(trained_run, tmp_path, edit_config, edit_data)
    cfg = _bound(_student(trained_run, tmp_path / "out", f"train.distill.teacher={teacher}"))
    with pytest.raises(ConfigError) as info:
        teacher_config(cfg)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_teacher_of_the_same_data_in_another_folder_is_accepted(trained_run, tmp_path):
    teacher = _fake_teacher(trained_run, tmp_path)
    cfg = _bound(_student(trained_run, tmp_path / "out", f"train.distill.teacher={teacher}"))
    teacher_cfg, weights = teacher_config(cfg)
    assert weights == teacher / "model.safetensors" and teacher_cfg.model.fusion.width == 32


def test_a_missing_teacher_names_the_key(trained_run, tmp_path):
    cfg = _bound(_student(trained_run, tmp_path, f"train.distill.teacher={tmp_path / 'nowhere'}"))
    with pytest.raises(ConfigError, match=r"train.distill.teacher: .*nowhere: no checkpoint found"):
        teacher_config(cfg)


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("override, fragments", [
    ("train.distill.temperature=0", ["train.distill.temperature", "> 0"]),
    ("train.distill.lm_weight=-1", ["train.distill.lm_weight", ">= 0", "-1"]),
    ("train.distill.feature_layers=[[1]]", ["train.distill.feature_layers[0]", "[teacher block, student block]"]),
    ("train.distill.feature_layers=[[0, -1]]", ["train.distill.feature_layers[0]", "[0, -1]"]),
    ("train.distill.feature_layers=[[0, 0], [0, 0]]", ["train.distill.feature_layers", "distinct pairs"]),
    ("train.distill.feature_layers=[0, 0]", ["train.distill.feature_layers[0]", "expected a list of an integer"]),
    ("train.distill.teachr=runs/tiny", ["train.distill.teachr", "unknown key", "'teacher'"]),
])
def test_bad_distill_settings_name_the_key(override, fragments):
    with pytest.raises(ConfigError) as info:
        load_config("tiny-student", [override])
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("zero", [["answer_weight", "lm_weight", "feature_weight"],
                                  ["answer_weight", "lm_weight", "feature_layers"]])
def test_a_teacher_that_would_teach_nothing_is_refused(zero):
    overrides = [f"train.distill.{name}={'[]' if name == 'feature_layers' else 0}" for name in zero]
    assert load_config("tiny-student", overrides).train.distill.teacher == ""  # off: nothing to check
    with pytest.raises(ConfigError, match=r"train.distill: the teacher would teach nothing"):
        load_config("tiny-student", [*overrides, "train.distill.teacher=runs/tiny"])
    pure = load_config("tiny-student", ["train.distill.task_weight=0", "train.distill.teacher=runs/tiny"])
    assert pure.train.distill.task_weight == 0  # distillation alone is allowed


def test_the_student_recipe_is_a_quarter_of_tiny_with_the_same_inputs(small_cfg, small_report):
    from mindvl.train import create_model

    tiny = load_config("tiny", [f"data.root={small_cfg.data.root}"])
    student = load_config("tiny-student", [f"data.root={small_cfg.data.root}"])
    sizes = [sum(p.size for p in create_model(cfg).get_parameters()) for cfg in (tiny, student)]
    assert 4 * sizes[1] <= sizes[0]
    assert student.preprocess == tiny.preprocess
    assert student.model.vision.patch_size == tiny.model.vision.patch_size
    assert student.train.distill.teacher == "" and student.train.output_dir == "runs/tiny-student"
    assert student.train.distill.feature_layers == [[0, 0], [1, 1]]
    assert all(t < tiny.model.fusion.layers and s < student.model.fusion.layers
               for t, s in student.train.distill.feature_layers)
