"""Building blocks against numpy references: activations, attention, masks, blocks, patch embedding."""
import math

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindvl.cells import (MASK_VALUE, MultiHeadAttention, TransformerBlock, VisionEncoder, create_activation,
                          conv_weight_to_matmul, padding_mask, prefix_lm_mask, segment_mask)
from mindvl.config import VisionConfig

ms.set_context(mode=ms.GRAPH_MODE)


def _weights(dense):
    weight = dense.weight.asnumpy()
    bias = dense.bias.asnumpy() if dense.has_bias else 0.0
    return weight, bias


class _Activations(nn.Cell):
    def __init__(self):
        super().__init__()
        self.gelu = create_activation("gelu")
        self.gelu_tanh = create_activation("gelu_tanh")
        self.relu = create_activation("relu")

    def construct(self, x):
        return self.gelu(x), self.gelu_tanh(x), self.relu(x)


def test_activations_match_their_formulas():
    x = np.linspace(-5, 5, 41).astype(np.float32)
    gelu, gelu_tanh, relu = (o.asnumpy() for o in _Activations()(Tensor(x)))
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(gelu, 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=1e-6)
    np.testing.assert_allclose(gelu_tanh, 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                               atol=1e-6)
    np.testing.assert_allclose(relu, np.maximum(x, 0), atol=0)
    with pytest.raises(ValueError, match="swish"):
        create_activation("swish")


def test_attention_matches_numpy_softmax_qk_v():
    rng = np.random.default_rng(0)
    batch, seq, width, heads = 2, 5, 16, 4
    ms.set_seed(0)
    attn = MultiHeadAttention(width, heads)
    x = rng.standard_normal((batch, seq, width)).astype(np.float32)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    mask = ((1 - valid) * MASK_VALUE)[:, None, None, :]
    out = attn(Tensor(x), Tensor(mask)).asnumpy()

    def project(dense, inputs):
        weight, bias = _weights(dense)
        return inputs @ weight.T + bias

    def heads_first(t):  # (batch, seq, width) -> (batch, heads, seq, head_dim)
        return t.reshape(batch, seq, heads, width // heads).transpose(0, 2, 1, 3)

    q, k, v = (heads_first(project(d, x)) for d in (attn.q_proj, attn.k_proj, attn.v_proj))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // heads) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, width)
    np.testing.assert_allclose(out, project(attn.out_proj, context), atol=1e-5)


class _Masks(nn.Cell):
    def construct(self, key_valid, segments, answer_probe):
        return padding_mask(key_valid), prefix_lm_mask(key_valid, answer_probe.shape[1]), segment_mask(segments)


def test_masks_allow_exactly_the_documented_keys():
    valid = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    segments = np.array([[1, 1, 2, 0], [1, 2, 2, 2]], np.int32)
    pad, prefix_lm, seg = (m.asnumpy() for m in _Masks()(Tensor(valid), Tensor(segments),
                                                          Tensor(np.zeros((2, 2), np.float32))))
    assert pad.shape == (2, 1, 1, 3) and prefix_lm.shape == (2, 1, 5, 5) and seg.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(pad[:, 0, 0] == 0, valid == 1)

    prefix, answer = 3, 2
    for b in range(2):
        for q in range(prefix + answer):
            for k in range(prefix + answer):
                if k < prefix:
                    allowed = valid[b, k] == 1  # every query sees valid prefix keys
                else:
                    allowed = q >= prefix and k <= q  # only answer queries, causally
                assert (prefix_lm[b, 0, q, k] == 0) == allowed, (b, q, k)
                assert prefix_lm[b, 0, q, k] in (0.0, MASK_VALUE)

    expected = (segments[:, None, :] == segments[:, :, None]) & (segments[:, None, :] > 0)
    np.testing.assert_array_equal(seg[:, 0] == 0, expected)


def test_pre_and_post_norm_blocks_differ_and_layer_scale_adds_gains():
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((2, 4, 16)).astype(np.float32))
    ms.set_seed(0)
    pre = TransformerBlock(16, 4, 2.0, pre_norm=True)
    ms.set_seed(0)
    post = TransformerBlock(16, 4, 2.0, pre_norm=False)
    for a, b in zip(pre.get_parameters(), post.get_parameters()):  # same weights, different wiring
        assert a.name == b.name
        b.set_data(a.data.copy())
    out_pre, out_post = pre(x, None).asnumpy(), post(x, None).asnumpy()
    assert out_pre.shape == out_post.shape == (2, 4, 16)
    assert np.abs(out_pre - out_post).max() > 1e-2
    # post-LN ends in a LayerNorm with unit gain and zero bias: every token is standardised.
    np.testing.assert_allclose(out_post.mean(-1), 0, atol=1e-5)

    scaled = TransformerBlock(16, 4, 2.0, layer_scale=0.1)
    gains = {p.name: p.asnumpy() for p in scaled.get_parameters() if p.name.endswith("gamma")}
    assert sorted(gains) == ["ls1.gamma", "ls2.gamma"]
    assert all(np.allclose(g, 0.1) and g.shape == (16,) for g in gains.values())
    assert not any(p.name.endswith("gamma") for p in pre.get_parameters())


class _PatchParity(nn.Cell):
    def __init__(self, vision, conv_weight, conv_bias, patch):
        super().__init__()
        self.vision = vision
        self.conv_weight = Tensor(conv_weight)
        self.conv_bias = Tensor(conv_bias)
        self.patch = patch

    def construct(self, image):
        ours = self.vision.patch_embed(self.vision.patchify(image))  # (B, N, width)
        conv = ops.conv2d(image, self.conv_weight, stride=self.patch) + self.conv_bias.reshape(1, -1, 1, 1)
        conv = conv.reshape(conv.shape[0], conv.shape[1], -1).transpose(0, 2, 1)  # (B, N, width), row-major
        return ours, conv


def test_patch_matmul_equals_strided_conv2d_with_converted_weights():
    rng = np.random.default_rng(2)
    patch, width, size = 4, 8, 12
    vision = VisionEncoder(VisionConfig(patch_size=patch, width=width, layers=1, heads=2), image_size=size)
    weight = rng.standard_normal((width, 3, patch, patch)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    vision.load_conv_patch_weight(weight, bias)
    assert conv_weight_to_matmul(weight).shape == (width, 3 * patch * patch)
    image = Tensor(rng.standard_normal((2, 3, size, size)).astype(np.float32))
    ours, conv = (o.asnumpy() for o in _PatchParity(vision, weight, bias, patch)(image))
    assert ours.shape == (2, 9, width)
    np.testing.assert_allclose(ours, conv, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv1d_matmul_equals_conv1d_with_the_same_weights(stride):
    from mindvl.cells.linear import Conv1dMatMul

    rng = np.random.default_rng(stride)
    x = rng.normal(size=(2, 5, 10)).astype(np.float32)  # (batch, in, T)
    ours = Conv1dMatMul(5, 7, kernel=3, stride=stride, padding=1)
    reference = nn.Conv1d(5, 7, 3, stride=stride, pad_mode="pad", padding=1, has_bias=True)
    reference.weight.set_data(Tensor(ours.weight.asnumpy()[:, :, None, :]))  # Conv1d stores (out, in, 1, k)
    reference.bias.set_data(Tensor(rng.normal(size=7).astype(np.float32)))
    ours.bias.set_data(Tensor(reference.bias.asnumpy()))
    want = reference(Tensor(x)).asnumpy().transpose(0, 2, 1)  # (batch, T_out, out)
    got = ours(Tensor(x.transpose(0, 2, 1).copy())).asnumpy()
    assert got.shape == want.shape == (2, 10 // stride, 7)
    np.testing.assert_allclose(got, want, atol=1e-5)
