"""mindvl.parallel.planner against the model built on CPU, and its formulas and search."""
import argparse
import dataclasses
import json

import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config
from mindvl.parallel.planner import (ADAM_STATES, PARAM_BYTES, PUBLISHED_ENCODERS, bubble_fraction,
                                     count_config_parameters, count_config_trainable_parameters, plan, search)
from mindvl.parallel.strategy import (ModuleStrategies, ModuleStrategy, ParallelStrategy, RecomputeConfig,
                                     validate_strategy)

VOCAB = 64
VARIANT = ["model.vision.layer_scale=0.1", "model.text.pre_norm=false", "model.audio.lora_rank=4",
           "model.fusion.head_dim=16", "model.fusion.mlp_ratio=2.5", "model.fusion.layers=3",
           "model.num_answers=7", "preprocess.image_size=48"]


def tiny(*extra):
    return load_config("tiny", [f"model.text.vocab_size={VOCAB}", *extra])


def built(cfg):
    from mindvl.cells import build_cells
    return build_cells(cfg.model, cfg.preprocess)


@pytest.mark.parametrize("extra", [[], VARIANT], ids=["tiny", "variant"])
def test_predicted_parameter_bytes_equal_the_built_models(extra):
    cfg = tiny(*extra)
    model = built(cfg)
    real = sum(p.size * p.itemsize for p in model.get_parameters())
    result = plan(cfg, ParallelStrategy())
    assert result.parameter_bytes == real
    assert count_config_parameters(cfg) * PARAM_BYTES == real


def test_optimizer_state_bytes_equal_adamweightdecays_over_the_trainable_parameters():
    from mindvl.train.optim import create_optimizer, freeze_modules
    cfg = tiny("train.modules.audio.frozen=true")
    model = built(cfg)
    freeze_modules(model, cfg.train)
    optimizer = create_optimizer(model, cfg.train, total_steps=10)
    real = sum(m.size * m.itemsize for m in list(optimizer.moments1) + list(optimizer.moments2))
    result = plan(cfg, ParallelStrategy())
    assert result.optimizer_bytes == real
    assert count_config_trainable_parameters(cfg) * PARAM_BYTES * ADAM_STATES == real
    assert result.gradient_bytes == sum(p.size * p.itemsize for p in model.trainable_params())


def test_data_parallel_all_reduce_volume_is_the_gradient_bytes():
    cfg = tiny()
    result = plan(cfg, ParallelStrategy(data_parallel=8))
    assert result.comm_bytes["dp_grad_allreduce"] == result.gradient_bytes == count_config_parameters(cfg) * PARAM_BYTES
    assert result.comm_bytes["dp_sent"] == pytest.approx(2 * 7 / 8 * result.gradient_bytes)
    assert result.comm_bytes["tp_all_gather"] == result.comm_bytes["pp_send_recv"] == 0


@pytest.mark.parametrize("shard", [-1, 2, 4])
def test_parallel_optimizer_divides_optimizer_bytes_by_the_shard_size(shard):
    cfg = tiny()
    plain = plan(cfg, ParallelStrategy(data_parallel=8))
    sharded = plan(cfg, ParallelStrategy(data_parallel=8, enable_parallel_optimizer=True,
                                         optimizer_weight_shard_size=shard))
    size = 8 if shard == -1 else shard
    assert sharded.optimizer_bytes == pytest.approx(plain.optimizer_bytes / size)
    assert sharded.optimizer_bytes_unsharded == plain.optimizer_bytes
    assert sharded.total_bytes < plain.total_bytes


def test_recompute_lowers_activation_memory_and_costs_time():
    cfg = load_config("fusion-12b")
    base = dict(data_parallel=8, model_parallel=8, pipeline_stage=8, micro_batch_num=64)
    off = plan(cfg, ParallelStrategy(**base), devices=512)
    select = plan(cfg, ParallelStrategy(**base, recompute_config=RecomputeConfig(select_recompute=True)), devices=512)
    full = plan(cfg, ParallelStrategy(**base, recompute_config=RecomputeConfig(recompute=True)), devices=512)
    assert full.activation_bytes < select.activation_bytes < off.activation_bytes
    assert full.activation_bytes_per_micro_batch_no_recompute == off.activation_bytes_per_micro_batch
    assert off.step_time_s < full.step_time_s


def test_tensor_parallel_splits_block_weights_and_adds_collectives():
    cfg = load_config("fusion-12b")
    one = plan(cfg, ParallelStrategy(data_parallel=8), devices=8, validate=False)
    four = plan(cfg, ParallelStrategy(data_parallel=2, model_parallel=4), devices=8)
    assert 0.25 < four.parameter_bytes / one.parameter_bytes < 0.3  # block matmuls / 4, the rest replicated
    assert four.comm_bytes["tp_all_gather"] > 0 and one.comm_bytes["tp_all_gather"] == 0


@pytest.mark.parametrize("stages, micro, expected", [(1, 1, 0.0), (4, 4, 3 / 7), (4, 16, 3 / 19), (8, 64, 7 / 71)])
def test_bubble_is_stages_minus_one_over_micro_batches_plus_stages_minus_one(stages, micro, expected):
    assert bubble_fraction(stages, micro) == pytest.approx(expected)


def test_pipeline_stages_hold_one_in_flight_micro_batch_per_later_stage():
    cfg = load_config("fusion-12b")
    result = plan(cfg, ParallelStrategy(data_parallel=4, model_parallel=2, pipeline_stage=8, micro_batch_num=32),
                  devices=64)
    assert [st["in_flight"] for st in result.stages] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert result.bubble_fraction == pytest.approx(7 / 39)
    assert result.comm_bytes["pp_send_recv"] > 0
    assert result.stage_imbalance < 1.3  # balanced assignment


def test_explicit_unbalanced_ranges_are_slower_than_balanced():
    cfg = load_config("fusion-12b")  # 24 + 24 + 24 + 40 blocks
    balanced = plan(cfg, ParallelStrategy(data_parallel=8, pipeline_stage=2, micro_batch_num=8), devices=16)
    explicit = ParallelStrategy(data_parallel=8, pipeline_stage=2, micro_batch_num=8)
    explicit.pipeline.assignment, explicit.pipeline.layer_ranges = "explicit", [[0, 71], [72, 111]]
    unbalanced = plan(cfg, explicit, devices=16)
    assert unbalanced.stage_imbalance > balanced.stage_imbalance
    assert unbalanced.step_time_s > balanced.step_time_s


def test_search_returns_valid_strategies_under_the_cap_fastest_first():
    cfg = load_config("fusion-12b", ["data.batch_size=128"])
    ranked = search(cfg, 64, memory_cap_gb=40)
    assert ranked
    times = [p.step_time_s for _, p in ranked]
    assert times == sorted(times)
    for strategy, p in ranked:
        validate_strategy(strategy, cfg, 64)
        assert p.total_bytes <= 40e9 and strategy.devices == 64
    assert not search(cfg, 8, memory_cap_gb=1)  # 12B parameters fit on no 8 devices in 1 GB


def test_pretrained_recipe_is_planned_without_its_converted_weights():
    from mindvl.pretrained import dinov2, minilm, whisper
    assert (PUBLISHED_ENCODERS["vision"]["width"], PUBLISHED_ENCODERS["vision"]["layers"]) == (dinov2.WIDTH, dinov2.LAYERS)
    assert (PUBLISHED_ENCODERS["text"]["width"], PUBLISHED_ENCODERS["text"]["layers"]) == (minilm.WIDTH, minilm.LAYERS)
    assert (PUBLISHED_ENCODERS["audio"]["width"], PUBLISHED_ENCODERS["audio"]["layers"]) == (whisper.WIDTH, whisper.LAYERS)
    result = plan(load_config("pretrained-s"), ParallelStrategy(data_parallel=8))
    assert result.trainable_parameter_count < result.parameter_count  # frozen encoders: no gradients, no states
    assert result.gradient_bytes == result.trainable_parameter_count * PARAM_BYTES


def _plan_parser():
    from mindvl.cli.plan import register as add_plan_command
    parser = argparse.ArgumentParser(prog="mindvl")
    add_plan_command(parser.add_subparsers(dest="command"))
    return parser


def test_plan_command_prints_the_plan_as_json(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("data_parallel: 2\nmodel_parallel: 2\npipeline_stage: 2\nmicro_batch_num: 4\n")
    args = _plan_parser().parse_args(["plan", "--config", "tiny", "--strategy", str(path), "--json",
                                      "--device-tflops", "100"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"] == 8 and out["hardware"]["peak_tflops"] == 100
    assert out["bubble_fraction"] == pytest.approx(1 / 5)


def test_plan_search_lists_strategies(capsys):
    args = _plan_parser().parse_args(["plan", "--config", "fusion-12b", "--set", "data.batch_size=64", "--search",
                                      "--devices", "16", "--memory-cap-gb", "64", "--top", "3"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("strategy") and len(lines) == 4


def test_plan_dump_strategy_prints_the_applied_strategy_as_json(capsys):
    if not hasattr(pytest.importorskip("mindvl.parallel.apply"), "dump_strategy"):
        pytest.skip("mindvl.parallel.apply.dump_strategy not written yet")
    args = _plan_parser().parse_args(["plan", "--config", "tiny", "--strategy", "dp2-mp4", "--dump-strategy"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_activation_memory_tracks_a_cpu_measurement():
    """The planner's activation bytes against the growth of peak RSS per sample (benchmarks/
    activation_memory.py: one fresh process per batch size): MindSpore's CPU executor keeps ~4.4x what the
    accelerator accounting predicts (no activation memory reuse), but the ratio is the same for stacks of
    other widths and lengths, so the formula's dependence on the shape is right (stated tolerance 15%)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "activation_memory.py"
    ratios = []
    for shape in (["--width", "256", "--heads", "4", "--layers", "2", "--tokens", "128"],
                  ["--width", "128", "--heads", "4", "--layers", "2", "--tokens", "256"]):
        done = subprocess.run([sys.executable, str(script), "--json", *shape], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        ratios.append(json.loads(done.stdout.strip().splitlines()[-1])["ratio"])
    assert all(3.0 < ratio < 6.0 for ratio in ratios), ratios
    assert max(ratios) / min(ratios) < 1.15, ratios


# ----------------------------------------------------------------------------- decoders

DECODER_LAYOUTS = {  # the options each family sets (mindvl.pretrained.llm writes them on conversion)
    "llama": dict(width=48, layers=2, heads=4, kv_heads=2, mlp_ratio=2.5, vocab_size=97, tie_embeddings=False),
    "qwen2": dict(width=48, layers=2, heads=6, kv_heads=2, mlp_ratio=3.0, vocab_size=97, attention_bias=True),
    "gemma3": dict(width=32, layers=3, heads=2, kv_heads=1, head_dim=24, mlp_ratio=4.0, vocab_size=97,
                   qk_norm=True, sandwich_norm=True, activation="gelu_tanh"),
    "biased": dict(width=32, layers=1, heads=4, mlp_ratio=2.0, vocab_size=50, norm="layer", output_bias=True,
                   mlp_bias=True, gated_mlp=False, activation="gelu", lora_rank=3),
}


@pytest.mark.parametrize("family", DECODER_LAYOUTS)
def test_decoder_parameters_equal_the_built_causal_lm(family):
    from mindvl.cells.decoder import CausalLM
    from mindvl.cells.factory import count_cell_parameters
    from mindvl.config import DecoderConfig
    from mindvl.parallel.planner import decoder_parameters, decoder_stack

    dec = DecoderConfig(**DECODER_LAYOUTS[family])
    lm = CausalLM(dec)
    assert decoder_parameters(dec) == count_cell_parameters(lm)
    lora = sum(p.size for p in lm.get_parameters() if "lora" in p.name)
    assert dec.layers * decoder_stack(dec, 1).block_params()[2] == lora


def test_published_decoder_sizes():
    """Llama-3-8B (the llm-8b recipe's decoder) and Qwen2.5-7B dimensions give their published counts."""
    from mindvl.config import DecoderConfig
    from mindvl.parallel.planner import decoder_parameters
    assert decoder_parameters(load_config("llm-8b").model.decoder) == 8_030_261_248
    qwen = DecoderConfig(width=3584, layers=28, heads=28, kv_heads=4, mlp_ratio=18944 / 3584, vocab_size=152064,
                         attention_bias=True, tie_embeddings=False)
    assert decoder_parameters(qwen) == 7_615_616_512


def test_a_decoder_recipe_is_planned_without_a_text_encoder():
    from mindvl.parallel.strategy import pipeline_blocks
    cfg = load_config("llm-8b")
    blocks = pipeline_blocks(cfg.model)
    assert not any(b.startswith("text.") for b in blocks) and blocks[-1] == "fusion.31" and len(blocks) == 80
    result = plan(cfg, ParallelStrategy(data_parallel=4, model_parallel=8, pipeline_stage=8, micro_batch_num=32),
                  devices=256)
    assert result.parameter_count == count_config_parameters(cfg) > 8_030_261_248  # + encoders, projectors
    assert result.stages[-1]["last_block"] == "fusion.31"
    lora = plan(load_config("llm-8b", ["train.modules.fusion.frozen=true", "model.decoder.lora_rank=16"]),
                ParallelStrategy(data_parallel=4, model_parallel=8, pipeline_stage=8, micro_batch_num=32),
                devices=256)
    assert lora.optimizer_bytes < result.optimizer_bytes and lora.parameter_count > result.parameter_count


def test_decoder_strategies_are_checked_against_its_kv_heads():
    cfg = load_config("llm-8b")
    with pytest.raises(ConfigError, match=r"model.decoder kv_heads 8 is not divisible by model_parallel=16"):
        validate_strategy(ParallelStrategy(data_parallel=1, model_parallel=16), cfg, 16)


def test_plan_search_finds_strategies_for_the_8b_decoder(capsys):
    args = _plan_parser().parse_args(["plan", "--config", "llm-8b", "--set", "data.batch_size=16", "--search",
                                      "--devices", "8", "--top", "2"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and float(lines[1].split()[1]) <= 64


# ----------------------------------------------------------------------------- the generative model

def vlm_tiny(*extra):
    """vlm-tiny planned without data: the decoder over a VOCAB-word tokenizer."""
    return load_config("vlm-tiny", [f"model.text.vocab_size={VOCAB}", f"model.decoder.vocab_size={VOCAB}",
                                    "train.init_from=''", *extra])


@pytest.mark.parametrize("extra", [[], ["model.decoder.lora_rank=4", "train.modules.fusion.frozen=true",
                                        "train.modules.audio.frozen=true"]], ids=["recipe", "frozen-decoder-lora"])
def test_a_generative_recipe_plans_the_parameters_and_gradients_of_the_built_model(extra):
    """Encoders, projectors and decoder as build_cells makes them, frozen as the trainer freezes them (the
    recipe freezes vision; the projectors train with train.modules.heads)."""
    from mindvl.cells import build_cells
    from mindvl.parallel.planner import planning_config
    from mindvl.train.optim import freeze_modules

    cfg = vlm_tiny(*extra)
    planned = planning_config(cfg)
    model = build_cells(planned.model, planned.preprocess)
    freeze_modules(model, cfg.train)
    assert count_config_parameters(cfg) == sum(p.size for p in model.get_parameters())
    assert count_config_trainable_parameters(cfg) == sum(p.size for p in model.trainable_params())
    result = plan(cfg, ParallelStrategy())
    assert result.gradient_bytes == sum(p.size * p.itemsize for p in model.trainable_params())
    assert result.parameter_bytes == sum(p.size * p.itemsize for p in model.get_parameters())


def test_a_frozen_decoder_behind_trained_projectors_keeps_activations_for_their_gradients():
    """vlm-s-align trains only the projectors, which sit before Gemma 3's 18 frozen blocks: their gradients
    cross every block, so the blocks keep activations and run a backward pass (2x forward, not 1x)."""
    from mindvl.parallel.planner import block_costs, model_shapes, planning_config

    cfg = planning_config(load_config("vlm-s-align", ["model.pretrained.decoder=absent/gemma3"]))
    shapes = model_shapes(cfg)
    decoder = shapes["fusion"]
    assert decoder.trainable_params == decoder.separate_params > 0 and decoder.needs_backward
    costs = block_costs(shapes)
    assert costs[-2] == pytest.approx(2 * decoder.stack.block_forward_flops())  # a middle decoder block
    result = plan(cfg, ParallelStrategy())
    assert result.activation_bytes > 0
    assert result.trainable_parameter_count == decoder.separate_params  # the encoders and the decoder are frozen
    frozen_projectors = plan(load_config("vlm-s-align", ["model.pretrained.decoder=absent/gemma3",
                                                         "train.modules.heads.frozen=true"]), ParallelStrategy())
    assert frozen_projectors.trainable_parameter_count == 0 and frozen_projectors.activation_bytes == 0


def test_the_published_decoder_is_the_one_convert_llm_writes(gemma3_folder):
    """A recipe whose converted Gemma 3 270M is absent is planned with the shape its folder would have."""
    from mindvl.parallel.planner import decoder_parameters, planning_config

    present = planning_config(load_config("vlm-s", [f"model.pretrained.decoder={gemma3_folder}"])).model.decoder
    absent = planning_config(load_config("vlm-s", ["model.pretrained.decoder=absent/gemma3"])).model.decoder
    assert absent == present and present.lora_rank == 8  # the recipe's LoRA kept
    without_lora = dataclasses.replace(absent, lora_rank=0)
    assert decoder_parameters(without_lora) == json.loads((gemma3_folder / "config.json").read_text())["parameters"]


def test_gemma3s_single_kv_head_is_replicated_under_tensor_parallelism():
    """Gemma 3 270M has 4 query heads over 1 kv head: under model_parallel 2 or 4 its k and v stay whole on
    every rank and only q, out and the MLP split; 8 does not divide its query heads and is refused by name."""
    cfg = load_config("vlm-s", ["model.pretrained.decoder=absent/gemma3", "data.batch_size=8"])
    encoders_dp = ModuleStrategies(vision=ModuleStrategy(8, 1), audio=ModuleStrategy(8, 1))  # DINOv2's 6 heads
    one = plan(cfg, ParallelStrategy(data_parallel=8), devices=8)
    two = plan(cfg, ParallelStrategy(data_parallel=4, model_parallel=2, modules=encoders_dp), devices=8)
    four = plan(cfg, ParallelStrategy(data_parallel=2, model_parallel=4, modules=encoders_dp), devices=8)
    assert four.parameter_bytes < two.parameter_bytes < one.parameter_bytes
    from mindvl.parallel.planner import model_shapes, planning_config
    stack = model_shapes(planning_config(cfg))["fusion"].stack
    split, replicated, _ = stack.block_params(4)
    assert replicated - stack.block_params(1)[1] == 2 * 640 * 256  # k and v, whole
    assert split == stack.block_params(1)[0] - 2 * 640 * 256
    with pytest.raises(ConfigError, match=r"model_parallel: model.decoder heads 4 is not divisible by model_parallel=8"):
        plan(cfg, ParallelStrategy(data_parallel=1, model_parallel=8, modules=encoders_dp), devices=8)


def test_a_generative_recipe_is_planned_per_conversation_of_its_built_data(small_cfg, small_report, tmp_path):
    """With the data set built, a sample is one training conversation as the chat template renders it and the
    LM head runs at its labelled positions only; without it, a whole packed row with every position labelled."""
    from conftest import small_generative_config

    built = plan(small_generative_config(small_cfg.data.root), ParallelStrategy())
    bound = plan(small_generative_config(tmp_path / "not_built"), ParallelStrategy())
    length = load_config("vlm-tiny").data.packing.length
    assert bound.sample_tokens == bound.sample_labels == length
    assert 0 < built.sample_labels < built.sample_tokens < length
    assert built.activation_bytes < bound.activation_bytes and built.step_time_s < bound.step_time_s


def test_a_native_vlm_is_planned_with_the_parameters_of_its_built_tower_and_decoder(tmp_path):
    """The converted tiny Qwen2.5-VL as a recipe (qwen-vl-lora): the planner's count is the folder's; a tower with
    windows computes fewer attention FLOPs than the same tower attending over every patch."""
    from pathlib import Path

    from mindvl.parallel.planner import count_config_parameters, model_shapes, planning_config
    from mindvl.pretrained.vlm import convert_vlm

    folder = convert_vlm(Path(__file__).parents[1] / "references" / "tiny_qwen2_5_vl", tmp_path / "qwen",
                         log=lambda line: None)
    cfg = load_config("qwen-vl-lora", [f"model.pretrained.vlm={folder}", "model.decoder.lora_rank=0"])
    assert count_config_parameters(cfg) == json.loads((folder / "config.json").read_text())["parameters"]
    shapes = model_shapes(planning_config(cfg))
    assert set(shapes) == {"vision", "fusion", "heads"}  # no audio, no text encoder
    tower = shapes["vision"].stack
    assert tower.windowed_layers == 1 and tower.window == 64 and tower.span < tower.tokens
    assert tower.block_forward_flops() < dataclasses.replace(tower, window=0).block_forward_flops()


def test_plan_search_finds_strategies_for_mindvl_8b(capsys):
    """The seed's MindVL-8B (a Qwen2.5-ViT-sized tower before a Qwen3-8B-sized decoder) on 64 devices."""
    from mindvl.cli import main
    from mindvl.parallel.planner import count_config_parameters

    cfg = load_config("mindvl-8b")
    assert 8.8e9 < count_config_parameters(cfg) < 9.0e9  # Qwen3-8B's 8.19B + the tower's 0.68B
    assert main(["plan", "--config", "mindvl-8b", "--search", "--devices", "64", "--memory-cap-gb", "64",
                 "--top", "3"]) == 0
    assert "dp" in capsys.readouterr().out
