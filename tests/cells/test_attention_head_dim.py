"""Attention with an explicit head_dim (inner width heads * head_dim != width, as pruned models have)."""
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindvl.cells import MASK_VALUE, MultiHeadAttention, TransformerStack
from mindvl.errors import ConfigError
from mindvl.config import EncoderConfig

ms.set_context(mode=ms.GRAPH_MODE)
RNG = np.random.default_rng(0)


def _numpy_attention(attn, x, mask, heads, head_dim):
    def project(dense, inputs):
        return inputs @ dense.weight.asnumpy().T + dense.bias.asnumpy()

    batch, seq, _ = x.shape

    def heads_first(t):  # (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)
        return t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    q, k, v = (heads_first(project(d, x)) for d in (attn.q_proj, attn.k_proj, attn.v_proj))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, heads * head_dim)
    return project(attn.out_proj, context)


def test_head_dim_sets_an_inner_width_other_than_the_model_width():
    width, heads, head_dim = 12, 2, 4  # inner width 8 != 12, and 12 / 2 would give 6
    attn = MultiHeadAttention(width, heads, head_dim=head_dim)
    assert attn.q_proj.weight.shape == (8, 12) and attn.v_proj.bias.shape == (8,)
    assert attn.out_proj.weight.shape == (12, 8)
    for dense in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):  # the zero-initialised biases too
        dense.bias.set_data(Tensor(RNG.standard_normal(dense.bias.shape).astype(np.float32)))
    x = RNG.standard_normal((2, 5, width)).astype(np.float32)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    mask = ((1 - valid) * MASK_VALUE)[:, None, None, :]
    out = attn(Tensor(x), Tensor(mask)).asnumpy()
    assert out.shape == (2, 5, width)
    np.testing.assert_allclose(out, _numpy_attention(attn, x, mask, heads, head_dim), atol=1e-5)


def test_default_head_dim_builds_the_same_stack_as_before():
    cfg = EncoderConfig(width=16, layers=2, heads=4)
    ms.set_seed(0)
    default = TransformerStack(cfg)
    ms.set_seed(0)
    explicit = TransformerStack(EncoderConfig(width=16, layers=2, heads=4, head_dim=4))
    shapes = {name: tuple(p.shape) for name, p in default.parameters_and_names()}
    assert shapes == {name: tuple(p.shape) for name, p in explicit.parameters_and_names()}
    assert shapes["blocks.0.attn.q_proj.weight"] == (16, 16) and shapes["blocks.1.mlp.fc1.weight"] == (64, 16)
    assert default.blocks[0].attn.head_dim == 4
    x = Tensor(RNG.standard_normal((2, 3, 16)).astype(np.float32))
    np.testing.assert_allclose(default(x).asnumpy(), explicit(x).asnumpy(), atol=0)


def test_head_dim_lifts_the_divisibility_rule_and_is_validated():
    EncoderConfig(width=30, heads=4, head_dim=8).validate("model.fusion")
    with pytest.raises(ConfigError, match="model.fusion.width: 30 is not divisible"):
        EncoderConfig(width=30, heads=4).validate("model.fusion")
    with pytest.raises(ConfigError, match="model.fusion.head_dim"):
        EncoderConfig(width=32, heads=4, head_dim=-1).validate("model.fusion")
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(16, 4, head_dim=-2)
