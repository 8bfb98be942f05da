"""Decoder pieces against numpy references (grouped-query attention, rotary embeddings, RMSNorm), a decode
step against the full forward pass, and LoRA training of a converted decoder leaving its base untouched."""
from dataclasses import replace

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from mindvl.cells.attention import AttentionCore
from mindvl.cells.decoder import CausalLM, Decode, Prefill
from mindvl.cells.norm import RMSNorm
from mindvl.cells.rotary import RotateHalf, Rotary
from mindvl.config import DecoderConfig

ms.set_context(mode=ms.GRAPH_MODE)
RNG = np.random.default_rng(0)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("q_seq", [5, 1])
def test_grouped_query_attention_is_repeated_kv_attention(q_seq):
    batch, heads, kv_heads, dim, kv_seq = 2, 6, 2, 8, 7
    q = RNG.standard_normal((batch, q_seq, heads * dim)).astype(np.float32)
    k, v = (RNG.standard_normal((batch, kv_seq, kv_heads * dim)).astype(np.float32) for _ in range(2))
    allowed = RNG.random((batch, 1, q_seq, kv_seq)) > 0.3
    allowed[..., 0] = True
    mask = np.where(allowed, 0.0, -1e4).astype(np.float32)
    out = AttentionCore(heads, dim, kv_heads=kv_heads, scale=0.3)(Tensor(q), Tensor(k), Tensor(v), Tensor(mask))
    split = lambda x, h: x.reshape(batch, -1, h, dim).transpose(0, 2, 1, 3)  # noqa: E731
    kr, vr = (np.repeat(split(x, kv_heads), heads // kv_heads, axis=1) for x in (k, v))  # head h reads h // 3
    probs = _softmax(0.3 * split(q, heads) @ kr.transpose(0, 1, 3, 2) + mask)
    expected = (probs @ vr).transpose(0, 2, 1, 3).reshape(batch, q_seq, heads * dim)
    np.testing.assert_allclose(out.asnumpy(), expected, atol=1e-5)


class _Rotated(nn.Cell):
    def __init__(self, dim, theta):
        super().__init__()
        self.rotary = Rotary(dim, theta)
        self.rotate = RotateHalf(dim)

    def construct(self, x, positions):
        cos, sin = self.rotary(positions)
        return self.rotate(x, cos, sin)


def test_rotary_rotates_each_pair_by_its_angle():
    dim, theta = 8, 500.0
    x = RNG.standard_normal((2, 3, 4, dim)).astype(np.float32)
    positions = np.array([[0, 1, 7], [3, 3, 40]], np.int32)
    out = _Rotated(dim, theta)(Tensor(x), Tensor(positions)).asnumpy()
    half = dim // 2
    angle = positions[..., None, None] * theta ** (-np.arange(half) / half)  # (2, 3, 1, half)
    first, second = x[..., :half], x[..., half:]
    expected = np.concatenate([first * np.cos(angle) - second * np.sin(angle),
                               second * np.cos(angle) + first * np.sin(angle)], -1)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(out[0, 0], x[0, 0], atol=1e-6)  # position 0 is not rotated


def test_rms_norm_matches_its_formula():
    x = RNG.standard_normal((3, 16)).astype(np.float32) * 4
    norm = RMSNorm(16, eps=1e-6)
    norm.weight.set_data(Tensor(RNG.standard_normal(16).astype(np.float32)))
    expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * norm.weight.asnumpy()
    np.testing.assert_allclose(norm(Tensor(x)).asnumpy(), expected, rtol=1e-5, atol=1e-5)


TINY = DecoderConfig(width=32, layers=3, heads=4, kv_heads=2, mlp_ratio=2.0, vocab_size=50, qk_norm=True,
                     sandwich_norm=True, sliding_window=3, layer_types=["local", "global", "local"],
                     local_rope_theta=100.0, embed_scale=2.0, activation="gelu_tanh")


def test_decode_steps_equal_the_full_forward_pass():
    lm = CausalLM(TINY, cache_len=16)
    lm.set_train(False)
    ids = RNG.integers(0, 50, (2, 9)).astype(np.int32)
    valid = np.ones_like(ids, bool)
    valid[1, :3] = False  # the second sequence is left-padded: 6 tokens
    full = lm(Tensor(ids), Tensor(valid)).asnumpy()
    prompt = 5
    logits, cache_k, cache_v = Prefill(lm)(Tensor(ids[:, :prompt]), Tensor(valid[:, :prompt]))
    np.testing.assert_allclose(logits.asnumpy(), full[:, prompt - 1], atol=1e-4)
    slot_valid = np.zeros((2, 16), bool)
    slot_valid[:, :prompt] = valid[:, :prompt]
    positions = valid[:, :prompt].sum(1)
    decode = Decode(lm)
    for slot in range(prompt, 9):  # feed the rest of the sequence one token at a time
        slot_valid[:, slot] = True
        logits, cache_k, cache_v = decode(Tensor(ids[:, slot:slot + 1]), Tensor(positions[:, None].astype(np.int32)),
                                          Tensor(np.full((2, 1), slot, np.int32)), Tensor(slot_valid), *cache_k, *cache_v)
        np.testing.assert_allclose(logits.asnumpy(), full[:, slot], atol=1e-4)  # past the window of 3 too
        positions += 1
    assert len(decode.compile_cache) == 1


def test_several_steps_in_one_call_equal_the_full_forward_pass():
    """A reused prefix extended, or drafted tokens verified: steps of one call each see the cache and the steps
    before them, and their keys land at their slots, over whatever a rejected draft left there before."""
    lm = CausalLM(TINY, cache_len=16)
    lm.set_train(False)
    ids = RNG.integers(0, 50, (2, 11)).astype(np.int32)
    valid = np.ones_like(ids, bool)
    valid[1, :3] = False
    full = lm(Tensor(ids), Tensor(valid)).asnumpy()
    prompt = 4
    _, cache_k, cache_v = Prefill(lm)(Tensor(ids[:, :prompt]), Tensor(valid[:, :prompt]))
    decode = Decode(lm)
    slot_valid = np.zeros((2, 16), bool)
    slot_valid[:, :prompt] = valid[:, :prompt]
    start = valid[:, :prompt].sum(1)

    def extend(first, steps, caches, junk=False):
        slots = np.arange(first, first + steps, dtype=np.int32)[None].repeat(2, 0)
        tokens = (ids[:, first:first + steps] if not junk else (ids[:, first:first + steps] + 7) % 50).astype(np.int32)
        seen = slot_valid.copy()
        seen[:, first:first + steps] = True
        positions = (start[:, None] + slots - prompt).astype(np.int32)
        logits, k, v = decode(Tensor(tokens), Tensor(positions), Tensor(slots), Tensor(seen), *caches)
        return logits.asnumpy().reshape(2, steps, -1), [*k, *v]

    caches = [*cache_k, *cache_v]
    _, caches = extend(prompt, 4, caches, junk=True)  # drafts rejected: their slots stay invalid, written again
    logits, caches = extend(prompt, 4, caches)
    np.testing.assert_allclose(logits, full[:, prompt:prompt + 4], atol=1e-4)
    slot_valid[:, prompt:prompt + 4] = True
    logits, _ = extend(prompt + 4, 3, caches)  # past the window of 3
    np.testing.assert_allclose(logits, full[:, prompt + 4:prompt + 7], atol=1e-4)


@pytest.mark.parametrize("changes", [{}, {"kv_heads": 1}, {"kv_heads": 4}, {"attention_bias": True, "lora_rank": 2},
                                     {"gated_mlp": False, "mlp_bias": True}],
                         ids=["gemma-like", "one-kv-head", "no-groups", "qwen2-like-with-lora", "plain-mlp"])
def test_the_wide_decode_step_gives_the_plain_steps_numbers(changes):
    """Decode(wide=True), products with the weight as the left operand (cells.linear's docstring), a gated MLP's
    activations kept as columns, the caches only read (whatever their step's slot holds) and the step's own key
    and value beside them: the plain step's logits, and its new cache rows, with biases, LoRA updates and a
    plain MLP."""
    lm = CausalLM(replace(TINY, **changes), cache_len=16)
    lm.set_train(False)
    for name, param in lm.parameters_and_names():  # non-zero biases and LoRA updates, so both paths add them
        if name.endswith(("bias", "lora_b")):
            param.set_data(Tensor(RNG.standard_normal(param.shape).astype(np.float32) * 0.5))
    ids = RNG.integers(0, 50, (3, 6)).astype(np.int32)
    _, cache_k, cache_v = Prefill(lm)(Tensor(ids[:, :5]), Tensor(np.ones((3, 5), bool)))
    slot_valid = np.zeros((3, 16), bool)
    slot_valid[:, :6] = True
    head = [Tensor(ids[:, 5:6]), Tensor(np.full((3, 1), 5, np.int32)), Tensor(np.full((3, 1), 5, np.int32)),
            Tensor(slot_valid)]
    plain, keys, values = Decode(lm)(*head, *cache_k, *cache_v)
    stale = [c.asnumpy().copy() for c in (*cache_k, *cache_v)]
    for cache in stale:
        cache[:, 5] = RNG.standard_normal(cache[:, 5].shape)  # what the step's own slot held: never read
    wide, new_keys, new_values = Decode(lm, wide=True)(*head, *(Tensor(c) for c in stale))
    np.testing.assert_allclose(wide.asnumpy(), plain.asnumpy(), rtol=1e-5, atol=1e-5)
    for expected, got in zip((*keys, *values), (*new_keys, *new_values)):
        assert got.shape == (3, 1, lm.kv_width)
        np.testing.assert_allclose(got.asnumpy(), expected.asnumpy()[:, 5:6], rtol=1e-5, atol=1e-5)


class _NextTokenLoss(nn.Cell):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.loss = nn.CrossEntropyLoss()

    def construct(self, ids, valid, targets):
        logits = self.lm(ids, valid)
        return self.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def test_lora_training_leaves_the_base_weights_bit_identical(tiny_llms):
    from mindvl.pretrained.llm import load_llm_weights, read_llm_config

    _, cfg = read_llm_config(tiny_llms["llama"])
    cfg.lora_rank = 4
    lm = CausalLM(cfg)
    load_llm_weights(tiny_llms["llama"], lm)
    lora = [p for p in lm.get_parameters() if p.name.rsplit(".", 1)[-1].startswith("lora_")]
    lora_ids = {id(p) for p in lora}  # by identity: wrapping the cell below renames its parameters
    for param in lm.get_parameters():
        param.requires_grad = id(param) in lora_ids
    before = {id(p): (p.name, p.asnumpy().copy()) for p in lm.get_parameters()}
    assert len(lora) == 4 * cfg.layers  # lora_a and lora_b on q and v
    step = nn.TrainOneStepCell(_NextTokenLoss(lm), nn.Adam(lora, learning_rate=1e-2))
    step.set_train(True)
    ids = RNG.integers(0, cfg.vocab_size, (2, 8)).astype(np.int32)
    losses = [float(step(Tensor(ids[:, :-1]), Tensor(np.ones((2, 7), bool)), Tensor(ids[:, 1:])).asnumpy())
              for _ in range(2)]
    assert all(np.isfinite(losses)) and losses[1] < losses[0]
    for param in lm.get_parameters():
        name, value = before[id(param)]
        if id(param) not in lora_ids:
            assert np.array_equal(param.asnumpy(), value), name
        elif name.endswith("lora_b"):  # starts at zero; the first step moves it
            assert not np.array_equal(param.asnumpy(), value), name
