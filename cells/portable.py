"""Standard-op formulations of primitives some export targets lack, swapped in only for those targets.

MindSpore 2.10's ONNX exporter has no converter for Erf (exact GELU) or Rsqrt (the embedding heads' L2
normalisation). Training and MindIR keep the fast primitives; `export/onnx.py` puts these cells in
their place (same attribute names, so `construct` is untouched) for the length of an ONNX export.
"""
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
