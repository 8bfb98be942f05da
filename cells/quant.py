"""Weight-only quantized Linears: the weights stored as int8 or int4 with float32 scales, activations float32.

Why weight-only: generation and the deployable graphs are bound by reading their projection weights (a quarter
or an eighth of the float32 bytes stored quantized), while the activations stay float32, so no calibration
data is needed. Two layouts, each in groups of consecutive inputs of an output row:
  int8  W[j, t] = q[j, t] * scale[j, g]                  q int8 (out, in), scale (out, groups): one group per
        row is per-channel (what `quantize_model` writes by default), groups of 32 hold a GGUF's Q8_0 / Q5_0
        and groups of 16 its Q6_K exactly
  int4  W[j, t] = q[j, t] * scale[j, g] + minimum[j, g]  q in 0..15 packed two per byte (out, in / 2): in each
        group of 32 inputs, byte b holds input b (low nibble) and input b + 16 (high nibble); the minimum
        makes the grid asymmetric, which holds a GGUF's Q4_0 and Q4_K blocks exactly
The weights are widened inside the graph with standard operators (Cast, Mul, Floor, Concat), so the cells
export to MindIR and run on any backend; the CPU kernels replace `product` with one that reads the quantized
bytes as they are (cells/kernels/quantized_matmul.cc). Primitives are attributes, as in `Linear`.
"""
from typing import Dict, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import initializer

from .linear import Linear

INT8_MAX = 127  # symmetric range [-127, 127]: -128 is left unused so +-max|W| map to +-127
INT4_GROUP = 32  # inputs per int4 group (a GGUF block)
INT4_LEVELS = 15
# Layers int8 in the int4 layout too. A decoder's token table (its embedding and LM head): the head writes the
# logits directly, and its int8 product is the faster one at decode (6.7 against 9.5 ms). The MLP's down and the
# attention's value projections, the two llama.cpp's Q4_K_M keeps at 6 bits: on Gemma 3 270M (docs/llm.md) all
# int4 gave perplexity +24% and 74% top-1 agreement with float32, an int8 table +18% / 79%, these int8 too +9% /
# 84%, for 7 MB more.
INT8_TABLES = ("embed", "lm_head")  # a layer's last name
INT8_PROJECTIONS = ("mlp.fc2", "attn.v_proj")  # the end of a layer's path


# ----------------------------------------------------------------------------- numpy: quantizing, packing

def quantize_int8(weight: np.ndarray, group: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """weight (out, in) float -> (q int8 (out, in), scale float32 (out, in / group)) with weight ~= q * scale
    per group (group None: the whole row, per channel). scale = max|W| / 127 over the group (1 for an all-zero
    group), so each element's error is at most scale / 2."""
    out, width = weight.shape
    group = group or width
    if width % group:
        raise ValueError(f"int8 groups of {group} do not divide a row of {width} inputs")
    grouped = weight.reshape(out, width // group, group)
    peak = np.abs(grouped).max(axis=2)
    scale = np.where(peak > 0, peak / INT8_MAX, 1.0).astype(np.float32)
    q = np.clip(np.round(grouped / scale[..., None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q.reshape(out, width), scale


def quantize_int4(weight: np.ndarray, refinements: int = 4) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """weight (out, in), in a multiple of 32 -> (packed uint8 (out, in / 2), scale, minimum float32 (out, in / 32)).

    Per group of 32: start from the grid spanning the group's minimum to its maximum in 15 steps, then `refinements`
    times fit the scale and minimum to the rounded values by least squares and round again (as llama.cpp refines
    its K-quants): the rounding error falls by ~10% (a Gemma 3 270M MLP weight: 8.3% -> 7.4% relative) against the
    plain min-max grid."""
    out, width = weight.shape
    if width % INT4_GROUP:
        raise ValueError(f"int4 needs rows in groups of {INT4_GROUP} inputs; a row has {width}")
    grouped = weight.reshape(out, width // INT4_GROUP, INT4_GROUP).astype(np.float32)
    low, high = grouped.min(axis=2), grouped.max(axis=2)
    scale = np.where(high > low, (high - low) / INT4_LEVELS, 1.0).astype(np.float32)
    q = np.clip(np.round((grouped - low[..., None]) / scale[..., None]), 0, INT4_LEVELS)
    for _ in range(refinements):
        mean_q, mean_w = q.mean(axis=2), grouped.mean(axis=2)
        spread = ((q - mean_q[..., None]) ** 2).sum(axis=2)
        fitted = ((q - mean_q[..., None]) * (grouped - mean_w[..., None])).sum(axis=2) / np.where(spread > 0, spread, 1)
        usable = (spread > 0) & (fitted > 0)
        scale = np.where(usable, fitted, scale).astype(np.float32)
        low = np.where(usable, mean_w - scale * mean_q, low).astype(np.float32)
        q = np.clip(np.round((grouped - low[..., None]) / scale[..., None]), 0, INT4_LEVELS)
    return pack_int4(q.astype(np.uint8).reshape(out, width)), scale, low.astype(np.float32)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """q (out, in) of values 0..15 -> (out, in / 2) uint8 in the layout above."""
    out, width = q.shape
    halves = q.astype(np.uint8).reshape(out, width // INT4_GROUP, 2, INT4_GROUP // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(out, width // 2)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """pack_int4's inverse: (out, in / 2) uint8 -> (out, in) uint8 values 0..15."""
    out, half = packed.shape
    grouped = packed.reshape(out, -1, INT4_GROUP // 2)
    return np.stack([grouped & 15, grouped >> 4], axis=2).reshape(out, 2 * half)


def dequantize(tensors: Dict[str, np.ndarray]) -> np.ndarray:
    """The float32 weight a quantized layer's tensors ({"weight_int8", "weight_scale"} or {"weight_int4",
    "weight_scale", "weight_min"}) stand for."""
    scale = tensors["weight_scale"]
    if "weight_int8" in tensors:
        q = tensors["weight_int8"].astype(np.float32)
        return (q.reshape(*scale.shape, -1) * scale[..., None]).reshape(q.shape)
    q = unpack_int4(tensors["weight_int4"]).astype(np.float32)
    grouped = q.reshape(*scale.shape, -1) * scale[..., None] + tensors["weight_min"][..., None]
    return grouped.reshape(q.shape)


def layer_weights(path: str, weights: str) -> str:
    """The layout of the layer at `path` (a model path: `blocks.3.mlp.fc2`, `embed`) when a model is quantized to
    `weights`: int4 keeps INT8_TABLES and INT8_PROJECTIONS at int8."""
    kept = path.rsplit(".", 1)[-1] in INT8_TABLES or path.endswith(INT8_PROJECTIONS)
    return "int8" if weights == "int4" and kept else weights


def quantized_tensors(weight: np.ndarray, weights: str) -> Dict[str, np.ndarray]:
    """A float weight (out, in) as the tensors of a WEIGHT_CELLS[weights] layer (names as its parameters): int8
    per channel, or int4 in groups of 32, which falls back to per-channel int8 for rows not in groups of 32."""
    if weights == "int4" and weight.shape[1] % INT4_GROUP == 0:
        return dict(zip(Int4Linear.STORED, quantize_int4(weight)))
    return dict(zip(Int8Linear.STORED, quantize_int8(weight)))


# ----------------------------------------------------------------------------- cells

class Int8Dequantize(nn.Cell):
    """(q int8 (rows, in), scale (rows, groups)) -> the float32 rows, with standard operators."""

    def __init__(self):
        super().__init__()
        self.cast = ops.Cast()
        self.mul = ops.Mul()
        self.reshape = ops.Reshape()

    def construct(self, q, scale):
        rows, width = q.shape
        groups = scale.shape[1]
        grouped = self.reshape(self.cast(q, ms.float32), (rows, groups, width // groups))
        return self.reshape(self.mul(grouped, self.reshape(scale, (rows, groups, 1))), (rows, width))


class Int4Dequantize(nn.Cell):
    """(packed uint8 (rows, in / 2), scale, minimum (rows, in / 32)) -> the float32 rows, with standard
    operators: a byte's high nibble is floor(byte / 16), its low one the byte less 16 times that (exact in
    float32)."""

    def __init__(self):
        super().__init__()
        self.cast = ops.Cast()
        self.floor = ops.Floor()
        self.mul = ops.Mul()
        self.sub = ops.Sub()
        self.add = ops.Add()
        self.concat = ops.Concat(axis=2)
        self.reshape = ops.Reshape()

    def construct(self, packed, scale, minimum):
        rows, half = packed.shape
        groups = scale.shape[1]
        data = self.reshape(self.cast(packed, ms.float32), (rows, groups, INT4_GROUP // 2))
        high = self.floor(self.mul(data, 1.0 / 16))
        low = self.sub(data, self.mul(high, 16.0))
        q = self.concat((low, high))  # (rows, groups, 32): inputs in order
        widened = self.add(self.mul(q, self.reshape(scale, (rows, groups, 1))), self.reshape(minimum, (rows, groups, 1)))
        return self.reshape(widened, (rows, 2 * half))


class Int8Product(nn.Cell):
    """x (rows, in) float32 @ the int8 weight's float32 rows ^T with standard operators: what exports hold; the
    CPU kernels replace it by FusedInt8MatMul."""

    any_rank = False  # x must be rows (QuantizedLinear.project reshapes); the fused kernels take x (..., in)

    def __init__(self):
        super().__init__()
        self.dequantize = Int8Dequantize()
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x, q, scale):
        return self.matmul(x, self.dequantize(q, scale))


class Int4Product(nn.Cell):
    """Int8Product for the int4 layout (the CPU kernels' FusedInt4MatMul replaces it)."""

    any_rank = False

    def __init__(self):
        super().__init__()
        self.dequantize = Int4Dequantize()
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x, packed, scale, minimum):
        return self.matmul(x, self.dequantize(packed, scale, minimum))


class QuantizedLinear(nn.Cell):
    """(..., in) -> (..., out) = x @ W^T + bias with W stored quantized (Int8Linear, Int4Linear: `multiply`
    rows of x, `widen_at` W's rows at ids); also a table whose `rows(ids)` are the float32 rows at ids (a
    quantized decoder's token embedding, tied to its head).
    Built empty by shape (loading fills it: under no_init_parameters nothing is allocated twice) or from a
    float layer with `from_linear` / `quantized_layer`. The quantized weights are frozen; the bias (out,) float32
    is a parameter when the source had one."""

    STORED: Tuple[str, ...] = ()  # the parameters holding W, in the product's argument order
    WEIGHT_FIRST = False  # no `columns` (cells.linear): its products are the kernels'
    DTYPES: Tuple[object, ...] = ()

    def __init__(self, in_width: int, out_width: int, shapes, has_bias: bool = False):
        super().__init__()
        self.in_width, self.out_width, self.has_bias = in_width, out_width, has_bias
        for name, shape, dtype in zip(self.STORED, shapes, self.DTYPES):
            setattr(self, name, Parameter(initializer("zeros", shape, dtype), name=name, requires_grad=False))
        if has_bias:
            self.bias = Parameter(initializer("zeros", (out_width,), ms.float32), name="bias")
        self.gather = ops.Gather()
        self.add = ops.Add()
        self.reshape = ops.Reshape()

    @classmethod
    def from_linear(cls, linear: Linear) -> "QuantizedLinear":
        """The quantized copy of `linear` in this class's layout (see quantized_tensors), with any LoRA update
        folded into the weight first."""
        state = linear.merged_state()
        return quantized_layer(state["weight"], cls.KIND, state.get("bias"))

    def fill(self, tensors: Dict[str, np.ndarray], bias: Optional[np.ndarray] = None) -> "QuantizedLinear":
        for name in self.STORED:
            getattr(self, name).set_data(Tensor(tensors[name]))
        if bias is not None:
            self.bias.set_data(Tensor(np.asarray(bias, np.float32)))
        return self

    def stored(self) -> Dict[str, np.ndarray]:
        return {name: getattr(self, name).asnumpy() for name in self.STORED}

    def dequantized_weight(self) -> np.ndarray:
        """(out, in) float32: the weight the products multiply by."""
        return dequantize(self.stored())

    def construct(self, x):
        y = self.project(x)
        return self.add(y, self.bias) if self.has_bias else y

    def wide(self, x):
        """construct: Linear.wide's interface (a decode step), the kernels' products as they are."""
        return self.construct(x)

    def step_tensors(self):
        """The tensors a fused decode step reads for this layer (cells/kernels/decoder_step.cc): the stored weight's,
        then the bias when it has one."""
        return self.stored_tensors() + (self.bias,) if self.has_bias else self.stored_tensors()

    def project(self, x):
        """The product without the bias, as Linear.project (the MLP adds fc1's bias with its activation)."""
        if self.product.any_rank:
            return self.multiply(x)
        leading = x.shape[:-1]
        y = self.multiply(self.reshape(x, (-1, self.in_width)))
        return self.reshape(y, leading + (self.out_width,))

    def rows(self, ids):
        """ids (...) int32 -> W's rows at ids (..., in) float32: an embedding lookup in a quantized table."""
        return self.reshape(self.widen_at(self.reshape(ids, (-1,))), ids.shape + (self.in_width,))

    def extend_repr(self):
        groups = getattr(self, self.STORED[1]).shape[1]
        return f"in={self.in_width}, out={self.out_width}, bias={self.has_bias}, {self.KIND} in {groups} group(s) a row"


class Int8Linear(QuantizedLinear):
    """weight_int8 (out, in) int8 and weight_scale (out, groups) float32; groups 1 (per channel) by default."""

    KIND = "int8"
    STORED = ("weight_int8", "weight_scale")
    DTYPES = (ms.int8, ms.float32)

    def __init__(self, in_width: int, out_width: int, has_bias: bool = False, groups: int = 1):
        super().__init__(in_width, out_width, ((out_width, in_width), (out_width, groups)), has_bias)
        self.dequantize = Int8Dequantize()
        self.product = Int8Product()  # the CPU kernels swap in FusedInt8MatMul

    def stored_tensors(self):
        return self.weight_int8, self.weight_scale

    def multiply(self, rows):
        return self.product(rows, *self.stored_tensors())

    def widen_at(self, ids):
        return self.dequantize(self.gather(self.weight_int8, ids, 0), self.gather(self.weight_scale, ids, 0))


class Int4Linear(QuantizedLinear):
    """weight_int4 (out, in / 2) uint8 and weight_scale, weight_min (out, in / 32) float32."""

    KIND = "int4"
    STORED = ("weight_int4", "weight_scale", "weight_min")
    DTYPES = (ms.uint8, ms.float32, ms.float32)

    def __init__(self, in_width: int, out_width: int, has_bias: bool = False):
        if in_width % INT4_GROUP:
            raise ValueError(f"Int4Linear: {in_width} inputs are not in groups of {INT4_GROUP}; use Int8Linear")
        groups = in_width // INT4_GROUP
        super().__init__(in_width, out_width, ((out_width, in_width // 2), (out_width, groups), (out_width, groups)),
                         has_bias)
        self.dequantize = Int4Dequantize()
        self.product = Int4Product()  # the CPU kernels swap in FusedInt4MatMul

    def stored_tensors(self):
        return self.weight_int4, self.weight_scale, self.weight_min

    def multiply(self, rows):
        return self.product(rows, *self.stored_tensors())

    def widen_at(self, ids):
        return self.dequantize(self.gather(self.weight_int4, ids, 0), self.gather(self.weight_scale, ids, 0),
                               self.gather(self.weight_min, ids, 0))


WEIGHT_CELLS = {"int8": Int8Linear, "int4": Int4Linear}


def stored_cell(tensors: Dict[str, Tuple[int, ...]], has_bias: bool) -> Optional[QuantizedLinear]:
    """An empty quantized layer for stored tensors' shapes ({"weight_int8": (out, in), "weight_scale": (out, g)}
    or the int4 three), to be filled by loading; None when they are not a quantized layer's."""
    if "weight_int8" in tensors:
        out, width = tensors["weight_int8"]
        return Int8Linear(width, out, has_bias, tensors["weight_scale"][1])
    if "weight_int4" in tensors:
        out, half = tensors["weight_int4"]
        return Int4Linear(2 * half, out, has_bias)
    return None


def quantized_layer(weight: np.ndarray, weights: str, bias: Optional[np.ndarray] = None) -> QuantizedLinear:
    """The quantized layer of a float weight (out, in) and bias in the layout `weights` ("int8" or "int4", see
    quantized_tensors)."""
    tensors = quantized_tensors(weight, weights)
    return stored_cell({name: value.shape for name, value in tensors.items()}, bias is not None).fill(tensors, bias)
