"""Parallel strategies: the shipped files load, every validation error names its key and a fix, and after
`apply_strategy` the cells' primitives carry the Megatron-style splits, the blocks their pipeline stages
and the recompute flags (inspected here; compiled only on Ascend). Training refuses on CPU what only the
semi-auto-parallel compiler can run. The real 2-worker msrun run driven by parallel_configs/dp2.yaml is
tests/train/test_data_parallel.py."""
import dataclasses
import json

import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config
from mindvl.parallel.apply import apply_strategy, dump_strategy, prepare_training, stage_of_blocks
from mindvl.parallel.strategy import (ParallelStrategy, create_strategy, pipeline_blocks, strategy_names,
                                      validate_strategy)

SHIPPED = {"single": 1, "dp2": 2, "dp8": 8, "dp2-mp4": 8, "dp2-mp2-pp2": 8, "dp8-mp4-pp2": 64, "dp32-mp8-pp4": 1024}


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny", ["model.text.vocab_size=40"])


def strategy(**values) -> ParallelStrategy:
    return dataclasses.replace(ParallelStrategy(), **values)


def test_the_shipped_strategies_load_with_their_device_counts(cfg):
    assert set(SHIPPED) <= set(strategy_names())
    for name, devices in SHIPPED.items():
        loaded = create_strategy(name)
        assert loaded.name == name and loaded.devices == devices
    validate_strategy(create_strategy("dp2-mp4"), cfg)
    assert create_strategy("dp2-mp4").module("vision").data_parallel == 8
    assert create_strategy("dp2-mp4").module("fusion").model_parallel == 4


@pytest.mark.parametrize("values, devices, message", [
    ({"data_parallel": 2, "model_parallel": 2}, 8, r"= 4 devices, not the 8 given"),
    ({"model_parallel": 5}, None, r"model_parallel: model.vision width 96 is not divisible by model_parallel=5"),
    ({"data_parallel": 3}, None, r"data.batch_size: the global batch 64 does not split into .* = 3 equal parts; "
                                 r"use 63 or 66"),
    ({"pipeline_stage": 9, "micro_batch_num": 9}, None, r"pipeline_stage: 9 stages for 8 blocks; use at most 8"),
    ({"pipeline_stage": 2, "micro_batch_num": 1}, None, r"micro_batch_num: 1 micro-batches cannot fill 2"),
    ({"optimizer_weight_shard_size": 2}, None, r"optimizer_weight_shard_size: set, but enable_parallel_optimizer"),
    ({"data_parallel": 4, "enable_parallel_optimizer": True, "optimizer_weight_shard_size": 3}, None,
     r"optimizer_weight_shard_size: 3 does not divide data_parallel=4"),
])
def test_validation_names_the_key_and_the_fix(cfg, values, devices, message):
    with pytest.raises(ConfigError, match=message):
        validate_strategy(strategy(**values), cfg, devices)


def test_module_overrides_and_pipeline_ranges_are_checked(cfg, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data_parallel: 2\nmodel_parallel: 4\nmodules:\n  vision: {data_parallel: 4, model_parallel: 1}\n")
    with pytest.raises(ConfigError, match=r"modules.vision: data_parallel x model_parallel = 4 x 1 must equal "
                                          r"the stage's 8 devices"):
        create_strategy(bad)
    bad.write_text("data_parallel: 1\nmodel_parallel: 1\nmodules:\n  text: {model_parallel: 3}\n"
                   "data_paralel: 2\n")
    with pytest.raises(ConfigError, match=r"data_paralel: unknown key; valid keys here are"):
        create_strategy(bad)
    bad.write_text("pipeline_stage: 2\nmicro_batch_num: 2\npipeline: {assignment: explicit, "
                   "layer_ranges: [[0, 3], [5, 7]]}\n")
    with pytest.raises(ConfigError, match=r"pipeline.layer_ranges\[1\]: \[5, 7\]; .* expected \[4, last >= 4\]"):
        create_strategy(bad)
    bad.write_text("pipeline_stage: 2\nmicro_batch_num: 2\npipeline: {assignment: explicit, "
                   "layer_ranges: [[0, 3], [4, 6]]}\n")
    with pytest.raises(ConfigError, match=r"the last stage ends at block 6, the model has blocks 0..7"):
        validate_strategy(create_strategy(bad), cfg)
    with pytest.raises(ConfigError, match=r"strategy nowhere: no such file or shipped strategy"):
        create_strategy("nowhere")


def test_stages_are_contiguous_balanced_or_explicit(cfg):
    blocks = pipeline_blocks(cfg.model)
    assert blocks[0] == "vision.0" and blocks[-1] == "fusion.1" and len(blocks) == 8
    balanced = stage_of_blocks(cfg, create_strategy("dp2-mp2-pp2"))
    assert balanced == sorted(balanced) and set(balanced) == {0, 1}
    four = stage_of_blocks(cfg, strategy(pipeline_stage=4, micro_batch_num=4))
    assert four == sorted(four) and set(four) == {0, 1, 2, 3}  # every stage gets a block
    explicit = strategy(pipeline_stage=2, micro_batch_num=2,
                        pipeline=dataclasses.replace(ParallelStrategy().pipeline, assignment="explicit",
                                                     layer_ranges=[[0, 5], [6, 7]]))
    assert stage_of_blocks(cfg, explicit) == [0] * 6 + [1] * 2


def test_apply_sets_megatron_splits_stages_and_recompute(cfg):
    from mindvl.cells import build_cells

    model = build_cells(cfg.model, cfg.preprocess)
    hybrid = create_strategy("dp2-mp2-pp2")
    stages = apply_strategy(model, cfg, hybrid)
    block = model.fusion.encoder.blocks[0]
    attn, mlp = block.attn, block.mlp
    assert attn.q_proj.matmul.attrs["in_strategy"] == ((2, 1), (2, 1))  # column: weight rows over mp
    assert attn.out_proj.matmul.attrs["in_strategy"] == ((2, 2), (1, 2))  # row: input width over mp
    assert attn.core.qk_matmul.attrs["in_strategy"] == ((2, 2, 1, 1), (2, 2, 1, 1))  # heads over mp
    assert attn.core.softmax.softmax.attrs["in_strategy"] == ((2, 2, 1, 1),)
    assert mlp.fc1.matmul.attrs["in_strategy"] == ((2, 1), (2, 1))
    assert mlp.fc2.matmul.attrs["in_strategy"] == ((2, 2), (1, 2))
    assert mlp.act.act.erf.attrs["in_strategy"] == ((2, 1, 2),)
    assert mlp.act.add.attrs["in_strategy"] == ((2, 1, 2), (2,))  # fc1's bias, added with the activation
    assert block.norm1.layer_norm.attrs["in_strategy"] == ((2, 1, 1), (1,), (1,))
    assert model.text.word_embeddings.gather.attrs["in_strategy"] == ((1, 1), (2, 1))  # vocab_emb_dp
    assert [stages[b] for b in ("vision.0", "fusion.1")] == [0, 1]
    assert model.vision.encoder.blocks[0].pipeline_stage == 0 and model.fusion.encoder.blocks[1].pipeline_stage == 1
    assert "recompute" in attn.core.qk_matmul.attrs  # select_recompute: scores and softmax only


def test_module_overrides_reach_their_cells(cfg):
    from mindvl.cells import build_cells

    model = build_cells(cfg.model, cfg.preprocess)
    apply_strategy(model, cfg, create_strategy("dp2-mp4"))
    assert model.vision.encoder.blocks[0].attn.q_proj.matmul.attrs["in_strategy"] == ((8, 1), (1, 1))
    assert model.fusion.encoder.blocks[0].attn.q_proj.matmul.attrs["in_strategy"] == ((2, 1), (4, 1))


def test_dump_strategy_lists_the_primitives_and_the_context(cfg):
    dumped = dump_strategy(cfg, create_strategy("dp2-mp2-pp2"))
    assert dumped["context"]["parallel_mode"] == "semi_auto_parallel" and dumped["context"]["pipeline_stages"] == 2
    assert dumped["primitives"]["fusion.encoder.blocks.0.attn.out_proj.matmul"] == [[2, 2], [1, 2]]
    assert set(dumped["stages"]) == set(pipeline_blocks(cfg.model))


def test_training_on_cpu_refuses_tensor_and_pipeline_splits(cfg):
    plain = load_config("tiny", ["model.text.vocab_size=40", "train.parallel=dp2-mp2-pp2"])
    with pytest.raises(ConfigError, match=r"model_parallel, pipeline_stage need MindSpore's semi-auto-parallel "
                                          r"compiler, which runs on Ascend only"):
        prepare_training(plain, None, world=8)
    with pytest.raises(ConfigError, match=r"= 2 devices, not the 1 given"):
        prepare_training(load_config("tiny", ["model.text.vocab_size=40", "train.parallel=dp2"]), None, world=1)
    accumulating = load_config("tiny", ["model.text.vocab_size=40", "train.parallel=" + str(_micro_batches(4))])
    prepare_training(accumulating, None, world=1)
    assert accumulating.train.grad_accumulation == 4
    assert accumulating.train.modules.fusion.recompute == [0, 1]  # recompute: every block


def _micro_batches(count: int):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "micro.yaml"
    path.write_text(f"micro_batch_num: {count}\nrecompute_config: {{recompute: true}}\n")
    return path


def test_mindvl_plan_dumps_and_refuses_on_the_command_line(capsys):
    from mindvl.cli import main

    assert main(["plan", "--config", "tiny", "--strategy", "dp2-mp4", "--dump-strategy"]) == 0
    dumped = json.loads(capsys.readouterr().out)
    assert dumped["primitives"]["fusion.encoder.blocks.1.mlp.fc2.matmul"] == [[2, 4], [1, 4]]
    assert dumped["primitives"]["vision.encoder.blocks.1.mlp.fc2.matmul"] == [[8, 1], [1, 1]]
    assert main(["plan", "--config", "tiny", "--strategy", "dp2", "--devices", "8"]) == 2
    assert "= 2 devices, not the 8 given" in capsys.readouterr().err


def test_the_losses_are_split_over_the_rows(cfg):
    from mindvl.cells import build_cells
    from mindvl.parallel.apply import apply_loss_strategy
    from mindvl.train.losses import MultimodalLoss

    loss = MultimodalLoss(build_cells(cfg.model, cfg.preprocess), cfg.train.loss_weights)
    apply_loss_strategy(loss, create_strategy("dp2-mp4"))
    assert loss.contrastive.matmul.attrs["in_strategy"] == ((2, 1), (1, 1))
    assert loss.contrastive.log_softmax.log_softmax.attrs["in_strategy"] == ((2, 1),)
    assert loss.answer_loss.ce.sparse_softmax_cross_entropy.attrs["in_strategy"] == ((2, 1), (2,))
    assert loss.lm_loss.ce.softmax_cross_entropy.attrs["in_strategy"] == ((2, 1), (2, 1))


def test_decoder_strategy_splits_heads_kv_heads_and_the_vocabulary():
    from mindvl.cells.decoder import CausalLM
    from mindvl.config import DecoderConfig
    from mindvl.parallel.apply import apply_decoder_strategy, primitive_strategies

    cfg = DecoderConfig(width=64, layers=2, heads=8, kv_heads=2, mlp_ratio=2.0, vocab_size=96, qk_norm=True,
                        sandwich_norm=True, layer_types=["local", "global"], sliding_window=4)
    lm = CausalLM(cfg, cache_len=8)
    apply_decoder_strategy(lm, dp=2, mp=2, vocab_emb_dp=False)
    strategies = primitive_strategies(lm)
    assert strategies["blocks.0.attn.k_proj.matmul"] == ((2, 1), (2, 1))  # kv heads column-split
    assert strategies["blocks.0.attn.out_proj.matmul"] == ((2, 2), (1, 2))  # row-split, partial sums reduced
    assert strategies["blocks.1.mlp.gate.matmul"] == ((2, 1), (2, 1))
    assert strategies["blocks.1.mlp.fc2.matmul"] == ((2, 2), (1, 2))
    assert strategies["blocks.0.attn.q_norm.rms_norm.square"] == ((2, 1, 2, 1),)  # per head, on the split heads
    assert strategies["blocks.0.attn.core.qk_matmul"] == ((2, 2, 1, 1), (2, 2, 1, 1))
    assert strategies["blocks.1.post_mlp_norm.rms_norm.mul"] == ((2, 1, 1), (2, 1, 1))
    assert strategies["gather"] == ((2, 1), (2, 1)) and strategies["head_matmul"] == ((2, 1), (2, 1))
    # 2 kv heads over 4 ranks: each rank holds the keys and values whole and 1 of each group's 4 query heads
    replicated = CausalLM(cfg, cache_len=8)
    apply_decoder_strategy(replicated, dp=1, mp=4)
    strategies = primitive_strategies(replicated)
    assert strategies["blocks.0.attn.q_proj.matmul"] == ((1, 1), (4, 1))
    assert strategies["blocks.0.attn.k_proj.matmul"] == strategies["blocks.0.attn.v_proj.matmul"] == ((1, 1), (1, 1))
    assert strategies["blocks.0.attn.k_norm.rms_norm.square"] == ((1, 1, 1, 1),)
    assert strategies["blocks.0.attn.q_norm.rms_norm.square"] == ((1, 1, 4, 1),)
    assert strategies["blocks.0.attn.core.qk_matmul"] == ((1, 1, 4, 1), (1, 1, 1, 1))  # query rows, group-major
    with pytest.raises(ConfigError, match=r"kv_heads 2 is not divisible by model_parallel=8, nor is the group of 4"):
        apply_decoder_strategy(CausalLM(cfg, cache_len=8), dp=1, mp=8)


# ----------------------------------------------------------------------------- the generative model

def test_the_shipped_strategies_apply_to_the_generative_model():
    """vlm-tiny under dp2-mp2-pp2: its vision and audio blocks, projectors and decoder carry their splits,
    the decoder's blocks end the pipeline, and the projectors sit on the stage of the decoder block that
    reads their tokens."""
    vlm = load_config("vlm-tiny", ["data.batch_size=16", "train.init_from=''"])
    dumped = dump_strategy(vlm, create_strategy("dp2-mp2-pp2"))
    assert list(dumped["stages"]) == ["vision.0", "vision.1", "audio.0", "audio.1", "fusion.0", "fusion.1"]
    assert dumped["stages"]["fusion.1"] == 1
    primitives = dumped["primitives"]
    assert primitives["decoder.blocks.1.attn.q_proj.matmul"] == [[2, 1], [2, 1]]
    assert primitives["decoder.blocks.1.mlp.fc2.matmul"] == [[2, 2], [1, 2]]
    assert primitives["decoder.head_matmul"] == [[2, 1], [2, 1]]  # the logits over the vocabulary
    assert primitives["image_proj.fc1.matmul"] == [[2, 1], [2, 1]]
    assert primitives["audio_proj.fc2.matmul"] == [[2, 2], [1, 2]]
    assert primitives["vision.encoder.blocks.0.attn.core.qk_matmul"] == [[2, 2, 1, 1], [2, 2, 1, 1]]

    from mindvl.cells import build_cells
    from mindvl.parallel.planner import planning_config

    planned = planning_config(vlm)
    model = build_cells(planned.model, planned.preprocess)
    stages = apply_strategy(model, planned, create_strategy("dp2-mp2-pp2"))
    assert model.image_proj.pipeline_stage == model.audio_proj.pipeline_stage == stages["fusion.0"]
    assert model.decoder.blocks[1].pipeline_stage == 1


def test_the_generative_loss_is_split_over_the_labelled_positions():
    from mindvl.cells import MultimodalLM
    from mindvl.parallel.apply import apply_loss_strategy
    from mindvl.parallel.planner import planning_config
    from mindvl.train.losses import GenerativeLoss

    planned = planning_config(load_config("vlm-tiny", ["train.init_from=''"]))
    loss = GenerativeLoss(MultimodalLM(planned.model, planned.preprocess))
    strategy = create_strategy("dp2-mp4")
    strategy.modules.fusion.data_parallel, strategy.modules.fusion.model_parallel = 4, 2
    apply_loss_strategy(loss, strategy)
    assert loss.loss.ce.sparse_softmax_cross_entropy.attrs["in_strategy"] == ((4, 1), (4,))  # the decoder's dp


def test_a_generative_recipe_refuses_tensor_splits_on_the_cpu_naming_the_plan():
    vlm = load_config("vlm-tiny", ["data.batch_size=16", "train.parallel=dp2-mp2-pp2", "train.init_from=''"])
    with pytest.raises(ConfigError, match=r"model_parallel, pipeline_stage need MindSpore's semi-auto-parallel"):
        prepare_training(vlm, None, 8)
    recompute = load_config("vlm-tiny", ["train.parallel=" + str(_full_recompute_dp2()), "train.init_from=''"])
    prepare_training(recompute, None, 2)
    assert recompute.train.modules.fusion.recompute == [0, 1]  # the decoder's blocks, not model.fusion's
    assert recompute.train.modules.vision.recompute == [0, 1]


def _full_recompute_dp2():
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "dp2-recompute.yaml"
    path.write_text("data_parallel: 2\nrecompute_config: {recompute: true}\n")
    return path
