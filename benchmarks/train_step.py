"""Train-step speed of mindvl against PyTorch on this CPU (issue 10), with the GEMM peak and a per-op table
measured in the same run.

    python benchmarks/train_step.py [--models reference,tiny] [--steps 20] [--threads N] [--skip-compile]
                                    [--skip-ops] [--json PATH]

Models:
  reference       a 4-layer pre-LN Transformer (width 256, 4 heads, FFN 1024, exact erf GELU), mean squared
                  error against a fixed random target at batch 16 x 128 tokens, AdamW (lr 1e-4, weight decay
                  0.01): mindvl's TransformerStack in one graph-mode cell (value_and_grad over the optimizer's
                  parameters, then the update: TrainStep without loss scaling or clipping) against the same
                  architecture in plain PyTorch (q/k/v/out Linear, matmul-softmax-matmul attention).
                  `reference-mask` (not run by default) adds a padding mask hiding a quarter of the keys of
                  every other sample.
  tiny            the tiny recipe's model, objectives and TrainStep (per-module gradient norms, clipping at
                  1.0, the warmup-cosine schedule), built as the Trainer builds them, on a synthetic batch of 64
                  with easy-VQA's lengths packed by the recipe's Packer; the PyTorch side mirrors model,
                  objectives and step (what differs: the notes under the tables).
Implementations: mindvl with use_kernels(model, "auto") (the default, train.kernels: each fused kernel kept where
it times faster than the standard operator at the model's shapes; decided at the first run on a machine and
cached, `mindvl kernels` shows the decisions), "fused" and "standard"; PyTorch eager; torch.compile of the loss
net (model + objectives; the optimizer stays eager), default mode.

The machine line names the CPU, its ISA flags, the kernels' -march and the threads. To time the code an
AVX2-only machine runs on an AVX-512 host, narrow every library to AVX2 (mindvl's kernels, MindSpore's and
PyTorch's oneDNN, PyTorch's own kernels, MKL, OpenBLAS):
    MINDVL_KERNEL_ARCH=x86-64-v3 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    OPENBLAS_CORETYPE=Haswell python benchmarks/train_step.py
(MindSpore's own CPU kernels pick their ISA at run time and cannot be narrowed: that side stays AVX-512.)

Each (model, implementation) runs in a fresh process (this file with --worker), every framework on --threads
threads (MindSpore's CPU kernels, the fused kernels' pool, PyTorch, numpy's BLAS). A step row times the
first step (compile) alone, 2 more warm-up steps, then --steps steps, each synchronised on its loss; the loss
after them is a sanity figure (fused and standard start from the same weights and should agree closely;
PyTorch starts from its own random weights).

How to read:
  step table    step ms: median (and min) over the timed steps. speed vs PyTorch eager: eager's median / this
                median (the goal for mindvl: >= 1.1x). GFLOP/s: the step's matmul FLOPs (forward matmuls,
                attention's QK^T and PV included; backward counted as 2x forward; analytic for the reference,
                torch's FlopCounterMode over the mirror's forward for tiny) / the median step. % of GEMM peak:
                against MindSpore's best GEMM and the best of any library, both measured here (goal: >= 85%).
                compile s: the first step's wall time (torch.compile reuses its on-disk cache across runs).
  GEMM peak     GFLOP/s of one float32 matmul at the step's main shapes and at 1024^3 per library (MindSpore
                graph-mode MatMul, torch.mm, numpy @): the fastest of 20 calls, the median in brackets
                (MindSpore's calls alternate between about one and about two cores' worth here).
  per-op table  forward and forward+backward ms (median of 20) of the step's pieces at the reference shapes:
                mindvl cells in graph mode with standard operators and after use_kernels "fused" (`fused swaps`:
                how many cells the switch changed; 0 means both columns ran standard operators), against
                PyTorch eager (forward under no_grad; forward+backward with ones as the output's gradient).
                MindSpore's CPU graph calls return when the graph has run, so calls are timed as they return.
Run it on an idle machine: PyTorch's OpenMP threads lose most of their speed when another process takes a
core (its steps ran 3-40x slower here, in multiples of 8 ms), MindSpore's far less. Every row says how many
cores other processes kept busy while it ran (/proc/stat less the worker's own CPU time): above ~0.1, rerun.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

MODELS = ("reference", "reference-mask", "tiny")
IMPLEMENTATIONS = {"mindvl-auto": "mindvl, auto (default)", "mindvl-fused": "mindvl, fused kernels",
                   "mindvl-standard": "mindvl, standard ops",
                   "torch-eager": "PyTorch eager", "torch-compile": "torch.compile"}
GEMM_LIBRARIES = {"mindspore": "MindSpore (graph-mode MatMul)", "torch": "PyTorch (torch.mm)", "numpy": "numpy (@)"}
OP_IMPLEMENTATIONS = ("mindvl-standard", "mindvl-fused", "torch-eager")
OPS = {  # per-op rows: name -> the input it is timed on
    "LayerNorm": "x (16, 128, 256)",
    "GELU": "x (16, 128, 1024)",
    "fc1 + GELU (MLP first half)": "x (16, 128, 256)",
    "MLP (fc1, GELU, fc2)": "x (16, 128, 256)",
    "softmax (scaled, masked)": "scores (16, 4, 128, 128)",
    "attention core": "q = k = v (16, 4, 128, 64)",
    "GEMM (Linear 256->1024)": "x (16, 128, 256)",
    "a graph call (Add)": "x (16, 256)",
}

BATCH, SEQ, WIDTH, LAYERS, HEADS, FFN = 16, 128, 256, 4, 4, 1024  # the reference model; also the per-op shapes
MASK_VALUE = -1e4  # mindvl.cells.masks.MASK_VALUE: the additive mask's "blocked"
TINY_VOCAB = 34  # tiny's word tokenizer on easy-VQA (README); the recipe takes it from the data set
TINY_SCHEDULE_STEPS = 555  # tiny's one epoch: the length of its warmup-cosine schedule
PAD_ID = 0  # the tokenizer's [PAD], which the LM objective skips
WARMUP = 3  # steps (or calls) before timing; the first compiles
REPEATS = 20  # timed calls per GEMM shape and per op
GEMM_SHAPES = ((2048, 256, 1024), (2048, 1024, 256), (1024, 1024, 1024))  # (m, k, n): fc1, fc2, square
# OpenMP, numpy's BLAS, and the fused kernels' own thread pool (cells/kernels/pool.h)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MINDVL_KERNEL_THREADS")
# what narrows each library to an older ISA: with MINDVL_KERNEL_ARCH=x86-64-v3 they make an AVX-512 host run
# the AVX2 code paths of every side (docs/performance.md)
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE")
RESULT = "RESULT "  # starts a worker's JSON line on stdout
WORKER_TIMEOUT_S = 600


# ----------------------------------------------------------------------------- inputs and FLOPs (no framework)

def reference_inputs(masked: bool) -> list:
    """[x, target] (BATCH, SEQ, WIDTH) float32, fixed; `masked` adds an additive mask (BATCH, 1, 1, SEQ)
    hiding the last quarter of the keys of every other sample."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((BATCH, SEQ, WIDTH), dtype=np.float32) for _ in range(2)]
    if masked:
        mask = np.zeros((BATCH, 1, 1, SEQ), np.float32)
        mask[::2, ..., -SEQ // 4:] = MASK_VALUE
        arrays.append(mask)
    return arrays


def reference_flops() -> int:
    """Matmul FLOPs of one reference train step: per layer q/k/v/out (4 * 2·T·W·W), fc1 and fc2 (2 * 2·T·W·F),
    QK^T and PV (2 * 2·B·S·S·W), T = B·S tokens; backward = 2x forward."""
    tokens = BATCH * SEQ
    per_layer = 8 * tokens * WIDTH * WIDTH + 4 * tokens * WIDTH * FFN + 4 * BATCH * SEQ * SEQ * WIDTH
    return 3 * LAYERS * per_layer


def tiny_config(*overrides: str):
    from mindvl.config import load_config

    return load_config("tiny", [f"model.text.vocab_size={TINY_VOCAB}", *overrides])


def tiny_batch(cfg) -> tuple:
    """A synthetic batch of data.batch_size samples with easy-VQA's lengths -> (every input of the training
    loss net by name (mindvl.data.reading.loader.TRAIN_COLUMNS), {stream: (rows, length)} of the packed streams).

    Questions of 6-12 tokens and captions of 4-6 ([CLS] and [SEP] included), clips of 50-104 of the 128
    frames (~60%, what the packer's default buckets assume), the recipe's question-modality mix, answers
    [BOS] word [EOS] [PAD]; packed by the recipe's Packer."""
    from mindvl.data.reading.packing import PACK_COLUMNS, PACK_INPUTS, Packer

    pre, batch, vocab = cfg.preprocess, cfg.data.batch_size, cfg.model.text.vocab_size
    rng = np.random.default_rng(0)

    def prefix_mask(low: int, high: int, width: int) -> np.ndarray:
        return (np.arange(width)[None] < rng.integers(low, high + 1, batch)[:, None]).astype(np.float32)

    def token_ids(mask: np.ndarray) -> np.ndarray:
        return (rng.integers(1, vocab, mask.shape) * mask).astype(np.int32)

    question_mask = prefix_mask(6, 12, pre.max_text_length)
    caption_mask = prefix_mask(4, 6, pre.max_text_length)
    audio_mask = prefix_mask(50, 104, pre.max_audio_frames)
    modality = rng.choice(3, size=batch, p=cfg.data.question_modality_mix)  # text, audio, both
    answer_tokens = np.zeros((batch, pre.max_answer_length), np.int32)
    answer_tokens[:, :3] = rng.integers(1, vocab, (batch, 3))
    columns = {
        "answer": rng.integers(0, cfg.model.num_answers, batch).astype(np.int32),
        "answer_tokens": answer_tokens,
        "question_group": rng.integers(0, 107, batch).astype(np.int32),  # easy-VQA's 107 questions,
        "caption_group": rng.integers(0, 24, batch).astype(np.int32),  # 24 captions
        "image": rng.standard_normal((batch, 3, pre.image_size, pre.image_size), dtype=np.float32),
        "question_ids": token_ids(question_mask), "question_mask": question_mask,
        "caption_ids": token_ids(caption_mask), "caption_mask": caption_mask,
        "audio_mel": rng.standard_normal((batch, pre.n_mels, pre.max_audio_frames), dtype=np.float32)
        * audio_mask[:, None],
        "audio_mask": audio_mask,
        "use_text": (modality != 1).astype(np.float32), "use_audio": (modality != 0).astype(np.float32),
    }
    packed = Packer.from_config(cfg)(*(columns[name] for name in PACK_INPUTS))
    streams = dict(zip(("text", "audio", "fusion"), packed.shapes, strict=True))
    return {**columns, **dict(zip(PACK_COLUMNS, packed.arrays, strict=True))}, streams


# ----------------------------------------------------------------------------- timing

def time_steps(step, steps: int) -> dict:
    """`step()` runs one synchronised train step and returns its loss: the first timed alone (compile), then
    WARMUP - 1 more, then `steps` timed ones."""
    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start
    for _ in range(WARMUP - 1):
        step()
    times, loss = [], float("nan")
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "step_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "final_loss": loss}


def call_seconds(call) -> list:
    """Seconds of each of REPEATS calls of `call`, after WARMUP untimed ones (the first compiles)."""
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def median_ms(call) -> float:
    return statistics.median(call_seconds(call)) * 1e3


# ----------------------------------------------------------------------------- MindSpore workers

def mindspore_context(threads: int) -> None:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(threads)
    ms.set_seed(0)


def mindvl_reference_step(kind: str, masked: bool) -> tuple:
    """(step function, parameter shapes by name, cells use_kernels swapped) for the reference model."""
    from mindspore import Tensor, nn, ops

    from mindvl.cells.kernels import use_kernels
    from mindvl.cells.transformer import TransformerStack
    from mindvl.config import EncoderConfig

    class RegressionLoss(nn.Cell):
        def __init__(self, stack):
            super().__init__()
            self.stack = stack

        def construct(self, x, target, mask=None):
            return ops.mean(ops.square(self.stack(x, mask) - target))

    class ReferenceStep(nn.Cell):
        """mindvl.train.step.TrainStep without loss scaling, accumulation, norms or clipping."""

        def __init__(self, loss_net, optimizer):
            super().__init__()
            self.optimizer = optimizer
            self.grad_fn = ops.value_and_grad(loss_net, None, optimizer.parameters)

        def construct(self, *inputs):
            loss, grads = self.grad_fn(*inputs)
            return ops.depend(loss, self.optimizer(grads))

    stack = TransformerStack(EncoderConfig(width=WIDTH, layers=LAYERS, heads=HEADS, mlp_ratio=FFN / WIDTH))
    shapes = {name: tuple(p.shape) for name, p in stack.parameters_and_names()}
    inputs = [Tensor(array) for array in reference_inputs(masked)]
    swapped = use_kernels(stack, kind, probe=lambda: stack(inputs[0], *inputs[2:]), log=log)
    optimizer = nn.AdamWeightDecay(stack.trainable_params(), learning_rate=1e-4, weight_decay=0.01)
    step = ReferenceStep(RegressionLoss(stack), optimizer)
    step.set_train(True)
    return (lambda: float(step(*inputs).asnumpy())), shapes, swapped


def mindvl_tiny_step(kind: str) -> tuple:
    """The tiny recipe's training as the Trainer wires it (mindvl.train.wiring.build_training: one process,
    float32, fixed loss weights, no accumulation), with train.kernels `kind`, on `tiny_batch`."""
    from mindspore import Tensor

    from mindvl.cells import build_cells
    from mindvl.data.reading.loader import TRAIN_COLUMNS
    from mindvl.runs import parameter_paths
    from mindvl.train.wiring import build_training

    cfg = tiny_config(f"train.kernels={kind}", f"train.max_steps={TINY_SCHEDULE_STEPS}")
    batch, _ = tiny_batch(cfg)
    model = build_cells(cfg.model, cfg.preprocess)
    shapes = {name: tuple(param.shape) for name, param in parameter_paths(model).items()}
    inputs = {name: Tensor(batch[name]) for name in TRAIN_COLUMNS}
    parts = build_training(cfg, model, batch=inputs, log=log)
    parts.train_step.set_train(True)
    return (lambda: float(parts.train_step(True, *inputs.values())[0].asnumpy())), shapes, parts.kernel_swaps


def log(message: str) -> None:
    """use_kernels' line (train.kernels auto: what it chose) on the worker's stderr."""
    print(message, file=sys.stderr, flush=True)


def mindspore_gemm() -> dict:
    from mindspore import Tensor, nn, ops

    class MatMul(nn.Cell):
        def __init__(self):
            super().__init__()
            self.matmul = ops.MatMul()

        def construct(self, a, b):
            return self.matmul(a, b)

    net = MatMul()
    return gemm_rates(lambda a, b: (lambda: net(a, b)), convert=Tensor)


def mindvl_ops(kind: str) -> dict:
    """Per-op rows (`OPS`) of mindvl cells in graph mode after use_kernels(cell, kind)."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindvl.cells.activation import create_activation
    from mindvl.cells.attention import MultiHeadAttention
    from mindvl.cells.kernels import use_kernels
    from mindvl.cells.linear import dense
    from mindvl.cells.norm import LayerNorm
    from mindvl.cells.transformer import MLP

    class Parent(nn.Cell):
        """Holds the measured cell, so that use_kernels can swap the cell itself."""

        def __init__(self, net):
            super().__init__()
            self.net = net

        def construct(self, *inputs):
            return self.net(*inputs)

    class ForwardBackward(nn.Cell):
        """The output and the gradients w.r.t. the first input and the parameters, the output's gradient
        being ones (the output is returned so that the graph cannot drop the forward pass)."""

        def __init__(self, net):
            super().__init__()
            params = net.trainable_params()
            self.grad_fn = ops.value_and_grad(net, 0, ms.ParameterTuple(params) if params else None)

        def construct(self, *inputs):
            return self.grad_fn(*inputs)

    def first_half():
        mlp = MLP(WIDTH, FFN)
        mlp.fc2 = nn.Identity()  # what is left: fc1's GEMM, then bias + GELU
        return mlp

    def scaled_masked_softmax():
        from mindvl.cells.activation import ScaledMaskedSoftmax  # the attention's softmax, a cell of its own

        return ScaledMaskedSoftmax((WIDTH // HEADS) ** -0.5)

    def attention_core():
        """MultiHeadAttention without its projections: x (B, S, W) split into q = k = v (B, H, S, W/H)."""
        attention = MultiHeadAttention(WIDTH, HEADS)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(attention, name, nn.Identity())
        return attention

    def measure(build, arrays) -> dict:
        try:
            cell = Parent(build())
            swapped = use_kernels(cell, kind)
            inputs = [Tensor(array) for array in arrays]
            backward = ForwardBackward(cell)
            return {**time_op(lambda: cell(*inputs), lambda: backward(*inputs)), "swapped": swapped}
        except Exception as error:  # noqa: BLE001  (a row a kernel cannot run must not hide the others)
            return {"error": first_line(error)}

    builders = dict(zip(OPS, (lambda: LayerNorm(WIDTH), lambda: create_activation("gelu"), first_half,
                              lambda: MLP(WIDTH, FFN), scaled_masked_softmax, attention_core,
                              lambda: dense(WIDTH, FFN), ops.Add), strict=True))
    return {name: measure(builders[name], arrays) for name, arrays in op_inputs().items()}


# ----------------------------------------------------------------------------- PyTorch workers

def torch_mirrors() -> SimpleNamespace:
    """PyTorch modules mirroring the mindvl cells the benchmark's models use, under mindvl's parameter names
    (defined here so that MindSpore workers never import torch)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def attention_core(q, k, v, scale: float, mask=None):
        scores = q @ k.transpose(-1, -2) * scale  # (batch, heads, queries, keys)
        if mask is not None:
            scores = scores + mask
        return torch.softmax(scores, -1) @ v

    def split_heads(x, heads: int):
        batch, seq, width = x.shape
        return x.view(batch, seq, heads, width // heads).transpose(1, 2)  # (batch, heads, seq, head_dim)

    class Attention(nn.Module):
        def __init__(self, width: int, heads: int):
            super().__init__()
            self.heads, self.scale = heads, (width // heads) ** -0.5
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(width, width) for _ in range(4))

        def forward(self, x, mask=None):
            q, k, v = (split_heads(proj(x), self.heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
            out = attention_core(q, k, v, self.scale, mask).transpose(1, 2).reshape(x.shape)
            return self.out_proj(out)

    class MLP(nn.Module):
        def __init__(self, width: int, hidden: int):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, width: int, heads: int, hidden: int, eps: float):
            super().__init__()
            self.norm1, self.attn = nn.LayerNorm(width, eps=eps), Attention(width, heads)
            self.norm2, self.mlp = nn.LayerNorm(width, eps=eps), MLP(width, hidden)

        def forward(self, x, mask=None):
            x = x + self.attn(self.norm1(x), mask)
            return x + self.mlp(self.norm2(x))

    class Stack(nn.Module):
        """mindvl's pre-LN TransformerStack: blocks, then a final norm."""

        def __init__(self, width: int, layers: int, heads: int, hidden: int, eps: float = 1e-6):
            super().__init__()
            self.blocks = nn.ModuleList(Block(width, heads, hidden, eps) for _ in range(layers))
            self.norm = nn.LayerNorm(width, eps=eps)

        @classmethod
        def of(cls, cfg):
            """From an EncoderConfig (pre-LN, GELU, no LayerScale, head_dim width // heads: tiny's stacks)."""
            return cls(cfg.width, cfg.layers, cfg.heads, round(cfg.width * cfg.mlp_ratio), cfg.norm_eps)

        def forward(self, x, mask=None):
            for block in self.blocks:
                x = block(x, mask)
            return self.norm(x)

    class RegressionLoss(nn.Module):
        def __init__(self, stack):
            super().__init__()
            self.stack = stack

        def forward(self, x, target, mask=None):
            return F.mse_loss(self.stack(x, mask), target)

    # -- the tiny model's pieces (cells/masks.py, packed.py, pooling.py, vision/text/audio/fusion/heads.py)
    def additive(allowed):
        return ((1.0 - allowed.float()) * MASK_VALUE).unsqueeze(1)  # (batch, 1, queries, keys)

    def same_segment(segment):
        keys, queries = segment.unsqueeze(1), segment.unsqueeze(2)
        return (keys == queries) & (keys > 0)

    def segment_mask(segment):
        return additive(same_segment(segment))

    def packed_prefix_lm_mask(segment, answer_flag):
        index = torch.arange(segment.shape[1])
        causal = index.unsqueeze(0) <= index.unsqueeze(1)  # (S, S): key <= query
        return additive(same_segment(segment) & ((answer_flag.unsqueeze(1) == 0) | causal))

    def gather_tokens(rows, index):
        flat = rows.reshape(-1, rows.shape[-1])
        return torch.cat((flat, flat.new_zeros(1, flat.shape[1])))[index]

    def slot_valid(rows, index):
        return (index < rows.shape[0] * rows.shape[1]).float()

    def masked_mean(tokens, valid):
        weights = valid.unsqueeze(2)
        return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    def learned(*shape):
        return nn.Parameter(torch.randn(*shape) * 0.02)

    class Vision(nn.Module):
        def __init__(self, cfg, image_size: int):
            super().__init__()
            self.patch, self.grid = cfg.patch_size, image_size // cfg.patch_size
            self.patch_embed = nn.Linear(3 * self.patch ** 2, cfg.width)
            self.cls_token = learned(1, 1, cfg.width)
            self.pos_embed = learned(1, 1 + self.grid ** 2, cfg.width)
            self.encoder = Stack.of(cfg)

        def forward(self, image):
            batch, g, p = image.shape[0], self.grid, self.patch
            patches = image.reshape(batch, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(batch, g * g, -1)
            x = torch.cat((self.cls_token.expand(batch, -1, -1), self.patch_embed(patches)), 1) + self.pos_embed
            x = self.encoder(x)
            return x, x[:, 0]

    class Text(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.width)
            self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.width)
            self.token_type_embeddings = nn.Embedding(2, cfg.width)
            self.embed_norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
            self.encoder = Stack.of(cfg)

        def forward(self, ids, positions, segment, index):
            x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
            tokens = gather_tokens(self.encoder(self.embed_norm(x), segment_mask(segment)), index)
            return tokens, tokens[:, 0]  # [CLS] pooling

    class Audio(nn.Module):
        def __init__(self, cfg, n_mels: int, max_frames: int):
            super().__init__()
            self.conv1, self.act1 = nn.Conv1d(n_mels, cfg.width, 3, 1, 1), nn.GELU()
            self.conv2, self.act2 = nn.Conv1d(cfg.width, cfg.width, 3, 2, 1), nn.GELU()
            # mindvl: Whisper's sinusoids, a constant; the values do not change the cost
            self.register_buffer("positions", torch.zeros(max_frames // 2, cfg.width))
            self.encoder = Stack.of(cfg)

        def forward(self, mel, frame_segment, positions, index):
            valid = (frame_segment > 0).float().unsqueeze(1)  # (rows, 1, T)
            x = self.act1(self.conv1(mel * valid)) * valid
            x = self.act2(self.conv2(x)).transpose(1, 2) + self.positions[positions]  # (rows, T/2, width)
            x = self.encoder(x, segment_mask(frame_segment[:, ::2]))
            tokens = gather_tokens(x, index)
            return tokens, masked_mean(tokens, slot_valid(x, index))

    class Fusion(nn.Module):
        def __init__(self, cfg, in_width: int, vocab: int, max_answer_length: int):
            super().__init__()
            self.width = cfg.width
            self.image_in_proj, self.text_in_proj, self.audio_in_proj = (nn.Linear(in_width, cfg.width)
                                                                         for _ in range(3))
            self.type_embeddings = nn.Embedding(4, cfg.width)
            self.cls_token = learned(1, 1, cfg.width)
            self.answer_embeddings = nn.Embedding(vocab, cfg.width)
            self.answer_positions = nn.Embedding(max_answer_length, cfg.width)
            self.encoder = Stack.of(cfg)

        def forward(self, image_tokens, text_tokens, audio_tokens, answer_in, pack_index, pack_segment, pack_answer,
                    cls_index, answer_index):
            types, batch = self.type_embeddings.weight, image_tokens.shape[0]
            answer = self.answer_embeddings(answer_in) + self.answer_positions.weight[:answer_in.shape[1]] + types[3]
            table = torch.cat((self.cls_token.expand(batch, -1, -1), self.image_in_proj(image_tokens) + types[0],
                               self.text_in_proj(text_tokens) + types[1], self.audio_in_proj(audio_tokens) + types[2],
                               answer), 1)  # (B, P, width)
            x = table.reshape(-1, self.width)[pack_index]  # (rows, S, width)
            x = self.encoder(x, packed_prefix_lm_mask(pack_segment, pack_answer)).reshape(-1, self.width)
            return x[cls_index], x[answer_index]

    class ContrastiveHead(nn.Module):
        def __init__(self, in_width: int, embed_dim: int):
            super().__init__()
            self.fc = nn.Linear(in_width, embed_dim, bias=False)

        def forward(self, x):
            x = self.fc(x)
            return x * torch.rsqrt((x * x).sum(-1, keepdim=True).clamp(min=1e-24))

    class LogitScale(nn.Module):
        def __init__(self, init: float):
            super().__init__()
            self.value = nn.Parameter(torch.tensor([init]))

        def forward(self):
            return self.value.exp().clamp(max=100.0)[0]

    class NormDenseHead(nn.Module):
        def __init__(self, width: int, out_width: int, eps: float):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(width, eps=eps), nn.Linear(width, out_width)

        def forward(self, x):
            return self.fc(self.norm(x))

    class TinyModel(nn.Module):
        """mindvl.cells.MultimodalModel's training construct (the packed layouts)."""

        def __init__(self, model_cfg, pre):
            super().__init__()
            vision, text, audio, fusion = model_cfg.vision, model_cfg.text, model_cfg.audio, model_cfg.fusion
            self.vision = Vision(vision, pre.image_size)
            self.text = Text(text)
            self.audio = Audio(audio, pre.n_mels, pre.max_audio_frames)
            self.fusion = Fusion(fusion, vision.width, text.vocab_size, pre.max_answer_length)
            self.image_proj = ContrastiveHead(vision.width, model_cfg.embed_dim)
            self.text_proj = ContrastiveHead(text.width, model_cfg.embed_dim)
            self.audio_proj = ContrastiveHead(audio.width, model_cfg.embed_dim)
            self.logit_scale_image_text = LogitScale(model_cfg.logit_scale_init)
            self.logit_scale_audio_text = LogitScale(model_cfg.logit_scale_init)
            self.answer_head = NormDenseHead(fusion.width, model_cfg.num_answers, fusion.norm_eps)
            self.lm_head = NormDenseHead(fusion.width, text.vocab_size, fusion.norm_eps)

        def forward(self, answer_in, image, text_pack_ids, text_pack_positions, text_pack_segment, text_index,
                    audio_pack_mel, audio_pack_segment, audio_pack_positions, audio_index, pack_index, pack_segment,
                    pack_answer, cls_index, answer_index):
            batch = image.shape[0]
            image_tokens, image_pooled = self.vision(image)
            text_tokens, text_pooled = self.text(text_pack_ids, text_pack_positions, text_pack_segment, text_index)
            audio_tokens, audio_pooled = self.audio(audio_pack_mel, audio_pack_segment, audio_pack_positions,
                                                    audio_index)
            cls, answer_states = self.fusion(image_tokens, text_tokens[:batch], audio_tokens, answer_in, pack_index,
                                             pack_segment, pack_answer, cls_index, answer_index)
            text_emb = self.text_proj(text_pooled)  # (2B, embed_dim): questions, then captions
            return (self.answer_head(cls), self.lm_head(answer_states), self.image_proj(image_pooled),
                    text_emb[batch:], self.audio_proj(audio_pooled), text_emb[:batch], self.logit_scale_image_text(),
                    self.logit_scale_audio_text())

    def group_contrastive(emb_a, emb_b, scale, groups):
        logits = emb_a @ emb_b.T * scale
        positives = (groups.unsqueeze(1) == groups.unsqueeze(0)).float()
        targets = positives / positives.sum(1, keepdim=True)
        return (-(targets * F.log_softmax(logits, -1)).sum(1).mean()
                - (targets * F.log_softmax(logits.T, -1)).sum(1).mean()) / 2

    class TinyLoss(nn.Module):
        """mindvl.train.losses.MultimodalLoss with fixed weights: labels, then the model's inputs."""

        def __init__(self, model, weights):
            super().__init__()
            self.model = model
            self.weights = (weights.contrastive, weights.answer, weights.lm)

        def forward(self, answer, answer_tokens, question_group, caption_group, *inputs):
            answer_next = answer_tokens[:, 1:]
            (answer_logits, lm_logits, image_emb, caption_emb, audio_emb, question_emb, scale_image_text,
             scale_audio_text) = self.model(answer_tokens[:, :-1], *inputs)
            contrastive = (group_contrastive(image_emb, caption_emb, scale_image_text, caption_group)
                           + group_contrastive(audio_emb, question_emb, scale_audio_text, question_group)) / 2
            per_token = F.cross_entropy(lm_logits.flatten(0, 1), answer_next.flatten(), reduction="none")
            keep = (answer_next != PAD_ID).float()
            lm = ((per_token.view_as(keep) * keep).sum(1) / keep.sum(1).clamp(min=1.0)).mean()
            contrastive_weight, answer_weight, lm_weight = self.weights
            return (contrastive_weight * contrastive + answer_weight * F.cross_entropy(answer_logits, answer)
                    + lm_weight * lm)

    return SimpleNamespace(attention_core=attention_core, split_heads=split_heads, MLP=MLP, Stack=Stack,
                           RegressionLoss=RegressionLoss, TinyModel=TinyModel, TinyLoss=TinyLoss)


def torch_reference(mirrors, masked: bool) -> tuple:
    """(loss net, inputs, optimizer update) of the reference model in PyTorch."""
    import torch

    loss_net = mirrors.RegressionLoss(mirrors.Stack(WIDTH, LAYERS, HEADS, FFN))
    # MindSpore's AdamWeightDecay defaults: betas (0.9, 0.999), eps 1e-6
    optimizer = torch.optim.AdamW(loss_net.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6)

    def update():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return loss_net, [torch.from_numpy(array) for array in reference_inputs(masked)], update


def torch_tiny(mirrors) -> tuple:
    """(loss net, inputs, update) mirroring the tiny TrainStep: per-module gradient norms, global-norm clip
    from them, the update only when finite, AdamW (0.9, 0.98, eps 1e-6) with decay on matrices, linear warmup."""
    import torch

    from mindvl.data.reading.loader import TRAIN_COLUMNS  # numpy only, like the packer

    cfg = tiny_config()
    batch, _ = tiny_batch(cfg)
    model = mirrors.TinyModel(cfg.model, cfg.preprocess)
    loss_net = mirrors.TinyLoss(model, cfg.train.loss_weights)
    inputs = [torch.from_numpy(batch[name].astype(np.int64) if batch[name].dtype == np.int32 else batch[name])
              for name in TRAIN_COLUMNS]  # PyTorch indexes with int64
    params = dict(model.named_parameters())
    modules: dict = {}
    for name, param in params.items():
        top = name.split(".", 1)[0]
        modules.setdefault(top if top in ("vision", "text", "audio", "fusion") else "heads", []).append(param)
    decay = [p for p in params.values() if p.ndim >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.train.weight_decay},
                                   {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=cfg.train.lr, betas=(0.9, 0.98), eps=1e-6)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: min(1.0, (done + 1) / cfg.train.warmup_steps))
    clip = cfg.train.grad_clip

    def update():
        norms = torch.stack([torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in group])))
                             for group in modules.values()])
        total = torch.linalg.vector_norm(norms)
        torch._foreach_mul_([p.grad for p in params.values()], clip / total.clamp(min=clip))
        if torch.isfinite(total):
            optimizer.step()
            warmup.step()
        optimizer.zero_grad(set_to_none=True)

    return loss_net, inputs, update


def torch_step(model: str, compiled: bool, steps: int) -> dict:
    import torch

    torch.manual_seed(0)
    mirrors = torch_mirrors()
    loss_net, inputs, update = (torch_tiny(mirrors) if model == "tiny"
                                else torch_reference(mirrors, model.endswith("mask")))
    # names inside the model, as mindvl's (the loss net holds the model as its only child)
    shapes = {name.split(".", 1)[1]: tuple(param.shape) for name, param in loss_net.named_parameters()}
    result = {"parameter_shapes": shapes}
    if not compiled:
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            loss_net(*inputs)
        result["forward_flops"] = counter.get_total_flops()
    forward = torch.compile(loss_net) if compiled else loss_net

    def step() -> float:
        loss = forward(*inputs)
        loss.backward()
        update()
        return loss.item()

    return {**result, **time_steps(step, steps)}


def torch_gemm() -> dict:
    import torch

    return gemm_rates(lambda a, b: (lambda: torch.mm(a, b)), convert=torch.from_numpy)


def torch_ops() -> dict:
    """Per-op rows (`OPS`) in PyTorch eager."""
    import torch
    from torch import nn

    mirrors = torch_mirrors()
    scale = (WIDTH // HEADS) ** -0.5

    def core(x, mask):
        q, k, v = (mirrors.split_heads(x, HEADS) for _ in range(3))
        return mirrors.attention_core(q, k, v, scale, mask).transpose(1, 2).reshape(x.shape)

    def measure(fn, inputs) -> dict:
        first = inputs[0].clone().requires_grad_(True)
        params = list(fn.parameters()) if isinstance(fn, nn.Module) else []
        ones = torch.ones_like(fn(*inputs))

        def forward():
            with torch.no_grad():
                fn(*inputs)

        def forward_backward():
            first.grad = None
            for param in params:
                param.grad = None
            fn(first, *inputs[1:]).backward(ones)

        return time_op(forward, forward_backward)

    functions = dict(zip(OPS, (nn.LayerNorm(WIDTH, eps=1e-6), nn.GELU(),
                               nn.Sequential(nn.Linear(WIDTH, FFN), nn.GELU()), mirrors.MLP(WIDTH, FFN),
                               lambda scores, mask: torch.softmax(scores * scale + mask, -1), core,
                               nn.Linear(WIDTH, FFN), torch.add), strict=True))
    return {name: measure(functions[name], [torch.from_numpy(array) for array in arrays])
            for name, arrays in op_inputs().items()}


# ----------------------------------------------------------------------------- shared worker pieces

def op_inputs() -> dict:
    """Each per-op row's numpy inputs, in `OPS` order; the first is the one differentiated."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, SEQ, WIDTH), dtype=np.float32)
    hidden = rng.standard_normal((BATCH, SEQ, FFN), dtype=np.float32)
    scores = rng.standard_normal((BATCH, HEADS, SEQ, SEQ), dtype=np.float32)
    mask = reference_inputs(True)[2]
    small = rng.standard_normal((16, WIDTH), dtype=np.float32)
    return dict(zip(OPS, ([x], [hidden], [x], [x], [scores, mask], [x, mask], [x], [small, small]), strict=True))


def time_op(forward, forward_backward) -> dict:
    return {"forward_ms": median_ms(forward), "forward_backward_ms": median_ms(forward_backward)}


def gemm_rates(make_call, convert=None) -> dict:
    """GFLOP/s of `make_call(a, b)()` per GEMM_SHAPES entry ("m x k @ k x n"): of the fastest call
    (`gflops`) and of the median one (`median_gflops`); `best`: the highest of `gflops`."""
    rng = np.random.default_rng(2)
    peak, median = {}, {}
    for m, k, n in GEMM_SHAPES:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        seconds = call_seconds(make_call(*(convert(t) for t in (a, b))) if convert else make_call(a, b))
        shape = f"{m}x{k} @ {k}x{n}"
        peak[shape] = 2 * m * k * n / min(seconds) / 1e9
        median[shape] = 2 * m * k * n / statistics.median(seconds) / 1e9
    return {"gflops": peak, "median_gflops": median, "best": max(peak.values())}


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def numpy_gemm() -> dict:
    return gemm_rates(lambda a, b: (lambda: a @ b))


def worker(args) -> dict:
    """One measurement in this process: `step MODEL IMPLEMENTATION`, `gemm LIBRARY` or `ops IMPLEMENTATION`."""
    what, *names = args.worker
    if names[-1].startswith("torch"):
        import torch

        torch.set_num_threads(args.threads)
    elif names[-1] != "numpy":
        mindspore_context(args.threads)
    if what == "gemm":
        return {"mindspore": mindspore_gemm, "torch": torch_gemm, "numpy": numpy_gemm}[names[0]]()
    if what == "ops":
        return torch_ops() if names[0] == "torch-eager" else mindvl_ops(names[0].split("-", 1)[1])
    model, implementation = names
    if implementation.startswith("torch"):
        return torch_step(model, implementation == "torch-compile", args.steps)
    kind = implementation.split("-", 1)[1]
    step, shapes, swapped = (mindvl_tiny_step(kind) if model == "tiny"
                             else mindvl_reference_step(kind, model.endswith("mask")))
    return {"parameter_shapes": shapes, "swapped": swapped, **time_steps(step, args.steps)}


# ----------------------------------------------------------------------------- the parent: run, then report

def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has spent busy since boot (Linux /proc/stat)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spawn(task: list, args) -> dict:
    """Run `task` in a fresh worker process -> its result, or {"error": why} (never raises), with
    `other_cores`: the cores other processes kept busy meanwhile (interference; ~0 on an idle machine)."""
    env = {**os.environ, "GLOG_v": "3", **{name: str(args.threads) for name in THREAD_VARIABLES}}
    command = [sys.executable, __file__, "--worker", *task, "--threads", str(args.threads),
               "--steps", str(args.steps)]
    start, busy, own = time.perf_counter(), busy_cpu_seconds(), children_cpu_seconds()
    try:
        child = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S,
                               check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {WORKER_TIMEOUT_S} s"}
    others = (busy_cpu_seconds() - busy) - (children_cpu_seconds() - own)
    tail = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
    result = {"error": f"worker failed: {tail[:300]}"}
    for line in reversed(child.stdout.splitlines()):
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
            break
    return {**result, "other_cores": max(others, 0.0) / (time.perf_counter() - start)}


def step_flops(model: str, rows: dict):
    """Matmul FLOPs of one train step of `model`, or None (tiny without its PyTorch eager row)."""
    if model != "tiny":
        return reference_flops()
    forward = rows.get("torch-eager", {}).get("forward_flops")
    return 3 * forward if forward else None


def gemm_peaks(gemm: dict) -> tuple:
    """(MindSpore's best GFLOP/s, the best of any library), None where missing."""
    rates = [row["best"] for row in gemm.values() if "best" in row]
    return gemm.get("mindspore", {}).get("best"), max(rates, default=None)


def parameter_check(model: str, rows: dict) -> tuple:
    """(note, whether mindvl's and the PyTorch mirror's parameters agree by name and shape)."""
    def shapes(prefix: str):
        return next((row["parameter_shapes"] for name, row in rows.items()
                     if name.startswith(prefix) and "parameter_shapes" in row), None)

    ours, theirs = shapes("mindvl"), shapes("torch")
    if ours is None or theirs is None:
        return f"{model}: parameters not compared (a side has no result)", True
    ours_count, theirs_count = (sum(int(np.prod(shape)) for shape in table.values()) for table in (ours, theirs))
    differing = sorted(name for name in set(ours) | set(theirs)
                       if tuple(ours.get(name, ())) != tuple(theirs.get(name, ())))
    if not differing:
        return (f"{model}: mindvl {ours_count:,} = PyTorch {theirs_count:,} parameters, {len(ours)} tensors with "
                f"the same names and shapes"), True
    listed = ", ".join(f"{name} {ours.get(name)} vs {theirs.get(name)}" for name in differing[:8])
    return (f"{model}: PARAMETERS DIFFER, mindvl {ours_count:,} vs PyTorch {theirs_count:,}: {listed}"
            f"{' ...' if len(differing) > 8 else ''}"), False


def figure(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def interference(row: dict) -> str:
    """The cores other processes kept busy while `row` was measured (over 0.1: its figures are suspect)."""
    return f"{row['other_cores']:.2f} cores" if "other_cores" in row else "-"


def step_table(results: dict) -> list:
    mindspore_peak, best_peak = gemm_peaks(results["gemm"])
    lines = [("| model | implementation | step ms (median) | step ms (min) | speed vs PyTorch eager | GFLOP/s | "
              "% of MindSpore GEMM peak | % of best GEMM peak | compile s | final loss | other processes |"),
             "|---" * 11 + "|"]
    for model, rows in results["steps"].items():
        flops = step_flops(model, rows)
        eager = rows.get("torch-eager", {}).get("step_ms")
        for implementation, row in rows.items():
            label = IMPLEMENTATIONS[implementation]
            if "error" in row:
                lines.append(f"| {model} | {label} | {row['error']} |" + " - |" * 7 + f" {interference(row)} |")
                continue
            rate = flops / row["step_ms"] / 1e6 if flops else None
            lines.append(
                f"| {model} | {label} | {row['step_ms']:.1f} | {row['min_ms']:.1f} | "
                f"{figure(eager and eager / row['step_ms'], '.2f', 'x')} | {figure(rate, '.1f')} | "
                f"{figure(rate and mindspore_peak and 100 * rate / mindspore_peak, '.0f', '%')} | "
                f"{figure(rate and best_peak and 100 * rate / best_peak, '.0f', '%')} | {row['compile_s']:.1f} | "
                f"{row['final_loss']:.4f} | {interference(row)} |")
    return lines


def goal_lines(results: dict) -> list:
    """The goals for mindvl's default (train.kernels auto; issues 10 and 22): >= 1.1x PyTorch eager's speed,
    >= 60% of the best GEMM peak measured (issue 22), 85% in the long run (issue 10)."""
    mindspore_peak, best_peak = gemm_peaks(results["gemm"])
    lines = []
    for model, rows in results["steps"].items():
        ours, eager, flops = rows.get("mindvl-auto", {}), rows.get("torch-eager", {}), step_flops(model, rows)
        if "step_ms" not in ours or "step_ms" not in eager or not (flops and mindspore_peak and best_peak):
            continue
        speed, rate = eager["step_ms"] / ours["step_ms"], flops / ours["step_ms"] / 1e6
        lines.append(f"goal, {model}, mindvl (auto): {speed:.2f}x PyTorch eager (goal 1.1x: "
                     f"{'met' if speed >= 1.1 else 'not met'}); {100 * rate / mindspore_peak:.0f}% of MindSpore's "
                     f"GEMM peak, {100 * rate / best_peak:.0f}% of the best (goal 60%: "
                     f"{'met' if rate >= 0.6 * best_peak else 'not met'}; long-term 85%)")
    return lines


def gemm_table(gemm: dict) -> list:
    shapes = [f"{m}x{k} @ {k}x{n}" for m, k, n in GEMM_SHAPES]
    lines = ["| library | " + " | ".join(shapes) + " | best | other processes |", "|---" * (len(shapes) + 3) + "|"]
    for library, row in gemm.items():
        if "error" in row:
            lines.append(f"| {GEMM_LIBRARIES[library]} | {row['error']} |" + " - |" * len(shapes)
                         + f" {interference(row)} |")
        else:
            rates = " | ".join(f"{row['gflops'][shape]:.0f} ({row['median_gflops'][shape]:.0f})" for shape in shapes)
            lines.append(f"| {GEMM_LIBRARIES[library]} | {rates} | {row['best']:.0f} | {interference(row)} |")
    return lines


def ops_table(ops: dict) -> list:
    labels = ("MindSpore standard", "mindvl fused", "PyTorch eager")
    header = ([f"fwd ms, {label}" for label in labels] + [f"fwd+bwd ms, {label}" for label in labels])
    lines = ["| op | input | " + " | ".join(header) + " | fused swaps |", "|---" * (len(header) + 3) + "|"]

    def value(row: dict, key: str) -> str:
        return row["error"] if "error" in row else figure(row.get(key), ".2f")

    for name, shape in OPS.items():
        rows = [ops.get(implementation, {}).get(name, {}) for implementation in OP_IMPLEMENTATIONS]
        figures = [value(row, key) for key in ("forward_ms", "forward_backward_ms") for row in rows]
        lines.append(f"| {name} | {shape} | " + " | ".join(figures) + f" | {figure(rows[1].get('swapped'), 'd')} |")
    return lines


MIRROR_NOTES = (
    ("PyTorch mirrors: initial weights are PyTorch's defaults (mindvl: truncated normal 0.02), so final losses "
     "differ across frameworks; torch.optim.AdamW corrects the moments' bias, MindSpore's AdamWeightDecay does "
     "not (same betas and eps, the same work per parameter)."),
    ("tiny mirror: the audio front-end is nn.Conv1d (mindvl: Conv1dMatMul, a Gather of the windows and one "
     "MatMul; the same FLOPs); the audio positions are a zero buffer of the same shape (mindvl: Whisper's "
     "sinusoids, a constant); weight decay on matrices by ndim (mindvl: by name, so its embedding tables and "
     "learned tokens do not decay; the same work); linear warmup only (the timed steps lie inside the 100 warmup "
     "steps, where mindvl's warmup-cosine is the same line); both skip a non-finite update."),
)


def report(results: dict) -> str:
    lines = [f"machine: {results['machine']}",
             (f"train step, {results['threads']} threads, {os.cpu_count()} CPU cores; load average "
              f"{results['load_before']:.2f} before, {results['load_after']:.2f} after; "
              f"{results['seconds']:.0f} s in all"),
             "", *step_table(results), "", *goal_lines(results),
             "", f"GEMM peak, float32 GFLOP/s of the fastest of {REPEATS} calls (of their median)", "",
             *gemm_table(results["gemm"])]
    if results["ops"]:
        others = ", ".join(f"{name} {interference(row)}" for name, row in results["ops"].items())
        lines += ["", f"per op at the reference shapes, ms (median of {REPEATS}); other processes: {others}", "",
                  *ops_table(results["ops"])]
    lines += ["", "notes:"]
    for model, rows in results["steps"].items():
        flops, counted = step_flops(model, rows), rows.get("torch-eager", {}).get("forward_flops")
        source = ("counted by FlopCounterMode" if model == "tiny" else
                  "analytic" + ("" if not counted else ", the same as FlopCounterMode's" if 3 * counted == flops
                                else f", FlopCounterMode's {3 * counted / 1e9:.2f}"))
        swapped = {kind: rows.get(f"mindvl-{kind}", {}).get("swapped") for kind in ("fused", "auto")}
        lines.append(f"- {model}: {figure(flops and flops / 1e9, '.2f')} GFLOP of matmuls per step ({source}); "
                     f"use_kernels \"fused\" swapped {figure(swapped['fused'], 'd')} operations, \"auto\" "
                     f"{figure(swapped['auto'], 'd')} (the rest were faster standard here; `mindvl kernels` lists them)")
        lines.append(f"- {results['parameters'][model]['note']}")
    if "tiny_packing" in results:
        lines.append(f"- tiny batch packed into (rows x length): {results['tiny_packing']}")
    lines += [f"- {note}" for note in MIRROR_NOTES]
    return "\n".join(lines)


def machine() -> str:
    """CPU, ISA flags, the kernels' build target and, where they are narrowed, the libraries' own ISA caps."""
    from mindvl.cells.kernels import ARCH_ENV
    from mindvl.cells.kernels.machine import describe

    caps = [f"{name}={os.environ[name]}" for name in ISA_CAPS if name in os.environ]
    return describe(os.environ.get(ARCH_ENV, "native")) + (f"; ISA caps: {' '.join(caps)}" if caps else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="reference,tiny", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=20, help=f"timed steps per row (after {WARMUP} warm-up)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--skip-compile", action="store_true", help="no torch.compile rows")
    parser.add_argument("--skip-ops", action="store_true", help="no per-op table")
    parser.add_argument("--json", help="also write every figure to this file")
    add_plot_option(parser)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            result = worker(args)
        except Exception as error:  # noqa: BLE001  (the parent reports it in the row)
            result = {"error": first_line(error)}
        print(RESULT + json.dumps(result), flush=True)
        return
    models = [model.strip() for model in args.models.split(",") if model.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    implementations = [i for i in IMPLEMENTATIONS if not (args.skip_compile and i == "torch-compile")]
    start = time.perf_counter()

    def run(task: list) -> dict:
        result = spawn(task, args)
        summary = result.get("error") or (f"{result['step_ms']:.1f} ms/step" if "step_ms" in result else "done")
        print(f"[{time.perf_counter() - start:5.0f} s] {' '.join(task)}: {summary} (other processes: "
              f"{interference(result)})", flush=True)
        return result

    results = {"machine": machine(), "threads": args.threads, "timed_steps": args.steps,
               "load_before": os.getloadavg()[0],
               "gemm": {library: run(["gemm", library]) for library in GEMM_LIBRARIES},
               "steps": {model: {i: run(["step", model, i]) for i in implementations} for model in models},
               "ops": {} if args.skip_ops else {i: run(["ops", i]) for i in OP_IMPLEMENTATIONS},
               "parameters": {}}
    for model, rows in results["steps"].items():
        note, same = parameter_check(model, rows)
        results["parameters"][model] = {"note": note, "same": same}
        for row in rows.values():  # the JSON keeps the counts
            if "parameter_shapes" in row:
                row["parameters"] = sum(int(np.prod(shape)) for shape in row.pop("parameter_shapes").values())
    if "tiny" in models:
        streams = tiny_batch(tiny_config())[1]
        results["tiny_packing"] = ", ".join(f"{name} {rows}x{length}" for name, (rows, length) in streams.items())
    results["load_after"], results["seconds"] = os.getloadavg()[0], time.perf_counter() - start
    print("\n" + report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    plot_comparison(args.plot, [{"model": model, "implementation": IMPLEMENTATIONS[i], **row}
                                for model, rows in results["steps"].items() for i, row in rows.items()],
                    x="model", series="implementation", value="step_ms", ylabel=f"ms a step, median of {args.steps}",
                    title=f"one training step, {args.threads} threads", machine=results["machine"])
    if not all(check["same"] for check in results["parameters"].values()):
        raise SystemExit("mindvl and its PyTorch mirror differ in parameters (notes above)")


if __name__ == "__main__":
    main()
