"""Dense projections and a MatMul-based Conv1d, the two ways mindvl cells multiply by weights.

Why not `nn.Dense` / `nn.Conv1d`: on MindSpore's CPU backend, BiasAdd's gradient (BiasAddGrad) and
Conv2D (which Conv1d lowers to) are 3-10x and ~50x slower than a MatMul plus a broadcast Add; the
profiled tiny train step spent 40% of its time there. Both cells keep the PyTorch weight layouts
((out, in) and (out, in, kernel)), so pretrained weights load without conversion, and their
primitives are attributes (shardable).

A wide decode step (8 sequences or more, a row each: engine.package_graphs.WIDE_ROWS) multiplies its rows by each
weight where MindSpore's CPU MatMul of x @ W.T repacks the whole weight at every call: 4.1 ms at 16 rows of a
2048 -> 640 product against 0.65 ms with the weight as the left operand, W @ x.T, which reads it as it lies. At a
few rows x @ W.T is as fast or faster (one row: 97 against 110 us at 640 -> 640), so `wide` (Linear.wide, MLP.wide) is what a wide step
takes (cells.decoder.Decode(wide=True)), and a prefill of a short prompt bucket (cells.decoder.WIDE_PREFILL): standard
operators still, the same weights.
"""
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import TruncatedNormal, Uniform, initializer

INIT_STD = 0.02  # BERT/ViT initialiser range


class Linear(nn.Cell):
    """(..., in) -> (..., out) = x @ weight.T + bias; weight (out, in), bias (out,).

    lora_rank > 0 adds a low-rank update (LoRA): + (alpha / rank) * (x @ lora_a.T) @ lora_b.T with
    lora_a (rank, in) random and lora_b (out, rank) zero, so the layer starts as the plain one and a
    frozen pretrained weight can be adapted by training lora_a and lora_b only. `merged_state` folds
    the update into the weight for a graph without it.
    """

    LORA_PREFIX = "lora_"  # the adapters' parameter names start with it
    WEIGHT_FIRST = True  # has `columns` (the module docstring); a quantized layer has not

    def __init__(self, in_width: int, out_width: int, has_bias: bool = True, lora_rank: int = 0,
                 lora_alpha: float = 16.0):
        super().__init__()
        self.in_width = in_width
        self.out_width = out_width
        self.has_bias = has_bias
        self.lora_rank = int(lora_rank)
        self.weight = Parameter(initializer(TruncatedNormal(INIT_STD), (out_width, in_width)), name="weight")
        if has_bias:
            self.bias = Parameter(Tensor(np.zeros(out_width, np.float32)), name="bias")
        if self.lora_rank > 0:
            bound = 1.0 / np.sqrt(in_width)  # as nn.Linear's default init, which LoRA uses for A
            self.lora_a = Parameter(initializer(Uniform(bound), (self.lora_rank, in_width)), name="lora_a")
            self.lora_b = Parameter(Tensor(np.zeros((out_width, self.lora_rank), np.float32)), name="lora_b")
            self.lora_scale = float(lora_alpha) / self.lora_rank
            self.lora_matmul = ops.MatMul(transpose_b=True)
            self.lora_mul = ops.Mul()
        self.matmul = ops.MatMul(transpose_b=True)
        self.weight_first = ops.MatMul(transpose_b=True)  # weight @ rows.T (`columns`)
        self.weight_then = ops.MatMul()  # weight @ columns
        self.transpose = ops.Transpose()
        self.add = ops.Add()
        self.bias_add = ops.Add()  # its own primitive: cells/kernels swaps it for a fused bias kernel
        self.reshape = ops.Reshape()

    def _product(self, rows):
        y = self.matmul(rows, self.weight)  # (rows, out)
        if self.lora_rank > 0:
            update = self.lora_matmul(self.lora_matmul(rows, self.lora_a), self.lora_b)  # (rows, out)
            y = self.add(y, self.lora_mul(update, self.lora_scale))
        return y

    def construct(self, x):
        leading = x.shape[:-1]
        y = self._product(self.reshape(x, (-1, self.in_width)))
        if self.has_bias:
            y = self.bias_add(y, self.bias)
        return self.reshape(y, leading + (self.out_width,))

    def project(self, x):
        """x @ weight.T (+ the LoRA update) without the bias, for a caller that adds the bias itself fused
        with what follows (MLP: bias + GELU)."""
        leading = x.shape[:-1]
        return self.reshape(self._product(self.reshape(x, (-1, self.in_width))), leading + (self.out_width,))

    def columns(self, x, transposed: bool = False):
        """The product with the weight as the left operand (the module docstring): x (rows, in) -> (out, rows),
        or with `transposed` x (in, rows) -> (out, rows): the layer's output as columns."""
        product = self.weight_then if transposed else self.weight_first
        y = product(self.weight, x)
        if self.lora_rank > 0:
            update = self.weight_then(self.lora_b, product(self.lora_a, x))  # (out, rows)
            y = self.add(y, self.lora_mul(update, self.lora_scale))
        if self.has_bias:
            y = self.add(y, self.reshape(self.bias, (-1, 1)))
        return y

    def wide(self, x):
        """construct for the rows of a wide decode step (the module docstring): the same numbers."""
        leading = x.shape[:-1]
        y = self.transpose(self.columns(self.reshape(x, (-1, self.in_width))), (1, 0))
        return self.reshape(y, leading + (self.out_width,))

    def step_tensors(self):
        """The tensors a fused decode step reads for this layer (cells/kernels/decoder_step.cc): the weight, then the
        bias when it has one."""
        return (self.weight, self.bias) if self.has_bias else (self.weight,)

    def merged_state(self) -> dict:
        """{"weight", "bias"?} numpy with the LoRA update folded in: the same layer without LoRA."""
        weight = self.weight.asnumpy()
        if self.lora_rank > 0:
            weight = weight + self.lora_scale * (self.lora_b.asnumpy() @ self.lora_a.asnumpy())
        return {"weight": weight, **({"bias": self.bias.asnumpy()} if self.has_bias else {})}

    def extend_repr(self):
        return f"in={self.in_width}, out={self.out_width}, bias={self.has_bias}, lora_rank={self.lora_rank}"


def dense(in_width: int, out_width: int, has_bias: bool = True, lora_rank: int = 0,
          lora_alpha: float = 16.0) -> Linear:
    """A Linear(in -> out) with weight ~ truncated normal(0.02) and zero bias (+ LoRA when lora_rank > 0)."""
    return Linear(in_width, out_width, has_bias, lora_rank, lora_alpha)


def is_adapter(name: str) -> bool:
    """Whether a parameter name (dotted or not) is a LoRA adapter's."""
    return name.rsplit(".", 1)[-1].startswith(Linear.LORA_PREFIX)


def merged_state(cell: nn.Cell) -> dict:
    """`cell`'s parameters by name with every LoRA update folded into its weight and the LoRA tensors
    left out: the state of the same cell built with lora_rank 0 (export, deployment)."""
    state = {name: param.asnumpy() for name, param in cell.parameters_and_names()
             if not is_adapter(name)}
    for prefix, sub in cell.cells_and_names():
        if isinstance(sub, Linear) and sub.lora_rank > 0:
            state.update({f"{prefix}.{key}" if prefix else key: value for key, value in sub.merged_state().items()})
    return state


class Conv1dMatMul(nn.Cell):
    """Time-major 1-D convolution computed as one MatMul over unfolded windows.

    x (batch, T, in) -> (batch, T_out, out), T_out = (T + 2 * padding - kernel) // stride + 1; the same
    numbers as Conv1d(in, out, kernel, stride, padding) on (batch, in, T). The weight keeps Conv1d's
    (out, in, kernel) layout; the bias is (out,).
    """

    def __init__(self, in_width: int, out_width: int, kernel: int = 3, stride: int = 1, padding: int = 1):
        super().__init__()
        self.in_width, self.out_width = in_width, out_width
        self.kernel, self.stride, self.padding = kernel, stride, padding
        fan_in = in_width * kernel
        bound = 1.0 / np.sqrt(fan_in)
        # MindSpore initialisers follow ms.set_seed: every data-parallel rank builds the same weights
        self.weight = Parameter(initializer(Uniform(bound), (out_width, in_width, kernel)), name="weight")
        self.bias = Parameter(Tensor(np.zeros(out_width, np.float32)), name="bias")
        self.concat = ops.Concat(axis=1)  # zero frames each side (ops.Pad's CPU kernel took 25x longer)
        self.gather = ops.Gather()
        self.transpose = ops.Transpose()
        self.reshape = ops.Reshape()
        self.matmul = ops.MatMul(transpose_b=True)
        self.add = ops.Add()

    def construct(self, x):
        batch, length = x.shape[0], x.shape[1]
        t_out = (length + 2 * self.padding - self.kernel) // self.stride + 1
        if self.padding:
            zeros = ops.zeros((batch, self.padding, self.in_width), x.dtype)
            x = self.concat((zeros, x, zeros))  # (batch, T + 2 * padding, in)
        # one Gather of every window's frames: frame t * stride + k for output t, tap k (a strided slice's
        # gradient kernel fails on CPU, and Gather's gradient is a cheap segment sum)
        taps = ops.arange(t_out).reshape(-1, 1) * self.stride + ops.arange(self.kernel).reshape(1, -1)
        windows = self.gather(x, taps.reshape(-1), 1)  # (batch, T_out * kernel, in)
        x = self.reshape(windows, (-1, self.kernel * self.in_width))  # (batch * T_out, kernel * in)
        weight = self.reshape(self.transpose(self.weight, (0, 2, 1)), (self.out_width, -1))  # (out, kernel * in)
        y = self.add(self.matmul(x, weight), self.bias)
        return self.reshape(y, (batch, t_out, self.out_width))
