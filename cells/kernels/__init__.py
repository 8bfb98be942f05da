"""The kernel layer: one switch, `train.kernels`, picks how normalisation, activations and attention run.

"standard" keeps MindSpore's own operators everywhere. "auto" (the default) swaps in each fused operation
that times faster than the standard one on this machine at the model's shapes (auto.py). "fused" swaps in,
per backend:
  CPU     mindvl's C++ kernels (cells/kernels/*.cc, compiled on first use into a cache, called as AOT
          custom operators with their backward kernels as bprop): LayerNorm, RMSNorm, the rotary
          embedding's rotation, a Linear's and the LM head's product (sgemm per worker) and bias (add and
          gradient), GELU, bias + GELU, the attention core (scores, scale, mask, softmax, weighted sum)
          and, where a core has attention dropout, the scaled masked softmax; for generation, a quantized
          Linear's product and a decoder block's whole decode step (decoder_step.cc: one kernel instead of
          ~28, whose runtime between them was ~40% of a step);
  Ascend  MindSpore's fused operators: flash attention (ops.FlashAttentionScore) for the attention core
          (LayerNorm and GELU are single fused kernels there already);
and keeps the standard operators elsewhere. A machine without a working C++ compiler keeps the standard
operators after one warning. Exported graphs never hold these kernels: `standard_kernels(model)` puts the
standard cells back for the length of an export (export/package_writer.py), so MindIR files stay runnable by
Lite and Serving.
"""
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from mindspore import nn

from mindvl.choices import KERNELS

from .machine import cpu_identity

SOURCES = sorted(Path(__file__).resolve().parent.glob("*.cc"))
HEADERS = sorted(Path(__file__).resolve().parent.glob("*.h"))
# -fno-trapping-math: without it g++ may not evaluate both sides of a float select (the clamps in fast_exp,
# fast_erf's sign), so on AVX2, which has no masked vector instructions, every loop calling them stays scalar:
# GELU 5x slower forward, softmax and the attention core ~1.5x (a -march=haswell build timed on an AVX-512
# host; -march=native on AVX-512 vectorises with masks either way). The results do not change: no kernel
# reads the floating-point exception flags.
FLAGS = ("-O3", "-fno-trapping-math", "-fopenmp-simd", "-pthread", "-shared", "-fPIC", "-std=c++17")
ARCH_ENV = "MINDVL_KERNEL_ARCH"  # the build's -march: "native" (default), or e.g. x86-64-v3 (AVX2 + FMA, no AVX-512)
_library: dict = {}  # arch -> {"path": the built library} or {"failed": why not} (asked once per process)


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mindvl" / "kernels"
    return Path(os.environ.get("MINDVL_KERNEL_CACHE", default))


def _link_flags() -> Tuple[str, ...]:
    """The attention kernel calls oneDNN's sgemm from the libdnnl.so.3 MindSpore ships (and has loaded)."""
    import mindspore

    from mindvl.errors import BuildError

    folder = Path(mindspore.__file__).resolve().parent / "lib"
    if not (folder / "libdnnl.so.3").is_file():
        raise BuildError(f"MindSpore's oneDNN library ({folder / 'libdnnl.so.3'}) is missing; reinstall mindspore")
    return f"-L{folder}", "-l:libdnnl.so.3", f"-Wl,-rpath,{folder}"


def library(arch: Optional[str] = None) -> Optional[Path]:
    """The compiled kernels (built on first use, ~5 s), or None after one warning saying why not. `arch`:
    the -march target, default $MINDVL_KERNEL_ARCH or "native"; another one (x86-64-v3) builds the code an
    AVX2 machine runs, so it can be checked and timed on an AVX-512 host."""
    from mindvl.errors import BuildError
    from mindvl.native import build_library

    arch = arch or os.environ.get(ARCH_ENV, "native")
    built = _library.setdefault(arch, {})
    if not built:
        try:
            built["path"] = build_library("kernels", SOURCES, cache_dir(), (FLAGS[0], f"-march={arch}", *FLAGS[1:]),
                                          link=_link_flags(), headers=HEADERS, identity=cpu_identity())
        except BuildError as exc:
            built["failed"] = str(exc)
            warnings.warn(f"mindvl: fused CPU kernels unavailable ({exc}); using MindSpore's standard operators",
                          stacklevel=2)
    return built.get("path")


def _cpu_replacements(model: nn.Cell, path: Path) -> List[Tuple[nn.Cell, str, nn.Cell]]:
    """(parent cell, attribute, fused cell) for every operation of `model` a CPU kernel covers."""
    from mindvl.cells.activation import GELU, BiasActivation, ScaledMaskedSoftmax
    from mindvl.cells.attention import AttentionCore
    from mindvl.cells.decoder import CausalLM
    from mindvl.cells.linear import Linear
    from mindvl.cells.norm import LayerNorm, RMSNorm
    from mindvl.cells.quant import Int4Linear, Int8Linear
    from mindvl.cells.rotary import RotateHalf
    from mindvl.cells.transformer import TransformerBlock

    from .cpu import (FusedAttentionCore, FusedBiasAdd, FusedBiasGELU, FusedDecodeStep, FusedGELU, FusedHeadMatMul,
                      FusedInt4MatMul, FusedInt8MatMul, FusedLayerNorm, FusedMatMul, FusedRMSNorm, FusedRotateHalf,
                      FusedSoftmax, decode_step_problems)

    swaps = []
    for _, cell in model.cells_and_names():
        if isinstance(cell, TransformerBlock) and not decode_step_problems(cell):
            swaps.append((cell, "fused_step", FusedDecodeStep(cell, path)))
        if isinstance(cell, CausalLM):
            swaps.append((cell, "head_matmul", FusedHeadMatMul(path)))
        if isinstance(cell, LayerNorm):
            swaps.append((cell, "layer_norm", FusedLayerNorm(cell.eps, path)))
        if isinstance(cell, RMSNorm):
            swaps.append((cell, "rms_norm", FusedRMSNorm(cell.eps, path)))
        if isinstance(cell, Int8Linear):
            swaps.append((cell, "product", FusedInt8MatMul(path)))
        if isinstance(cell, Int4Linear):
            swaps.append((cell, "product", FusedInt4MatMul(path)))
        if isinstance(cell, Linear):
            swaps.append((cell, "matmul", FusedMatMul(path)))
            if cell.has_bias:
                swaps.append((cell, "bias_add", FusedBiasAdd(path)))
        for name, child in cell.name_cells().items():
            if isinstance(child, AttentionCore) and _fusable_core(child):
                swaps.append((cell, name, FusedAttentionCore(child.heads, child.head_dim, path)))
            elif isinstance(child, BiasActivation) and isinstance(child.act, GELU):
                swaps.append((cell, name, FusedBiasGELU(path)))
            elif isinstance(child, RotateHalf):
                swaps.append((cell, name, FusedRotateHalf(child.head_dim, path)))
            elif isinstance(child, GELU) and not isinstance(cell, BiasActivation):
                swaps.append((cell, name, FusedGELU(path)))
            elif isinstance(child, ScaledMaskedSoftmax) and not (isinstance(cell, AttentionCore) and _fusable_core(cell)):
                swaps.append((cell, name, FusedSoftmax(child.scale, path)))  # a core not fused whole keeps its own
    return swaps


def _default_scale(core) -> bool:
    """The core scales its scores by head_dim ** -0.5, the scale the fused and flash kernels apply."""
    return abs(core.softmax.scale * core.head_dim ** 0.5 - 1) < 1e-6


def _fusable_core(core) -> bool:
    """The fused attention kernels compute multi-head attention (no groups) at head_dim ** -0.5 without
    dropout; other cores keep the standard product and a fused softmax."""
    return core.dropout == 0 and core.group == 1 and _default_scale(core)


def _ascend_replacements(model: nn.Cell, compute: str) -> List[Tuple[nn.Cell, str, nn.Cell]]:
    """(parent cell, attribute, flash attention core) for every attention core flash attention can run;
    one warning names the cores it cannot."""
    from mindvl.cells.attention import AttentionCore

    from .ascend import FlashAttentionCore, flash_attention_problems

    swaps, kept = [], {}
    for prefix, cell in model.cells_and_names():
        for name, child in cell.name_cells().items():
            if not isinstance(child, AttentionCore):
                continue
            problems = flash_attention_problems(child.heads, child.head_dim, compute)
            if child.dropout:
                problems.append("attention dropout (flash attention would need a drop mask)")
            if child.group > 1:
                problems.append("grouped-query attention")
            if not _default_scale(child):
                problems.append("a scale other than head_dim ** -0.5")
            if problems:
                kept.setdefault("; ".join(problems), []).append(f"{prefix}.{name}" if prefix else name)
            else:
                swaps.append((cell, name, FlashAttentionCore(child.heads, child.head_dim, compute)))
    for problems, cores in kept.items():
        warnings.warn(f"mindvl: {len(cores)} attention core(s) keep the standard operators on Ascend ({problems}): "
                      f"{', '.join(cores[:3])}{', ...' if len(cores) > 3 else ''}", stacklevel=3)
    return swaps


def use_kernels(model: nn.Cell, kind: str, device: Optional[str] = None, compute: str = "float32",
                probe: Optional[Callable[[], object]] = None, log: Optional[Callable[[str], None]] = None,
                agree: Optional[Callable] = None, only: Optional[tuple] = None) -> int:
    """Swap the `kind` implementation for `device` (default: MindSpore's device_target) into `model`'s
    cells -> how many were swapped (0 for "standard", for a GPU, or when the CPU kernels cannot be built
    here). `compute`: train.precision.compute (flash attention runs in float16 or bfloat16 only).

    "auto" on the CPU keeps the fused operations that time faster than the standard ones at the shapes
    `probe()` (one forward pass of `model` on a real batch) calls them with (cells/kernels/auto.py), and
    says so in one line to `log`; `agree` makes data-parallel ranks decide alike (auto.choose). On Ascend
    it is "fused" (flash attention, validated statically here). `only`: the fused cell classes to swap in
    (the others keep the standard operators); generation's FusedDecodeStep, which has no backward, is swapped in
    only where `only` names it."""
    import mindspore as ms

    KERNELS.check("train.kernels", kind)
    device = device or ms.get_context("device_target")
    if kind == "standard" or device not in ("CPU", "Ascend"):
        return 0
    if device == "Ascend":
        swaps = [swap for swap in _ascend_replacements(model, compute) if only is None or isinstance(swap[2], only)]
    else:
        path = library()
        if path is None:
            return 0
        swaps = _cpu_replacements(model, path)
        # generation's own kernels (no backward) only where `only` names them: never into a model that trains
        swaps = [swap for swap in swaps if (isinstance(swap[2], only) if only is not None
                                            else not getattr(swap[2], "generation_only", False))]
        if kind == "auto":
            if probe is None:
                raise ValueError("train.kernels: 'auto' times each operation at the shapes it runs at and needs a "
                                 "probe (a forward pass of the model on a real batch); pass probe= or choose "
                                 "'fused' or 'standard'")
            from .auto import choose

            swaps = choose(swaps, probe, path, cache_dir(), log, agree)
    for parent, attribute, fused in swaps:
        setattr(parent, attribute, fused)
    return len(swaps)


def fused_cells() -> tuple:
    """The classes of every fused cell, CPU and Ascend."""
    from .ascend import FlashAttentionCore
    from .cpu import CPU_CELLS

    return (*CPU_CELLS, FlashAttentionCore)


@contextmanager
def standard_kernels(model: nn.Cell) -> Iterator[None]:
    """Within the block every fused cell of `model` is the standard cell (or operator) it replaced (exports);
    the fused ones are back afterwards."""
    fused = fused_cells()
    swapped = [(parent, name, child) for _, parent in model.cells_and_names()
               for name, child in parent.name_cells().items() if isinstance(child, fused)]
    for parent, name, child in swapped:
        setattr(parent, name, child.standard())
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
