"""Fused CPU kernels: C++ sources here, compiled on first use into a cached library and called as
MindSpore AOT custom operators, each with its backward kernel as the custom op's bprop.

One switch, `train.kernels`: "standard" (MindSpore's own operators) or "fused" (these kernels where they
exist: LayerNorm so far). `use_kernels(model, kind)` swaps them into a model's cells; a machine without
a working C++ compiler keeps the standard operators after one warning. Exported graphs never hold them:
`standard_kernels(model)` puts MindSpore's operators back for the length of an export (export/package.py),
so MindIR files stay runnable by Lite and Serving.
"""
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from mindspore import Tensor, nn, ops

SOURCES = sorted(Path(__file__).resolve().parent.glob("*.cc"))
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
KINDS = ("standard", "fused")
_library: dict = {}  # "path" -> the built library, or "failed" -> why not (asked once per process)


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mindvl" / "kernels"
    return Path(os.environ.get("MINDVL_KERNEL_CACHE", default))


def library() -> Optional[Path]:
    """The compiled kernels (built on first use, ~5 s), or None after one warning saying why not."""
    from mindvl.native import BuildError, build_library

    if "path" not in _library and "failed" not in _library:
        try:
            _library["path"] = build_library("kernels", SOURCES, cache_dir(), FLAGS)
        except BuildError as exc:
            _library["failed"] = str(exc)
            warnings.warn(f"mindvl: fused CPU kernels unavailable ({exc}); using MindSpore's standard operators",
                          stacklevel=2)
    return _library.get("path")


class FusedLayerNorm(nn.Cell):
    """Drop-in for ops.LayerNorm over the last axis inside mindvl's LayerNorm cell: (x, weight, bias) ->
    (y,) (the cell reads element 0; the primitive's mean and variance are not needed)."""

    def __init__(self, eps: float, path: Path):
        super().__init__()
        self.eps = Tensor(np.float32(eps))
        backward = ops.Custom(f"{path}:MindvlLayerNormBackward", out_shape=lambda x, w, e, dy: (x, w, w),
                              out_dtype=lambda x, w, e, dy: (x, w, w), func_type="aot")
        zeros = ops.ZerosLike()

        def bprop(x, weight, bias, eps, out, dout):
            dx, dweight, dbias = backward(x, weight, eps, dout)
            return dx, dweight, dbias, zeros(eps)

        self.forward = ops.Custom(f"{path}:MindvlLayerNormForward", out_shape=lambda x, w, b, e: x,
                                  out_dtype=lambda x, w, b, e: x, func_type="aot", bprop=bprop)

    def construct(self, x, weight, bias):
        return (self.forward(x, weight, bias, self.eps),)


def use_kernels(model: nn.Cell, kind: str) -> int:
    """Swap the `kind` implementation into every mindvl LayerNorm of `model` -> how many were swapped (0
    for "standard", or when the kernels cannot be built here)."""
    from mindvl.cells.norm import LayerNorm

    if kind not in KINDS:
        raise ValueError(f"train.kernels: {kind!r}; choose one of {list(KINDS)}")
    path = library() if kind == "fused" else None
    if path is None:
        return 0
    norms = [cell for _, cell in model.cells_and_names() if isinstance(cell, LayerNorm)]
    for norm in norms:
        norm.layer_norm = FusedLayerNorm(norm.eps, path)
    return len(norms)


@contextmanager
def standard_kernels(model: nn.Cell) -> Iterator[None]:
    """Within the block every fused kernel of `model` is MindSpore's operator again (exports)."""
    from mindvl.cells.norm import LayerNorm, standard_layer_norm
    from mindvl.cells.portable import substituted

    fused = [(LayerNorm, "layer_norm", lambda cell: standard_layer_norm(cell.eps))]
    if not any(isinstance(c, FusedLayerNorm) for _, c in model.cells_and_names()):
        yield
        return
    with substituted(model, fused):
        yield
