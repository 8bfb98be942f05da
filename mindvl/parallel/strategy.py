"""A parallel strategy: one YAML file with mindformers' key names, loaded into typed dataclasses.

    data_parallel: 2            # dp: replicas of each stage
    model_parallel: 4           # mp: tensor-parallel width (Megatron-style splits)
    pipeline_stage: 1           # pp: stages the blocks are cut into
    micro_batch_num: 1          # micro-batches per step (pipeline schedule; gradient accumulation)
    vocab_emb_dp: true          # embedding tables replicated over mp (true) or row-split (false)
    enable_parallel_optimizer: false
    optimizer_weight_shard_size: -1   # -1: optimizer states sharded over all dp ranks
    recompute_config: {recompute: false, select_recompute: false}
    modules:                    # per-module overrides of (dp, mp) within a stage's dp x mp devices
      vision: {data_parallel: 8, model_parallel: 1}
    pipeline: {assignment: balanced}   # or explicit: layer_ranges [[first, last], ...] per stage

Devices = data_parallel x model_parallel x pipeline_stage. `validate_strategy` checks a strategy
against a model config and the global batch; every error names the key and a fix.
"""
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Union

from mindvl.config import MODULES, Config, ModelConfig, build_dataclass, read_yaml
from mindvl.errors import ConfigError

STRATEGY_DIR = Path(__file__).resolve().parent.parent.parent / "parallel_configs"  # a source checkout
PACKAGED_DIR = Path(__file__).resolve().parent.parent / "parallel_configs"  # an installed mindvl (setup.py)
ASSIGNMENTS = ("balanced", "explicit")


@dataclass
class RecomputeConfig:
    recompute: bool = False  # recompute every block's activations in the backward pass
    select_recompute: bool = False  # recompute only attention scores and softmax (the largest activations)


@dataclass
class ModuleStrategy:
    """A module's own split of its stage's devices; 0 inherits the strategy's value."""
    data_parallel: int = 0
    model_parallel: int = 0


@dataclass
class ModuleStrategies:
    vision: ModuleStrategy = field(default_factory=ModuleStrategy)
    text: ModuleStrategy = field(default_factory=ModuleStrategy)
    audio: ModuleStrategy = field(default_factory=ModuleStrategy)
    fusion: ModuleStrategy = field(default_factory=ModuleStrategy)
    heads: ModuleStrategy = field(default_factory=ModuleStrategy)


@dataclass
class PipelineConfig:
    """How blocks (encoders' then fusion's, in that order) are cut into `pipeline_stage` stages."""
    assignment: str = "balanced"  # balanced: by estimated cost; explicit: layer_ranges
    layer_ranges: List[List[int]] = field(default_factory=list)  # per stage [first, last] block index


@dataclass
class ParallelStrategy:
    name: str = ""
    description: str = ""
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1
    micro_batch_num: int = 1
    vocab_emb_dp: bool = True
    enable_parallel_optimizer: bool = False
    optimizer_weight_shard_size: int = -1
    recompute_config: RecomputeConfig = field(default_factory=RecomputeConfig)
    modules: ModuleStrategies = field(default_factory=ModuleStrategies)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    @property
    def devices(self) -> int:
        return self.data_parallel * self.model_parallel * self.pipeline_stage

    def module(self, name: str) -> ModuleStrategy:
        """(dp, mp) of module `name` with the inherited values filled in."""
        own = getattr(self.modules, name)
        return ModuleStrategy(own.data_parallel or self.data_parallel, own.model_parallel or self.model_parallel)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def strategy_names() -> List[str]:
    folder = STRATEGY_DIR if STRATEGY_DIR.is_dir() else PACKAGED_DIR
    return sorted(p.stem for p in folder.glob("*.yaml"))


def strategy_path(name_or_path: Union[str, Path]) -> Path:
    """A strategy file: a path, or the name of one shipped in parallel_configs/."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for folder in (STRATEGY_DIR, PACKAGED_DIR):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise ConfigError(f"strategy {name_or_path}: no such file or shipped strategy; choose a path or one of "
                      f"{strategy_names()}")


def create_strategy(name_or_path: Union[str, Path], cfg: Optional[Config] = None,
                    devices: Optional[int] = None) -> ParallelStrategy:
    """A strategy from its YAML (a shipped name or a path; unknown keys refused with the valid ones), checked
    for its own consistency and, given `cfg` (and `devices`), against that model and device count: the
    factory beside mindvl.model_factory.create_model and mindvl.data.create_dataset."""
    path = strategy_path(name_or_path)
    strategy = build_dataclass(ParallelStrategy, read_yaml(path))
    strategy.name = strategy.name or path.stem
    check_strategy(strategy)
    if cfg is not None:
        validate_strategy(strategy, cfg, devices)
    return strategy


def _at_least(value: int, key: str, low: int, fix: str) -> None:
    if value < low:
        raise ConfigError(f"{key}: expected >= {low}, got {value}; {fix}")


def check_strategy(strategy: ParallelStrategy, devices: Optional[int] = None) -> None:
    """What a strategy must satisfy on its own (and for `devices`, when given)."""
    s = strategy
    for key in ("data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num"):
        _at_least(getattr(s, key), key, 1, "use 1 for no split")
    if devices is not None and s.devices != devices:
        raise ConfigError(f"data_parallel x model_parallel x pipeline_stage = {s.data_parallel} x {s.model_parallel} "
                          f"x {s.pipeline_stage} = {s.devices} devices, not the {devices} given; change one of them "
                          f"or --devices")
    if s.pipeline_stage > 1 and s.micro_batch_num < s.pipeline_stage:
        raise ConfigError(f"micro_batch_num: {s.micro_batch_num} micro-batches cannot fill {s.pipeline_stage} "
                          f"pipeline stages; use at least {s.pipeline_stage} (4x stages keeps the bubble small)")
    if s.optimizer_weight_shard_size != -1:
        if not s.enable_parallel_optimizer:
            raise ConfigError("optimizer_weight_shard_size: set, but enable_parallel_optimizer is false; enable it "
                              "or remove the key")
        if s.optimizer_weight_shard_size < 1 or s.data_parallel % s.optimizer_weight_shard_size:
            raise ConfigError(f"optimizer_weight_shard_size: {s.optimizer_weight_shard_size} does not divide "
                              f"data_parallel={s.data_parallel}; use a divisor of it or -1 (all)")
    stage_devices = s.data_parallel * s.model_parallel
    for name in MODULES:
        own = getattr(s.modules, name)
        for key in ("data_parallel", "model_parallel"):
            _at_least(getattr(own, key), f"modules.{name}.{key}", 0, "use 0 to inherit")
        split = s.module(name)
        if split.data_parallel * split.model_parallel != stage_devices:
            raise ConfigError(f"modules.{name}: data_parallel x model_parallel = {split.data_parallel} x "
                              f"{split.model_parallel} must equal the stage's {stage_devices} devices "
                              f"(data_parallel x model_parallel of the strategy); e.g. data_parallel: "
                              f"{stage_devices // split.model_parallel if stage_devices % split.model_parallel == 0 else stage_devices}")
    if s.pipeline.assignment not in ASSIGNMENTS:
        raise ConfigError(f"pipeline.assignment: {s.pipeline.assignment!r}; choose one of {list(ASSIGNMENTS)}")
    if s.pipeline.assignment == "explicit":
        if len(s.pipeline.layer_ranges) != s.pipeline_stage:
            raise ConfigError(f"pipeline.layer_ranges: {len(s.pipeline.layer_ranges)} ranges for pipeline_stage="
                              f"{s.pipeline_stage}; give one [first, last] per stage")
        expected_first = 0
        for stage, pair in enumerate(s.pipeline.layer_ranges):
            if len(pair) != 2 or pair[0] != expected_first or pair[1] < pair[0]:
                raise ConfigError(f"pipeline.layer_ranges[{stage}]: {pair}; stages take consecutive blocks: "
                                  f"expected [{expected_first}, last >= {expected_first}]")
            expected_first = pair[1] + 1
    elif s.pipeline.layer_ranges:
        raise ConfigError("pipeline.layer_ranges: given with assignment balanced; set assignment: explicit or "
                          "remove the ranges")


# ----------------------------------------------------------------------------- against a model

def kv_split_problem(cfg, mp: int) -> str:
    """Why a decoder's grouped-query attention cannot split over `mp` ranks, or "": the kv heads split over mp,
    or, fewer than that, are replicated while each kv head's group of query heads splits over mp."""
    kv_heads = cfg.kv_heads or cfg.heads
    group = cfg.heads // kv_heads
    if kv_heads % mp == 0 or group % mp == 0:
        return ""
    return (f"kv_heads {kv_heads} is not divisible by model_parallel={mp}, nor is the group of {group} query "
            f"heads per kv head (grouped-query attention splits over kv heads, or replicates them and splits "
            f"each group); use a model_parallel that divides either (or 1)")


def pipeline_blocks(model_cfg: ModelConfig) -> List[str]:
    """The blocks a pipeline cuts, in order: each encoder's layers, then the fusion (or decoder) layers."""
    return [f"{module}.{i}" for module in model_cfg.stacks() for i in range(model_cfg.stack(module).layers)]


def validate_strategy(strategy: ParallelStrategy, cfg: Config, devices: Optional[int] = None) -> None:
    """ConfigError naming the key and a fix when `strategy` cannot train the model of `cfg` with its
    global batch (cfg.data.batch_size) on `devices` (default: the strategy's own count)."""
    check_strategy(strategy, devices)
    s, model = strategy, cfg.model
    for name in model.stacks():
        mp = s.module(name).model_parallel
        encoder = model.stack(name)
        section = "decoder" if encoder is model.decoder else name
        sizes = {"width": encoder.width, "heads": encoder.heads,
                 "FFN width": round(encoder.width * encoder.mlp_ratio)}
        if name in ("text", "fusion") and getattr(encoder, "vocab_size", 0) and not s.vocab_emb_dp:
            sizes["vocab_size"] = encoder.vocab_size
        key = f"modules.{name}.model_parallel" if getattr(s.modules, name).model_parallel else "model_parallel"
        for what, size in sizes.items():
            if size % mp:
                raise ConfigError(f"{key}: model.{section} {what} {size} is not divisible by model_parallel={mp}; "
                                  f"use a divisor of {size} for {name} (modules.{name}.model_parallel) or resize "
                                  f"the model")
        problem = kv_split_problem(encoder, mp) if section == "decoder" else ""
        if problem:
            raise ConfigError(f"{key}: model.decoder {problem}")
    heads_mp = s.module("heads").model_parallel
    if model.embed_dim % heads_mp:
        raise ConfigError(f"model_parallel: model.embed_dim {model.embed_dim} is not divisible by the heads' "
                          f"model_parallel={heads_mp}; set modules.heads.model_parallel to a divisor of it")
    blocks = pipeline_blocks(model)
    if s.pipeline_stage > len(blocks):
        raise ConfigError(f"pipeline_stage: {s.pipeline_stage} stages for {len(blocks)} blocks; use at most "
                          f"{len(blocks)}")
    if s.pipeline.assignment == "explicit" and s.pipeline.layer_ranges[-1][1] != len(blocks) - 1:
        raise ConfigError(f"pipeline.layer_ranges: the last stage ends at block {s.pipeline.layer_ranges[-1][1]}, "
                          f"the model has blocks 0..{len(blocks) - 1} ({', '.join(blocks[:3])}, ...); end at "
                          f"{len(blocks) - 1}")
    batch = cfg.data.batch_size
    per_step = s.data_parallel * s.micro_batch_num
    if batch % per_step:
        lower, upper = batch // per_step * per_step, (batch // per_step + 1) * per_step
        raise ConfigError(f"data.batch_size: the global batch {batch} does not split into data_parallel x "
                          f"micro_batch_num = {per_step} equal parts; use {lower or upper} or {upper}")
