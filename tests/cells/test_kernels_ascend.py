"""The Ascend side of the kernel layer (cells/kernels/ascend.py), checked statically: FlashAttentionScore
has Ascend kernels only, so these tests select it, inspect its attributes and run what is standard
operators (the mask conversion) on the CPU; the limits come from the operator's documentation."""
import mindspore as ms
import numpy as np
import pytest

from mindvl.cells.attention import MASK_VALUE, AttentionCore, MultiHeadAttention
from mindvl.cells.kernels import standard_kernels, use_kernels
from mindvl.cells.kernels.ascend import BlockedPositions, FlashAttentionCore, flash_attention_problems


def test_flash_attention_problems_name_each_limit():
    assert flash_attention_problems(4, 64, "bfloat16") == []
    assert flash_attention_problems(8, 128, "float16") == []
    assert flash_attention_problems(4, 24, "bfloat16") == ["head_dim 24 must be a multiple of 16 up to 512"]
    problems = flash_attention_problems(300, 16, "float32")
    assert problems == ["300 heads exceed 256", "train.precision.compute 'float32' must be float16 or bfloat16 "
                                                "(no float32 kernel)"]


def test_the_additive_mask_becomes_flash_attentions_discard_mask():
    additive = np.zeros((2, 1, 1, 5), np.float32)
    additive[0, ..., 3:] = MASK_VALUE
    additive[1, ..., 1] = MASK_VALUE
    blocked = BlockedPositions()(ms.Tensor(additive), 2, 4, 5).asnumpy()
    assert blocked.dtype == np.uint8 and blocked.shape == (2, 1, 4, 5)
    want = np.broadcast_to((additive < -1).astype(np.uint8), (2, 1, 4, 5))
    np.testing.assert_array_equal(blocked, want)
    prefix = np.triu(np.full((3, 3), MASK_VALUE, np.float32), 1)[None, None]  # (1, 1, Q, K): causal
    np.testing.assert_array_equal(BlockedPositions()(ms.Tensor(prefix), 2, 3, 3).asnumpy()[1, 0],
                                  np.triu(np.ones((3, 3), np.uint8), 1))


def test_on_ascend_fused_selects_flash_attention_for_every_core_it_can_run():
    attention = MultiHeadAttention(64, 4)  # head_dim 16
    assert use_kernels(attention, "fused", device="Ascend", compute="bfloat16") == 1
    core = attention.core
    assert isinstance(core, FlashAttentionCore) and core.dtype == ms.bfloat16
    assert (core.flash.head_num, core.flash.scale_value, core.flash.keep_prob) == (4, 0.25, 1.0)
    assert core.flash.input_layout == 0  # BSH: the projections' own layout, no transposes
    with standard_kernels(attention):  # exports
        assert isinstance(attention.core, AttentionCore)
    assert attention.core is core


@pytest.mark.parametrize("width, heads, dropout, compute, reason", [
    (96, 4, 0.0, "bfloat16", "head_dim 24 must be a multiple of 16"),
    (64, 4, 0.0, "float32", "must be float16 or bfloat16"),
    (64, 4, 0.1, "float16", "attention dropout"),
])
def test_cores_flash_attention_cannot_run_keep_the_standard_operators_with_a_warning(width, heads, dropout,
                                                                                      compute, reason):
    attention = MultiHeadAttention(width, heads, dropout=dropout)
    with pytest.warns(UserWarning, match=f"1 attention core.*standard operators on Ascend.*{reason}.*core"):
        assert use_kernels(attention, "fused", device="Ascend", compute=compute) == 0
    assert isinstance(attention.core, AttentionCore)


def test_other_devices_keep_the_standard_operators():
    attention = MultiHeadAttention(64, 4)
    assert use_kernels(attention, "fused", device="GPU") == 0
    assert use_kernels(attention, "standard", device="Ascend") == 0
    assert type(attention.core) is AttentionCore
