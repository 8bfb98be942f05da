"""Standard-op formulations of primitives some export targets lack, swapped in only for those targets.

MindSpore 2.10's ONNX exporter has no converter for Erf (exact GELU) or Rsqrt (the embedding heads' L2
normalisation); MindSpore Lite 2.0's LayerNorm kernel returns wrong rows for batch index >= 1 when it
runs on more than one thread. Training and the standard MindIR keep the fast primitives; an export
target puts these cells in their place with `substituted` (same attribute names, so `construct` is
untouched) for the length of its export.
"""
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, Tuple, Type

from mindspore import nn, ops

# Abramowitz & Stegun 7.1.26: erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p x), x >= 0;
# |error| <= 1.5e-7
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


class PolynomialErf(nn.Cell):
    """erf(x) from Abs, Exp, Mul, Add, RealDiv, Less and Select (|error| <= 1.5e-7 against ops.Erf)."""

    def __init__(self):
        super().__init__()
        self.abs = ops.Abs()
        self.exp = ops.Exp()
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.div = ops.RealDiv()
        self.neg = ops.Neg()
        self.less = ops.Less()
        self.select = ops.Select()

    def construct(self, x):
        magnitude = self.abs(x)
        t = self.div(1.0, self.add(self.mul(magnitude, ERF_P), 1.0))
        series = ERF_A[4]
        for coefficient in (ERF_A[3], ERF_A[2], ERF_A[1], ERF_A[0]):  # Horner, unrolled at compile time
            series = self.add(self.mul(series, t), coefficient)
        y = 1.0 - self.mul(self.mul(series, t), self.exp(self.neg(self.mul(magnitude, magnitude))))
        return self.select(self.less(x, 0.0), self.neg(y), y)


class PowRsqrt(nn.Cell):
    """1 / sqrt(x) as Pow(x, -0.5)."""

    def __init__(self):
        super().__init__()
        self.pow = ops.Pow()

    def construct(self, x):
        return self.pow(x, -0.5)


class DecomposedLayerNorm(nn.Cell):
    """ops.LayerNorm over the last axis from ReduceMean, Sub, Mul, Add, Sqrt and RealDiv; returns (y, mean,
    variance) like the primitive (within 1e-6 of it in float32). Sqrt and a division, not Rsqrt: Lite
    2.0's single-thread Rsqrt is an approximation (relative error ~2e-4)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sub = ops.Sub()
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.sqrt = ops.Sqrt()
        self.div = ops.RealDiv()

    def construct(self, x, weight, bias):
        mean = self.mean(x, -1)
        centred = self.sub(x, mean)
        variance = self.mean(self.mul(centred, centred), -1)
        y = self.add(self.mul(self.div(centred, self.sqrt(self.add(variance, self.eps))), weight), bias)
        return y, mean, variance


# (cell class, attribute, cell -> its portable replacement)
Substitution = Tuple[Type[nn.Cell], str, Callable[[nn.Cell], nn.Cell]]


@contextmanager
def substituted(model: nn.Cell, substitutions: Sequence[Substitution]) -> Iterator[None]:
    """Within the block, each matching cell of `model` has its attribute replaced by the portable
    formulation; the originals are restored on exit."""
    swapped = []
    for _, cell in model.cells_and_names():
        for kind, attribute, portable in substitutions:
            if isinstance(cell, kind):
                swapped.append((cell, attribute, getattr(cell, attribute)))
                setattr(cell, attribute, portable(cell))
    try:
        yield
    finally:
        for cell, attribute, original in swapped:
            setattr(cell, attribute, original)
