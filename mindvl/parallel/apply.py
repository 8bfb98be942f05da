"""Apply a strategy to the model's cells: `shard()` on their primitives, pipeline stages, recompute.

Megatron-style splits within each module's (dp, mp) (strategy.module(name)):
  attention  q/k/v projections column-split (weight rows over mp), scores, softmax and the weighted sum
             split over heads, the output projection row-split (its partial sums all-reduced);
  MLP        fc1 column-split, the activation on the split hidden width, fc2 row-split;
  norms      batch split only; embeddings replicated over mp (vocab_emb_dp) or row-split over mp;
  heads      their projections column-split.
A generative recipe's MultimodalLM: its vision and audio encoders as above, its projectors as MLPs and
its decoder with the decoder's own splits (apply_decoder_strategy: query and kv heads, gated MLP, LM head
over the vocabulary), both within the fusion module's (dp, mp), whose place the decoder takes.
Every tensor's batch axis is split over dp. On Ascend the semi-auto-parallel compiler turns these into
sliced kernels and collectives; on CPU MindSpore 2.10 cannot compile them ("Invalid backend: CPU"), so
there the strategies are set on the cells and inspected (`dump_strategy`), and only data parallelism
runs (mindvl.train.distributed under msrun).
"""
from typing import Dict, List

from mindspore import nn, ops

from mindvl.cells import MultimodalLM
from mindvl.cells.multimodal_lm import MultimodalLMLoss
from mindvl.config import MODULES, STACKS, Config
from mindvl.errors import ConfigError
from mindvl.parallel.strategy import ParallelStrategy, kv_split_problem, pipeline_blocks, validate_strategy


def _linear(linear: nn.Cell, dp: int, mp: int, split: str) -> None:
    """Linear on (rows, in): `column` splits the output width over mp, `row` the input width (the partial
    products are summed across mp), `replicated` keeps the weight whole on every mp rank; the rows over dp
    in every case."""
    weight = {"column": (mp, 1), "row": (1, mp), "replicated": (1, 1)}[split]
    rows = {"column": (dp, 1), "row": (dp, mp), "replicated": (dp, 1)}[split]
    linear.matmul.shard((rows, weight))
    if linear.has_bias:
        bias = (mp,) if split == "column" else (1,)
        linear.bias_add.shard(((dp, mp if split == "column" else 1), bias))


def _activation(cell: nn.Cell, dp: int, mp: int) -> None:
    """The MLP's bias + activation on (batch, seq, hidden) with hidden split over mp."""
    cell.add.shard(((dp, 1, mp), (mp,)))
    cell = cell.act
    split = ((dp, 1, mp),)
    for name in ("erf", "gelu", "relu"):
        if hasattr(cell, name):
            getattr(cell, name).shard(split)
    if hasattr(cell, "erf"):  # exact GELU: x * 0.5 * (1 + erf(x / sqrt 2))
        cell.mul.shard(((dp, 1, mp), ()))
        cell.add.shard(((dp, 1, mp), ()))


def _attention(attn: nn.Cell, dp: int, mp: int) -> None:
    for projection in (attn.q_proj, attn.k_proj, attn.v_proj):
        _linear(projection, dp, mp, "column")
    _linear(attn.out_proj, dp, mp, "row")
    _core(attn.core, dp, mp)


def _core(core: nn.Cell, dp: int, mp: int, replicated_kv: bool = False) -> None:
    """An AttentionCore split over (batch, heads): its products and softmax on (batch, heads, rows, head_dim)
    (with grouped queries the heads axis is the kv heads', each holding its group's query rows, group-major).
    `replicated_kv` (fewer kv heads than mp): the query rows split instead, whole query heads per rank
    (mp divides the group), against keys and values every rank holds whole."""
    if replicated_kv:
        rows, whole = (dp, 1, mp, 1), (dp, 1, 1, 1)
        core.qk_matmul.shard((rows, whole))
        core.av_matmul.shard((rows, whole))
        core.softmax.mul.shard((rows, ()))
        core.softmax.add.shard((rows, rows))
        core.softmax.softmax.shard((rows,))
        return
    heads = (dp, mp, 1, 1)
    core.qk_matmul.shard((heads, heads))
    core.av_matmul.shard((heads, heads))
    core.softmax.mul.shard((heads, ()))
    core.softmax.add.shard((heads, (dp, 1, 1, 1)))
    core.softmax.softmax.shard((heads,))


def _norm(norm: nn.Cell, dp: int) -> None:
    if hasattr(norm, "layer_norm"):
        norm.layer_norm.shard(((dp, 1, 1), (1,), (1,)))


def _block(block: nn.Cell, dp: int, mp: int) -> None:
    _attention(block.attn, dp, mp)
    _linear(block.mlp.fc1, dp, mp, "column")
    _activation(block.mlp.act, dp, mp)
    _linear(block.mlp.fc2, dp, mp, "row")
    _norm(block.norm1, dp)
    _norm(block.norm2, dp)
    block.add.shard(((dp, 1, 1), (dp, 1, 1)))


def _embedding(embedding: nn.Cell, dp: int, mp: int, vocab_emb_dp: bool) -> None:
    table = (1, 1) if vocab_emb_dp else (mp, 1)
    embedding.gather.shard((table, (dp, 1)))


def _rms_norm(norm: nn.Cell, split: tuple) -> None:
    """An RMSNorm on inputs split as `split` (the last axis, which it reduces, whole)."""
    reduced, arithmetic = split[:-1] + (1,), norm.rms_norm
    arithmetic.square.shard((split,))
    arithmetic.mean.shard((split,))
    arithmetic.add.shard((reduced, ()))
    arithmetic.rsqrt.shard((reduced,))
    arithmetic.mul.shard((split, reduced))


def _decoder_norm(norm: nn.Cell, split: tuple) -> None:
    if hasattr(norm, "layer_norm"):
        norm.layer_norm.shard((split, (1,), (1,)))
    else:
        _rms_norm(norm, split)


def _decoder_block(block: nn.Cell, dp: int, mp: int) -> None:
    """A decoder block (cells.decoder.decoder_block): Megatron splits over the query heads and the kv heads
    (validate_decoder_split checks both divide), the per-head norms and the rotation on the head-split
    (batch, seq, heads, head_dim) layout, the gated MLP's gate and up column-split, its product and the
    activation on the split hidden width, down row-split. With fewer kv heads than mp (Gemma 3 270M has one)
    the kv heads are replicated, as Megatron-LM and vLLM do: k and v projected whole on every rank, the
    query heads still split; the rotation, shared by q and k, then runs on whole heads."""
    attn = block.attn
    replicated_kv = attn.kv_heads % mp != 0
    _linear(attn.q_proj, dp, mp, "column")
    for projection in (attn.k_proj, attn.v_proj):
        _linear(projection, dp, mp, "replicated" if replicated_kv else "column")
    _linear(attn.out_proj, dp, mp, "row")
    per_head = (dp, 1, mp, 1)  # (batch, seq, heads, head_dim)
    per_kv_head = (dp, 1, 1, 1) if replicated_kv else per_head
    if attn.qk_norm:
        _rms_norm(attn.q_norm, per_head)
        _rms_norm(attn.k_norm, per_kv_head)
    rotate = attn.rotate
    rotate.split.shard((per_kv_head,))
    rotate.neg.shard((per_kv_head,))
    rotate.concat.shard((per_kv_head, per_kv_head))
    rotate.mul.shard((per_kv_head, (dp, 1, 1, 1)))
    rotate.add.shard((per_kv_head, per_kv_head))
    _core(attn.core, dp, mp, replicated_kv)
    mlp = block.mlp
    for projection in (mlp.gate, mlp.fc1):
        _linear(projection, dp, mp, "column")
    _linear(mlp.fc2, dp, mp, "row")
    hidden = (dp, 1, mp)
    mlp.mul.shard((hidden, hidden))
    for primitive in vars(mlp.act).values():
        if isinstance(primitive, ops.Primitive):
            primitive.shard((hidden,) * (2 if isinstance(primitive, ops.Mul) else 1))
    for name in ("norm1", "norm2", "post_attn_norm", "post_mlp_norm"):
        if hasattr(block, name):
            _decoder_norm(getattr(block, name), (dp, 1, 1))
    block.add.shard(((dp, 1, 1), (dp, 1, 1)))


def validate_decoder_split(cfg, mp: int, vocab_emb_dp: bool = True) -> None:
    """A DecoderConfig's sizes against a model-parallel split of `mp`; the error names the setting."""
    checks = [("heads", cfg.heads), ("FFN width", int(round(cfg.width * cfg.mlp_ratio)))]
    if not vocab_emb_dp:
        checks.append(("vocab_size", cfg.vocab_size))
    for name, size in checks:
        if size % mp:
            raise ConfigError(f"decoder {name} {size} is not divisible by model_parallel={mp}")
    problem = kv_split_problem(cfg, mp)
    if problem:
        raise ConfigError(f"decoder {problem}")


def apply_decoder_strategy(lm: nn.Cell, dp: int, mp: int, vocab_emb_dp: bool = True) -> None:
    """Shards on a CausalLM (cells/decoder.py) for (dp, mp): every block (_decoder_block), the final norm, the
    token embedding replicated over mp (vocab_emb_dp) or row-split over the vocabulary, and the LM head
    column-split over the vocabulary (each mp rank computes its slice of the logits)."""
    validate_decoder_split(lm.cfg, mp, vocab_emb_dp)
    for block in lm.blocks:
        _decoder_block(block, dp, mp)
    _decoder_norm(lm.norm, (dp, 1, 1))
    lm.gather.shard(((1, 1) if vocab_emb_dp else (mp, 1), (dp, 1)))
    lm.head_matmul.shard(((dp, 1), (mp, 1)))


def encoder_blocks(model: nn.Cell) -> Dict[str, nn.Cell]:
    """{"vision.0": block, ...} in pipeline order (strategy.pipeline_blocks): a generative model's decoder
    blocks stand as "fusion.N", after its vision and audio encoders'."""
    blocks = {}
    generative = isinstance(model, MultimodalLM)
    for module in STACKS:
        if generative and module == "text":
            continue
        stack = model.decoder.blocks if generative and module == "fusion" else getattr(model, module).encoder.blocks
        for index, block in enumerate(stack):
            blocks[f"{module}.{index}"] = block
    return blocks


def stage_of_blocks(cfg: Config, strategy: ParallelStrategy) -> List[int]:
    """The pipeline stage of each block (pipeline_blocks order): the explicit layer_ranges, or the
    planner's balanced partition of the blocks' training FLOPs (the slowest stage as fast as it can be)."""
    from mindvl.parallel.planner import block_costs, model_shapes, planning_config, stage_ranges

    costs = block_costs(model_shapes(planning_config(cfg)), strategy.recompute_config)
    return [stage for stage, (first, last) in enumerate(stage_ranges(strategy, costs)) for _ in range(first, last + 1)]


def _projector(projector: nn.Cell, dp: int, mp: int) -> None:
    """A generative model's projector (Linear, GELU, Linear) as a Megatron MLP: fc1 column-split, the GELU's
    erf on the split hidden width, fc2 row-split. The GELU's Mul and Add take a scalar at one call and a
    tensor at another, which one strategy cannot describe: they keep the compiler's default."""
    _linear(projector.fc1, dp, mp, "column")
    _linear(projector.fc2, dp, mp, "row")
    if hasattr(projector.act, "erf"):
        projector.act.erf.shard(((dp, 1, mp),))


def apply_strategy(model: nn.Cell, cfg: Config, strategy: ParallelStrategy) -> Dict[str, int]:
    """Set the strategy's shards, pipeline stages and recompute on `model` (a MultimodalModel, or a
    generative recipe's MultimodalLM) -> {block: stage}. Only cell attributes change; the graph is compiled
    later (on Ascend)."""
    if isinstance(model, MultimodalLM):
        _generative_shards(model, strategy)
    else:
        _classifier_shards(model, strategy)
    stages = dict(zip(pipeline_blocks(cfg.model), stage_of_blocks(cfg, strategy)))
    if isinstance(model, MultimodalLM) and strategy.pipeline_stage > 1:
        for projector in (model.image_proj, model.audio_proj):  # with the decoder block that reads their tokens
            projector.pipeline_stage = stages["fusion.0"]
    for name, block in encoder_blocks(model).items():
        if strategy.pipeline_stage > 1:
            block.pipeline_stage = stages[name]
        if strategy.recompute_config.recompute:
            block.recompute()
        elif strategy.recompute_config.select_recompute:
            block.attn.core.qk_matmul.recompute()
            block.attn.core.softmax.softmax.recompute()
    return stages


def _classifier_shards(model: nn.Cell, strategy: ParallelStrategy) -> None:
    """A MultimodalModel: every encoder's and the fusion Transformer's blocks within their module's split,
    the text and fusion embeddings, the heads' projections column-split."""
    for module in STACKS:
        split = strategy.module(module)
        for block in getattr(model, module).encoder.blocks:
            _block(block, split.data_parallel, split.model_parallel)
    text, fusion = strategy.module("text"), strategy.module("fusion")
    for embedding in (model.text.word_embeddings, model.text.position_embeddings, model.text.token_type_embeddings):
        _embedding(embedding, text.data_parallel, text.model_parallel, strategy.vocab_emb_dp)
    for embedding in (model.fusion.answer_embeddings, model.fusion.answer_positions, model.fusion.type_embeddings):
        _embedding(embedding, fusion.data_parallel, fusion.model_parallel, strategy.vocab_emb_dp)
    heads = strategy.module("heads")
    for head in (model.image_proj, model.text_proj, model.audio_proj, model.answer_head, model.lm_head):
        _linear(head.fc, heads.data_parallel, heads.model_parallel, "column")


def _generative_shards(model: nn.Cell, strategy: ParallelStrategy) -> None:
    """A MultimodalLM: the vision and audio encoders' blocks within their modules' splits (data-parallel in the
    shipped strategies), the projectors and the decoder within the fusion module's (the decoder takes its
    place, as the planner plans it): the decoder's Megatron splits (apply_decoder_strategy)."""
    for module in ("vision", "audio"):
        split = strategy.module(module)
        for block in getattr(model, module).encoder.blocks:
            _block(block, split.data_parallel, split.model_parallel)
    fusion = strategy.module("fusion")
    for projector in (model.image_proj, model.audio_proj):
        _projector(projector, fusion.data_parallel, fusion.model_parallel)
    apply_decoder_strategy(model.decoder, fusion.data_parallel, fusion.model_parallel, strategy.vocab_emb_dp)


def _cross_entropy(ce: nn.Cell, dp: int) -> None:
    """A SoftmaxCrossEntropyWithLogits over (rows, classes) split over the rows."""
    ce.sparse_softmax_cross_entropy.shard(((dp, 1), (dp,)))
    ce.one_hot.shard(((dp, 1), (), ()))
    ce.softmax_cross_entropy.shard(((dp, 1), (dp, 1)))


def apply_loss_strategy(loss: nn.Cell, strategy: ParallelStrategy) -> None:
    """The objectives of a MultimodalLoss split over the heads' dp rows: the contrastive logits with one
    side's embeddings whole (every row's negatives are the global batch, as GatherWithGrad gives them under
    data parallelism), log-softmax and the cross-entropies row-wise. Classes are not split: the answer set
    is small, and a vocabulary-parallel cross-entropy for the LM head is not built (vocab_emb_dp false
    still splits only its embedding table). A generative model's loss (GenerativeLoss) is one cross-entropy
    over the labelled positions' logits from the decoder's head, split over those rows with the decoder's
    (fusion's) dp (the head's vocabulary split is gathered for it)."""
    if isinstance(getattr(loss, "loss", None), MultimodalLMLoss):  # GenerativeLoss: the decoder's logits
        _cross_entropy(loss.loss.ce, strategy.module("fusion").data_parallel)
        return
    dp = strategy.module("heads").data_parallel
    loss.contrastive.matmul.shard(((dp, 1), (1, 1)))
    loss.contrastive.log_softmax.log_softmax.shard(((dp, 1),))
    for ce in (loss.answer_loss.ce, loss.lm_loss.ce):
        _cross_entropy(ce, dp)


def context_settings(strategy: ParallelStrategy) -> dict:
    """The `mindspore.set_auto_parallel_context` arguments for this strategy on Ascend."""
    settings = {"parallel_mode": "semi_auto_parallel", "device_num": strategy.devices,
                "pipeline_stages": strategy.pipeline_stage, "gradients_mean": True,
                "enable_parallel_optimizer": strategy.enable_parallel_optimizer,
                "dataset_strategy": "data_parallel"}
    if strategy.enable_parallel_optimizer and strategy.optimizer_weight_shard_size > 0:
        settings["parallel_optimizer_config"] = {"optimizer_weight_shard_size": strategy.optimizer_weight_shard_size}
    return settings


def primitive_strategies(model: nn.Cell) -> Dict[str, tuple]:
    """{cell path.attribute: in_strategy} of every sharded primitive of `model`."""
    return {f"{path}.{attribute}" if path else attribute: value.attrs["in_strategy"]
            for path, cell in model.cells_and_names() for attribute, value in vars(cell).items()
            if isinstance(value, ops.Primitive) and "in_strategy" in value.attrs}


def dump_strategy(cfg: Config, strategy: ParallelStrategy) -> Dict[str, object]:
    """Build the model of `cfg` (shapes only) on this machine, apply `strategy` -> {"context": set_auto_parallel_context
    arguments, "stages": {block: stage}, "primitives": {cell path.attribute: in_strategy}} (what the
    Ascend compiler would receive)."""
    from mindvl.cells import build_cells
    from mindvl.parallel.planner import planning_config

    cfg = planning_config(cfg)  # every shape known (vocabulary, converted encoders, decoder) without data or weights
    validate_strategy(strategy, cfg)
    model = build_cells(cfg.model, cfg.preprocess)  # random weights: a strategy needs shapes, not values
    stages = apply_strategy(model, cfg, strategy)
    primitives = {name: [list(part) for part in split] for name, split in primitive_strategies(model).items()}
    return {"strategy": strategy.name, "devices": strategy.devices, "context": context_settings(strategy),
            "stages": stages if strategy.pipeline_stage > 1 else {}, "primitives": primitives}


def prepare_training(cfg: Config, model: nn.Cell, world: int) -> ParallelStrategy:
    """Bring `cfg.train.parallel`'s strategy into a training run of `world` ranks: validated against the
    model and the rank count; micro_batch_num becomes train.grad_accumulation and recompute every block's
    train.modules.<m>.recompute (in place, before the trainer reads them). On Ascend the semi-auto
    context and the shards are set too; elsewhere only data parallelism can run, and a strategy that
    splits tensors or stages is refused with the reason."""
    import mindspore as ms

    from mindvl.parallel.strategy import create_strategy

    strategy = create_strategy(cfg.train.parallel, cfg, devices=world)
    ascend = ms.get_context("device_target") == "Ascend"
    splits = [f"modules.{m}.model_parallel" for m in MODULES
              if strategy.module(m).model_parallel > 1 and getattr(strategy.modules, m).model_parallel]
    if strategy.model_parallel > 1:
        splits.insert(0, "model_parallel")
    if strategy.pipeline_stage > 1:
        splits.append("pipeline_stage")
    if splits and not ascend:
        raise ConfigError(f"train.parallel={cfg.train.parallel}: {', '.join(splits)} need MindSpore's "
                          f"semi-auto-parallel compiler, which runs on Ascend only (MindSpore 2.10 on "
                          f"{ms.get_context('device_target')}: 'Invalid backend'); here run a data-parallel strategy "
                          f"(dp2) and plan this one with `mindvl plan --strategy {strategy.name}`")
    if strategy.micro_batch_num > 1:
        if cfg.train.grad_accumulation not in (1, strategy.micro_batch_num):
            raise ConfigError(f"train.grad_accumulation: {cfg.train.grad_accumulation}, but the strategy's "
                              f"micro_batch_num is {strategy.micro_batch_num}; remove one of them")
        cfg.train.grad_accumulation = strategy.micro_batch_num
    if strategy.recompute_config.recompute:
        for module in cfg.model.stacks():
            getattr(cfg.train.modules, module).recompute = list(range(cfg.model.stack(module).layers))
    if ascend and world > 1:
        ms.set_auto_parallel_context(**context_settings(strategy))
        apply_strategy(model, cfg, strategy)
    return strategy
