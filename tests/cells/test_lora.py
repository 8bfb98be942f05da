"""LoRA adapters on attention projections: off at start, trainable alone on a frozen weight, foldable."""
import mindspore as ms
import numpy as np
from mindspore import Tensor

from mindvl.cells.linear import Linear, merged_state
from mindvl.cells.transformer import TransformerStack
from mindvl.config import EncoderConfig

ms.set_context(mode=ms.GRAPH_MODE)
RNG = np.random.default_rng(0)


def _lora_layer():
    layer = Linear(8, 6, lora_rank=2, lora_alpha=4.0)
    plain = Linear(8, 6)
    plain.weight.set_data(layer.weight.data)
    return layer, plain


def test_a_new_adapter_leaves_the_layer_unchanged_and_then_adds_its_low_rank_update():
    layer, plain = _lora_layer()
    x = RNG.standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(layer(Tensor(x)).asnumpy(), plain(Tensor(x)).asnumpy(), atol=1e-6)
    lora_b = RNG.standard_normal((6, 2)).astype(np.float32)
    layer.lora_b.set_data(Tensor(lora_b))
    a, w = layer.lora_a.asnumpy(), layer.weight.asnumpy()
    expected = x @ w.T + 2.0 * (x @ a.T) @ lora_b.T  # alpha 4 / rank 2
    np.testing.assert_allclose(layer(Tensor(x)).asnumpy(), expected, atol=1e-5)
    folded = Linear(8, 6)  # the merged state: the same layer without LoRA
    for name, value in merged_state(layer).items():
        getattr(folded, name).set_data(Tensor(value))
    np.testing.assert_allclose(folded(Tensor(x)).asnumpy(), expected, atol=1e-5)


def test_only_the_adapters_train_on_a_frozen_weight():
    layer, _ = _lora_layer()
    layer.weight.requires_grad = False
    layer.bias.requires_grad = False
    params = layer.trainable_params()
    assert sorted(p.name.rsplit(".", 1)[-1] for p in params) == ["lora_a", "lora_b"]
    x = Tensor(RNG.standard_normal((4, 8)).astype(np.float32))
    loss = lambda inputs: (layer(inputs) ** 2).sum()  # noqa: E731
    grads = ms.grad(loss, grad_position=None, weights=params)(x)
    assert np.abs(grads[1].asnumpy()).max() > 0  # lora_b receives the gradient (lora_a's is zero at start)


def test_a_stack_puts_adapters_on_query_and_value_only():
    stack = TransformerStack(EncoderConfig(width=16, layers=2, heads=2, lora_rank=4))
    names = [n for n, _ in stack.parameters_and_names() if ".lora_" in n]
    assert len(names) == 2 * 2 * 2  # 2 layers x (q, v) x (a, b)
    assert {n.split(".")[3] for n in names} == {"q_proj", "v_proj"}
    assert not any(".lora_" in n for n in merged_state(stack))
    assert stack.blocks[0].attn.k_proj.lora_rank == 0
