"""ViTTower: a ViT with a CLS token (PackedViT) as a native-resolution tower on a tiny random ViT. Images packed
together give each image's tokens alone (no attention across images or to the padding), and at the position
table's own size a token is exactly the fixed-resolution path's: the encoder's patch states of a merge x merge
block side by side (MultimodalLM's projector.image_merge "concat"), through the same projector. (The Qwen family's
NativeVisionTower: tests/pretrained/test_qwen2_vl.py, against transformers.)"""
import numpy as np
import pytest

from mindvl.config import VisionConfig
from mindvl.engine.vision_layout import ViTPacking
from mindvl.preprocess.native_resolution import IMAGE, PatchConfig, patches

PATCH, TABLE = 8, 4  # a 4 x 4 position table: 32 px images at the table's own size


@pytest.fixture(scope="module")
def tower():
    import mindspore as ms

    from mindvl.cells.native_vision import ViTTower
    from mindvl.cells.vision import PackedViT

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(3)
    cell = ViTTower(PackedViT(VisionConfig(patch_size=PATCH, width=32, layers=2, heads=2), TABLE), out_width=24)
    cell.set_train(False)
    return cell


def _attachment(height, width, seed):
    """A random normalised image of height x width pixels as an attachment (merge-block order, channel-major)."""
    frames = np.random.default_rng(seed).standard_normal((1, 3, height, width)).astype(np.float32)
    flat, grid = patches(frames, PatchConfig(patch_size=PATCH, temporal_patch_size=1))
    return IMAGE, flat, grid, 1.0


def _tokens(cell, attachments, size, capacity):
    from mindspore import Tensor

    inputs = ViTPacking(TABLE, 2, 3 * PATCH * PATCH).inputs(attachments, size, capacity)
    return cell(*(Tensor(x) for x in inputs)).asnumpy()[0]


def test_packed_images_give_each_images_tokens_alone(tower):
    square, wide = _attachment(32, 32, 0), _attachment(16, 48, 1)  # 4 + 3 merged tokens
    packed = _tokens(tower, [square, wide], size=40, capacity=10)
    assert packed.shape == (10, 24)
    np.testing.assert_allclose(packed[:4], _tokens(tower, [square], 17, 4), atol=1e-5)
    np.testing.assert_allclose(packed[4:7], _tokens(tower, [wide], 13, 3), atol=1e-5)


def test_at_the_tables_own_size_a_token_is_the_fixed_resolution_concat_merge(tower):
    from mindspore import Tensor

    from mindvl.cells.vision import VisionEncoder

    kind, flat, grid, step = _attachment(32, 32, 2)
    fixed = VisionEncoder(VisionConfig(patch_size=PATCH, width=32, layers=2, heads=2), 32)
    fixed.set_train(False)
    own = dict(tower.vit.parameters_and_names())
    for name, param in fixed.parameters_and_names():
        param.set_data(own[name].data)
    image = np.zeros((1, 3, 32, 32), np.float32)  # the patches back in place: (3, p, p) each, blocks row by row
    for index, (row, col) in enumerate([(2 * br + r, 2 * bc + c) for br in range(2) for bc in range(2)
                                        for r in range(2) for c in range(2)]):
        image[0, :, row * PATCH:(row + 1) * PATCH, col * PATCH:(col + 1) * PATCH] = flat[index].reshape(3, PATCH, PATCH)
    states = fixed(Tensor(image))[0].asnumpy()[0, 1:].reshape(2, 2, 2, 2, 32)  # (block row, r, block col, c, width)
    merged = states.transpose(0, 2, 1, 3, 4).reshape(4, 4 * 32)
    expected = tower.projector(Tensor(merged[None])).asnumpy()[0]
    np.testing.assert_allclose(_tokens(tower, [(kind, flat, grid, step)], 17, 4), expected, atol=1e-5)


def test_a_model_that_hears_writes_each_clips_pooled_tokens_after_the_vision_tokens(tower):
    """NativeVLM with an audio encoder: the slot table is [vision tokens | each row's clip | zero row]; from the
    audio encoder's cached states (construct_from_tokens, what training over the token cache runs) the logits are
    the full model's; a clip's tokens are its pooled encoder states through the projector."""
    import mindspore as ms
    from mindspore import Tensor

    from mindvl.cells.audio import AudioEncoder
    from mindvl.cells.decoder import CausalLM
    from mindvl.cells.multimodal_lm import pooled_audio
    from mindvl.cells.native_vlm import NativeVLM
    from mindvl.config import AudioConfig, DecoderConfig

    ms.set_seed(4)
    decoder = CausalLM(DecoderConfig(width=24, layers=1, heads=2, kv_heads=1, head_dim=12, mlp_ratio=2.0,
                                     vocab_size=64))
    model = NativeVLM(tower, decoder, AudioEncoder(AudioConfig(width=16, layers=1, heads=2), 8, 16), audio_pool=2)
    model.set_train(False)
    assert model.audio_tokens == 4  # 16 frames -> 8 encoder tokens -> runs of 2
    rng = np.random.default_rng(5)
    mel = rng.standard_normal((2, 8, 16)).astype(np.float32)
    frame_mask = np.zeros((2, 16), np.float32)
    frame_mask[0, :12] = 1  # row 0 has a clip; row 1 none
    vision = ViTPacking(TABLE, 2, 3 * PATCH * PATCH).inputs([_attachment(32, 32, 6)], 17, 4)
    capacity, seq = 4, 12
    slot_index = np.full((1, seq), capacity + 2 * 4, np.int32)
    slot_index[0, 1:5] = np.arange(4)  # the image's tokens
    slot_index[0, 6:10] = capacity + np.arange(4)  # row 0's clip
    ids = rng.integers(0, 64, (1, seq)).astype(np.int32)
    segment, positions = np.ones((1, seq), np.int32), np.arange(seq, dtype=np.int32)[None]
    labels = np.arange(seq, dtype=np.int32)
    head = [Tensor(x) for x in (ids, segment, positions, slot_index, labels)]
    full = model(*head, Tensor(mel), Tensor(frame_mask), *(Tensor(x) for x in vision)).asnumpy()
    states, token_mask, _ = model.audio(Tensor(mel), Tensor(frame_mask))
    cached = model.construct_from_tokens(*head, states * token_mask.expand_dims(2), Tensor(frame_mask),
                                         *(Tensor(x) for x in vision)).asnumpy()
    np.testing.assert_allclose(cached, full, atol=1e-5)
    expected = model.audio_proj(pooled_audio(states, token_mask, 2)).asnumpy()[0]
    embedded = model.embed(Tensor(ids), Tensor(slot_index), Tensor(mel), Tensor(frame_mask),
                           *(Tensor(x) for x in vision)).asnumpy()[0]
    np.testing.assert_allclose(embedded[6:10], expected, atol=1e-5)
    np.testing.assert_allclose(embedded[1:5], tower(*(Tensor(x) for x in vision)).asnumpy()[0], atol=1e-5)
