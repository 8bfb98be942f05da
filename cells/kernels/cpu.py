"""The fused CPU kernels as cells: each calls a C++ function of the compiled library (cells/kernels/*.cc)
through an AOT ops.Custom whose bprop is the matching backward kernel, and each can rebuild the standard
cell it replaced (`standard()`), which is what exports put back.

The kernels compute in float32 only; a precision policy keeps these cells float32 islands
(mindvl.train.precision) and a float16 input is refused when the graph compiles.
"""
from pathlib import Path
from typing import List

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype

from mindvl.cells.activation import BiasActivation, ScaledMaskedSoftmax
from mindvl.cells.attention import AttentionCore
from mindvl.cells.norm import StandardRMSNorm, standard_layer_norm
from mindvl.cells.rotary import RotateHalf


def _float32(kernel: str, outputs: int = 1):
    """out_dtype for a kernel: its outputs are float32, and so must every input be."""

    def dtypes(*inputs):
        for dtype in inputs:
            if isinstance(dtype, mstype.TensorType):
                dtype = dtype.element_type()
            if dtype != mstype.float32:
                raise TypeError(f"mindvl fused kernel {kernel}: inputs must be float32, got {dtype}; keep the cell "
                                f"in float32 (train.precision keeps fused kernels float32) or set train.kernels=standard")
        return inputs[0] if outputs == 1 else (inputs[0],) * outputs

    return dtypes


def _custom(path: Path, function: str, out_shape, outputs: int = 1, bprop=None) -> ops.Custom:
    return ops.Custom(f"{path}:{function}", out_shape=out_shape, out_dtype=_float32(function, outputs),
                      func_type="aot", bprop=bprop)


class FusedLayerNorm(nn.Cell):
    """Replaces ops.LayerNorm over the last axis inside mindvl's LayerNorm cell: (x, weight, bias) -> (y,)
    (the cell reads element 0; the primitive's mean and variance are not needed)."""

    def __init__(self, eps: float, path: Path):
        super().__init__()
        self.eps = eps
        self.eps_tensor = Tensor(np.float32(eps))  # an input, so one build serves every eps
        backward = _custom(path, "MindvlLayerNormBackward", lambda x, w, e, dy: (x, w, w), outputs=3)
        zeros = ops.ZerosLike()

        def bprop(x, weight, bias, eps, out, dout):
            dx, dweight, dbias = backward(x, weight, eps, dout)
            return dx, dweight, dbias, zeros(eps)

        self.forward = _custom(path, "MindvlLayerNormForward", lambda x, w, b, e: x, bprop=bprop)

    def construct(self, x, weight, bias):
        return (self.forward(x, weight, bias, self.eps_tensor),)

    def standard(self):
        return standard_layer_norm(self.eps)


class FusedRMSNorm(nn.Cell):
    """Replaces StandardRMSNorm inside mindvl's RMSNorm cell: (x, weight) -> y in one pass, and its
    gradients for x and the weight from one more."""

    def __init__(self, eps: float, path: Path):
        super().__init__()
        self.eps = eps
        self.eps_tensor = Tensor(np.float32(eps))
        backward = _custom(path, "MindvlRmsNormBackward", lambda x, w, e, dy: (x, w), outputs=2)
        zeros = ops.ZerosLike()

        def bprop(x, weight, eps, out, dout):
            dx, dweight = backward(x, weight, eps, dout)
            return dx, dweight, zeros(eps)

        self.forward = _custom(path, "MindvlRmsNormForward", lambda x, w, e: x, bprop=bprop)

    def construct(self, x, weight):
        return self.forward(x, weight, self.eps_tensor)

    def standard(self):
        return StandardRMSNorm(self.eps)


def _rotation_shape(x, cos, sin):
    """The kernel's layout: x (..., heads, head_dim) and cos, sin (..., 1, head_dim) over the same leading axes."""
    if len(x) < 2 or list(cos) != list(x[:-2]) + [1, x[-1]] or list(sin) != list(cos):
        raise ValueError(f"mindvl fused rotation: expected x (..., heads, head_dim) with cos and sin "
                         f"(..., 1, head_dim), got {list(x)}, {list(cos)}, {list(sin)}; set train.kernels=standard")
    return x


class FusedRotateHalf(nn.Cell):
    """Replaces RotateHalf (split, negate, concatenate, two multiplies and an add) with one pass over the
    queries or keys; the gradient is the transposed rotation, one more pass. cos and sin get no gradient
    (they come from positions)."""

    def __init__(self, head_dim: int, path: Path):
        super().__init__()
        self.head_dim = head_dim
        backward = _custom(path, "MindvlRotateBackward", _rotation_shape)
        zeros = ops.ZerosLike()

        def bprop(x, cos, sin, out, dout):
            return backward(dout, cos, sin), zeros(cos), zeros(sin)

        self.forward = _custom(path, "MindvlRotateForward", _rotation_shape, bprop=bprop)

    def construct(self, x, cos, sin):
        return self.forward(x, cos, sin)

    def standard(self):
        return RotateHalf(self.head_dim)


class FusedBiasAdd(nn.Cell):
    """x + bias over the rows of x, and as gradient dy itself and the bias gradient from one column-sum
    kernel; replaces a Linear's bias_add (MindSpore's broadcast Add and ReduceSum are slow on the CPU)."""

    def __init__(self, path: Path):
        super().__init__()
        column_sum = _custom(path, "MindvlColumnSum", lambda dy: [dy[-1]])

        def bprop(x, bias, out, dout):
            return dout, column_sum(dout)

        self.forward = _custom(path, "MindvlBiasAdd", lambda x, b: x, bprop=bprop)

    def construct(self, x, bias):
        return self.forward(x, bias)

    def standard(self):
        return ops.Add()


class FusedMatMul(nn.Cell):
    """x (M, K) @ weight (N, K)^T, a Linear's product, and its gradients, each direction one sgemm call per
    worker of the kernels' pool on its share of the rows; replaces a Linear's matmul (MindSpore's MatMul
    keeps both cores busy on some calls only)."""

    def __init__(self, path: Path):
        super().__init__()
        backward = _custom(path, "MindvlMatMulBackward", lambda x, w, dy: (x, w), outputs=2)

        def bprop(x, weight, out, dout):
            return backward(x, weight, dout)

        self.forward = _custom(path, "MindvlMatMul", lambda x, w: [x[0], w[0]], bprop=bprop)

    def construct(self, x, weight):
        return self.forward(x, weight)

    def standard(self):
        return ops.MatMul(transpose_b=True)


def _quantized_product(path: Path, function: str, stored) -> ops.Custom:
    """The AOT product of x (..., K) float32 with a quantized weight (N, ...) whose tensors have dtypes `stored`:
    (..., N), x's leading axes taken as rows, so the layer needs no Reshape around it (each graph node costs
    MindSpore's compiler ~0.25 MB: 252 of Gemma 3's prefill graph were these)."""

    def dtypes(x, *weight):
        found = [t.element_type() if isinstance(t, mstype.TensorType) else t for t in (x, *weight)]
        if found != [mstype.float32, *stored]:
            raise TypeError(f"mindvl fused kernel {function}: expected float32 x and weight tensors of {list(stored)}, "
                            f"got {found}; keep the cell in float32 or set the kernels to standard")
        return x

    return ops.Custom(f"{path}:{function}", out_shape=lambda x, q, *scales: [*x[:-1], q[0]], out_dtype=dtypes,
                      func_type="aot")


class FusedInt8MatMul(nn.Cell):
    """x (M, K) float32 @ the int8 weight (q (N, K), scale (N, groups)) ^T, an Int8Linear's product
    (cells/quant.py), in one kernel that reads the int8 weights as they are (quantized_matmul.cc: a quarter of
    the float32 bytes per decode step) instead of widening the whole weight in the graph first. Inference only
    (the weights are frozen): it has no backward, and "auto" keeps it without timing (the standard product widens
    every weight on every call, always the slower)."""

    untimed = True  # auto.choose keeps it as swapped
    any_rank = True  # x (..., K): QuantizedLinear.project passes x as it is

    def __init__(self, path: Path):
        super().__init__()
        self.forward = _quantized_product(path, "MindvlInt8MatMul", (mstype.int8, mstype.float32))

    def construct(self, x, q, scale):
        return self.forward(x, q, scale)

    def standard(self):
        from mindvl.cells.quant import Int8Product

        return Int8Product()


class FusedInt4MatMul(nn.Cell):
    """FusedInt8MatMul for an Int4Linear (q (N, K / 2) uint8, scale and minimum (N, K / 32)): an eighth of the
    float32 bytes per decode step."""

    untimed = True
    any_rank = True

    def __init__(self, path: Path):
        super().__init__()
        self.forward = _quantized_product(path, "MindvlInt4MatMul", (mstype.uint8, mstype.float32, mstype.float32))

    def construct(self, x, q, scale, minimum):
        return self.forward(x, q, scale, minimum)

    def standard(self):
        from mindvl.cells.quant import Int4Product

        return Int4Product()


class FusedHeadMatMul(FusedMatMul):
    """FusedMatMul as a CausalLM's head_matmul: its own class so that generation can take it alone (a
    one-token step's 262k-row head is 8% faster split over the workers' shares of the vocabulary; the
    block's small products are not)."""


class FusedGELU(nn.Cell):
    """Exact GELU in one pass (cells.activation.GELU is five MindSpore kernels forward)."""

    def __init__(self, path: Path):
        super().__init__()
        backward = _custom(path, "MindvlGeluBackward", lambda x, dy: x)

        def bprop(x, out, dout):
            return (backward(x, dout),)

        self.forward = _custom(path, "MindvlGeluForward", lambda x: x, bprop=bprop)

    def construct(self, x):
        return self.forward(x)

    def standard(self):
        from mindvl.cells.activation import GELU

        return GELU()


class FusedBiasGELU(nn.Cell):
    """GELU(x + bias) forward; backward returns the input gradient and the bias gradient (its column sums)
    from one pass. Replaces BiasActivation("gelu")."""

    def __init__(self, path: Path):
        super().__init__()
        backward = _custom(path, "MindvlBiasGeluBackward", lambda x, b, dy: (x, b), outputs=2)

        def bprop(x, bias, out, dout):
            return backward(x, bias, dout)

        self.forward = _custom(path, "MindvlBiasGeluForward", lambda x, b: x, bprop=bprop)

    def construct(self, x, bias):
        return self.forward(x, bias)

    def standard(self):
        return BiasActivation("gelu")


class FusedSoftmax(nn.Cell):
    """softmax(scale * scores + mask) over the last axis in one pass per row, forward and backward;
    replaces ScaledMaskedSoftmax. The mask (additive, broadcastable to the scores) gets no gradient."""

    def __init__(self, scale: float, path: Path):
        super().__init__()
        self.scale = scale
        self.scale_tensor = Tensor(np.float32(scale))
        backward = _custom(path, "MindvlSoftmaxBackward", lambda p, dp, s: p)
        zeros = ops.ZerosLike()

        def masked_bprop(scores, mask, scale, out, dout):
            return backward(out, dout, scale), zeros(mask), zeros(scale)

        def bprop(scores, scale, out, dout):
            return backward(out, dout, scale), zeros(scale)

        self.masked = _custom(path, "MindvlMaskedSoftmaxForward", lambda s, m, c: s, bprop=masked_bprop)
        self.unmasked = _custom(path, "MindvlSoftmaxForward", lambda s, c: s, bprop=bprop)

    def construct(self, scores, mask=None):
        if mask is None:
            return self.unmasked(scores, self.scale_tensor)
        return self.masked(scores, mask, self.scale_tensor)

    def standard(self):
        return ScaledMaskedSoftmax(self.scale)


class FusedAttentionCore(nn.Cell):
    """softmax(scale * Q K^T + mask) V from and to (batch, seq, heads * head_dim) in one kernel per direction
    (heads read in place: no transposes); replaces AttentionCore when it has no attention dropout. The
    probabilities are a second output, kept for the backward kernel as MindSpore keeps the softmax's."""

    def __init__(self, heads: int, head_dim: int, path: Path):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.scale = Tensor(np.float32(1.0 / np.sqrt(head_dim)))
        self.head_marker = Tensor(np.zeros(heads, np.float32))  # its length tells the kernel the head count
        backward = _custom(path, "MindvlAttentionBackward", lambda q, k, v, p, d, s, h: (q, k, v), outputs=3)
        zeros = ops.ZerosLike()

        def masked_bprop(q, k, v, mask, scale, heads, out, dout):
            dq, dk, dv = backward(q, k, v, out[1], dout[0], scale, heads)
            return dq, dk, dv, zeros(mask), zeros(scale), zeros(heads)

        def bprop(q, k, v, scale, heads, out, dout):
            dq, dk, dv = backward(q, k, v, out[1], dout[0], scale, heads)
            return dq, dk, dv, zeros(scale), zeros(heads)

        self.masked = _custom(path, "MindvlMaskedAttentionForward",
                              lambda q, k, v, m, s, h: (q, [q[0], h[0], q[1], k[1]]), outputs=2, bprop=masked_bprop)
        self.unmasked = _custom(path, "MindvlAttentionForward", lambda q, k, v, s, h: (q, [q[0], h[0], q[1], k[1]]),
                                outputs=2, bprop=bprop)

    def construct(self, q, k, v, mask=None):
        if mask is None:
            return self.unmasked(q, k, v, self.scale, self.head_marker)[0]
        return self.masked(q, k, v, mask, self.scale, self.head_marker)[0]

    def standard(self):
        return AttentionCore(self.heads, self.head_dim)


def _step_products(block) -> list:
    """A block's products in the order decoder_step.cc reads them: q, k, v, out, then gate, up, down when gated."""
    attn, mlp = block.attn, block.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj] + ([mlp.gate, mlp.fc1, mlp.fc2] if mlp.gated else [])


def decode_step_problems(block) -> List[str]:
    """Why FusedDecodeStep cannot run `block` (a TransformerBlock) as its one kernel: [] when it can."""
    from mindvl.cells.activation import GELUTanh, SiLU
    from mindvl.cells.linear import Linear
    from mindvl.cells.norm import RMSNorm
    from mindvl.cells.quant import Int4Linear, Int8Linear

    attn, mlp = block.attn, block.mlp
    norms = [block.norm1, block.norm2]
    norms += [attn.q_norm, attn.k_norm] if attn.qk_norm else []
    norms += [block.post_attn_norm, block.post_mlp_norm] if block.sandwich_norm else []
    problems = []
    if not block.pre_norm:
        problems.append("a post-norm block")
    if not all(isinstance(norm, RMSNorm) for norm in norms) or len({norm.eps for norm in norms}) > 1:
        problems.append("norms other than RMSNorm of one eps")
    if not isinstance(block.ls1, nn.Identity):
        problems.append("LayerScale")
    if not attn.rotary:
        problems.append("attention without the rotary embedding")
    if not mlp.gated or not isinstance(mlp.act, (GELUTanh, SiLU)):
        problems.append("an MLP other than gated GELU-tanh or SiLU")
    if not all(type(layer) in (Linear, Int8Linear, Int4Linear) and getattr(layer, "lora_rank", 0) == 0
               for layer in _step_products(block)):
        problems.append("products other than float32, int8 or int4 weights without LoRA")
    return problems


class FusedDecodeStep(nn.Cell):
    """A decoder block over new tokens as one kernel (decoder_step.cc) instead of the ~28 MindSpore kernels of the
    block's cells: its decode step against the caches (`construct`: TransformerBlock.construct_cached with `beside`,
    the caches read, the step's key and value rows returned) and its prefill (`prefill`: construct_keys). MindSpore's
    runtime spends ~10-13 us between two kernels of a graph, and its compiler ~0.3 MB per graph node. The block
    passes its weights at call time (TransformerBlock.step_tensors); this cell holds only the settings that tell
    the kernel how to read them. Inference only, untimed by "auto" (its standard form is the block's own cells,
    which then run: `standard()` is None)."""

    untimed = True
    generation_only = True  # use_kernels swaps it in only by name (decoder_kernels): no backward
    KINDS = {"Linear": 0, "Int8Linear": 1, "Int4Linear": 2}  # decoder_step.cc's mindvl::Weight::Kind

    def __init__(self, block, path: Path):
        super().__init__()
        from mindvl.cells.activation import SiLU

        problems = decode_step_problems(block)
        if problems:
            raise ValueError(f"mindvl fused decode step: the block has {'; '.join(problems)}; keep its cells")
        attn, mlp = block.attn, block.mlp
        settings = [block.norm1.eps, attn.core.softmax.scale, attn.heads, attn.kv_heads, attn.head_dim,
                    attn.qk_norm, block.sandwich_norm, isinstance(mlp.act, SiLU)]
        for layer in _step_products(block):
            settings += [self.KINDS[type(layer).__name__], layer.has_bias]
        self.settings = Tensor(np.array(settings, np.float32))
        self.kv_width = attn.kv_heads * attn.head_dim
        self.zeros = ops.Zeros()

        def dtypes(x, *others):
            found = x.element_type() if isinstance(x, mstype.TensorType) else x
            if found != mstype.float32:
                raise TypeError(f"mindvl fused decode step: x must be float32, got {found}; keep the block in float32")
            return x, x, x

        def shapes(x, mask, own, cos, sin, keys, *others):
            batch, steps = x[0], x[1]
            if (len(x) != 3 or list(mask[:3]) != [batch, 1, steps] or list(own) != [batch, 1, steps, steps]
                    or list(cos) != [batch, steps, 1, attn.head_dim] or list(keys) != [batch, mask[3], self.kv_width]):
                raise ValueError(f"mindvl fused decode step: expected x (batch, steps, width), masks (batch, 1, steps, "
                                 f"cache_len | steps), cos (batch, steps, 1, head_dim), caches (batch, cache_len, "
                                 f"kv_width); got {list(x)}, {list(mask)}, {list(own)}, {list(cos)}, {list(keys)}")
            return x, [batch, steps, self.kv_width], [batch, steps, self.kv_width]

        self.forward = ops.Custom(f"{path}:MindvlDecoderStep", out_shape=shapes, out_dtype=dtypes, func_type="aot")

    def construct(self, x, mask, rotary, cache_k, cache_v, tensors):
        """One step a row, x (batch, 1, width), against the caches under `mask` (batch, 1, 1, cache_len) -> (y, the
        step's key and value rows (batch, 1, kv_width))."""
        own = self.zeros((x.shape[0], 1, 1, 1), mstype.float32)
        return self.forward(x, mask, own, rotary[0], rotary[1], cache_k, cache_v, self.settings, *tensors)

    def prefill(self, x, mask, rotary, tensors):
        """The prompt x (batch, seq, width) under its causal mask (batch, 1, seq, seq) -> (y, its keys and values
        (batch, seq, kv_width)); no cache (one slot at -inf stands for it)."""
        batch, seq = x.shape[0], x.shape[1]
        empty = self.zeros((batch, 1, self.kv_width), mstype.float32)
        blocked = self.zeros((batch, 1, seq, 1), mstype.float32) - np.inf  # weight 0 even for a query that sees none
        return self.forward(x, blocked, mask, rotary[0], rotary[1], empty, empty, self.settings, *tensors)

    def standard(self):
        return None


CPU_CELLS = (FusedLayerNorm, FusedRMSNorm, FusedRotateHalf, FusedBiasAdd, FusedMatMul, FusedHeadMatMul, FusedGELU,
             FusedBiasGELU, FusedSoftmax, FusedAttentionCore, FusedInt8MatMul, FusedInt4MatMul, FusedDecodeStep)
