"""Parameter groups per module, frozen modules and selective recomputation."""
import mindspore as ms
import numpy as np
import pytest

from mindvl.cells import build_cells
from mindvl.config import load_config
from mindvl.train.optim import apply_recompute, create_optimizer, freeze_modules, group_indices, module_of
from mindvl.train.schedule import warmup_cosine

from conftest import SMALL_MODEL  # noqa: E402  (tests/conftest.py)


def _setup(*overrides):
    cfg = load_config("tiny", [*SMALL_MODEL, "train.lr=1e-3", "train.warmup_steps=2", *overrides])
    cfg.model.text.vocab_size = 40
    return cfg, build_cells(cfg.model, cfg.preprocess)


def test_every_parameter_belongs_to_one_module():
    _, model = _setup()
    modules = {module_of(name) for name, _ in model.parameters_and_names()}
    assert modules == {"vision", "text", "audio", "fusion", "heads"}
    assert module_of("answer_head.fc.weight") == module_of("image_proj.fc.weight") == "heads"


def test_groups_follow_each_modules_lr_scale_and_weight_decay_and_frozen_modules_drop_out():
    cfg, model = _setup("train.modules.vision.lr_scale=0.1", "train.modules.fusion.weight_decay=0.2",
                        "train.modules.audio.frozen=true")
    freeze_modules(model, cfg.train)
    optimizer = create_optimizer(model, cfg.train, total_steps=10)
    names = {id(p): n for n, p in model.parameters_and_names()}
    optimized = {names[id(p)] for p in optimizer.parameters}
    assert not any(name.startswith("audio.") for name in optimized)
    assert any(name.startswith("vision.") for name in optimized)
    schedule = warmup_cosine(1e-3, cfg.train.min_lr, 2, 10)
    for param, lr, decay in zip(optimizer.parameters, optimizer.learning_rate, optimizer.weight_decay):
        module, name = module_of(names[id(param)]), names[id(param)]
        want = schedule * (0.1 if module == "vision" else 1.0)
        np.testing.assert_allclose(lr.learning_rate.asnumpy(), want, rtol=1e-6, err_msg=name)
        if name.endswith("fc1.weight"):
            assert float(decay) == pytest.approx(0.2 if module == "fusion" else cfg.train.weight_decay)
        if name.endswith(".bias"):
            assert float(decay) == 0.0
    groups = group_indices(optimizer, names)
    assert set(groups) == {"vision", "text", "fusion", "heads"}
    assert sorted(i for g in groups.values() for i in g) == list(range(len(optimizer.parameters)))


def test_recompute_marks_the_listed_blocks_and_refuses_missing_ones():
    cfg, model = _setup("train.modules.fusion.recompute=[0]")
    assert apply_recompute(model, cfg.train) == ["fusion.encoder.blocks.0"]
    assert model.fusion.encoder.blocks[0]._has_config_recompute  # set by Cell.recompute()
    assert not model.vision.encoder.blocks[0]._has_config_recompute
    cfg, model = _setup("train.modules.text.recompute=[3]")
    with pytest.raises(ValueError, match="train.modules.text.recompute: block 3 does not exist"):
        apply_recompute(model, cfg.train)
