"""NativePromptLayout on the tiny Qwen2.5-VL's tokenizer (tests/references/ref_qwen2_vl.py): prompts render to
transformers' ids (one image, two images, a video, text); a batch lays each row out left-padded with its M-RoPE
positions, its vision slots pointing in order into the batch's packed images, text at the token capacity; the
vision buckets take the smallest that holds a batch and refuse more by name. (Generation through these layouts:
tests/pretrained/test_vlm.py, transformers' greedy tokens, batched and alone.)"""
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from mindvl.chat import ChatEncoder, chat_template, conversation_turns, user_turn
from mindvl.engine.native_prompts import IMAGE, VIDEO, NativePrompt, NativePromptLayout
from mindvl.engine.prompts import GenerationLimits
from mindvl.engine.vision_layout import WindowedPacking, mrope_positions
from mindvl.errors import InputError

REFERENCE = Path(__file__).parents[1] / "references" / "tiny_qwen2_5_vl"
STORED = np.load(REFERENCE.parent / "qwen2_vl.npz")
CASES = ["one_image", "two_images", "video", "text"]


def layout(**settings) -> NativePromptLayout:
    chat = ChatEncoder(Tokenizer.from_file(str(REFERENCE / "tokenizer.json")), chat_template("qwen"), 0, 0)
    return NativePromptLayout(chat, GenerationLimits.for_cache(256), WindowedPacking(2, 4, True), **settings)


def prompt(case):
    images = {"one_image": [0], "two_images": [2, 1], "video": [], "text": []}[case]
    attachments = [(IMAGE, STORED[f"processed_{i}_pixels"], STORED[f"processed_{i}_grid"][0], 1.0) for i in images]
    if case == "video":  # 1 s per temporal patch x 2 tokens a second
        attachments = [(VIDEO, STORED["video_pixels"], STORED["video_grid"][0], 2.0)]
    return NativePrompt("what is in it?", attachments)


@pytest.mark.parametrize("case", CASES)
def test_prompts_render_to_transformers_ids(case):
    assert layout().encode(prompt(case)).tolist() == STORED[f"qwen2_5_vl_ids_{case}"].tolist()


def test_a_batch_lays_out_positions_slots_and_the_packed_images_row_by_row():
    native = layout()
    prompts = [prompt(case) for case in CASES]
    batch = native.batch(prompts, 8)
    patches, _, frames, _, restore = batch.vision
    capacity = len(restore)
    assert patches.shape[1] == native.vision_size(prompts) and capacity == patches.shape[1] // 4
    first = 0
    for row, (p, case) in enumerate(zip(prompts, CASES)):
        ids = STORED[f"qwen2_5_vl_ids_{case}"]
        start = batch.ids.shape[1] - len(ids)
        place, delta = mrope_positions(ids, [g for _, _, g, _ in p.attachments], list(native.pads.values()), 2,
                                       [s for *_, s in p.attachments])
        np.testing.assert_array_equal(batch.positions[row, start:], place.T)
        assert batch.deltas[row] == delta and not batch.valid[row, :start].any()
        slots = batch.slot_index[row, start:]
        vision = np.isin(ids, list(native.pads.values()))
        np.testing.assert_array_equal(slots[vision], first + np.arange(vision.sum()))
        assert (slots[~vision] == capacity).all() and (batch.slot_index[row, :start] == capacity).all()
        assert len(batch.encoded[row]) == (~vision).sum()  # the repetition penalty's text tokens
        first += int(vision.sum())
    assert first == int(sum(np.prod(g) // 4 for p in prompts for _, _, g, _ in p.attachments))
    assert frames.any()


def test_vision_buckets_take_the_smallest_that_holds_a_batch_and_refuse_more():
    bucketed = layout(vision_buckets=(256, 1024))
    one, two = prompt("one_image"), prompt("two_images")
    assert bucketed.vision_size([one]) == 256 and bucketed.vision_size([one, two]) == 1024
    batch = bucketed.batch([one], 8)
    assert len(batch.vision[-1]) == 1024 // 4  # the tokens of the largest bucket: one shape for every prefill
    with pytest.raises(InputError, match=r"images: 1,536 patches laid out, more than the 1,024"):
        bucketed.render(NativePrompt("q", two.attachments * 2 + one.attachments))
    assert bucketed.packs([one, two]) and not bucketed.packs([two, two, one])  # prefilled together or not


GEMMA_TOKENIZER = Path(__file__).parents[1] / "references" / "tiny_gemma3_text" / "tokenizer.json"


def test_a_model_that_hears_puts_each_clip_after_the_vision_tokens_in_the_slot_table():
    from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT
    from mindvl.engine.vision_layout import ViTPacking

    chat = ChatEncoder(Tokenizer.from_file(str(GEMMA_TOKENIZER)), chat_template("plain"), 0, 3)
    native = NativePromptLayout(chat, GenerationLimits.for_cache(128), ViTPacking(table=8, merge=2, patch_values=12),
                                mrope=False, audio_tokens=3, speech_shape=(4, 6))
    picture = (IMAGE, np.ones((16, 12), np.float32), np.array([1, 4, 4]), 1.0)  # 4 merged tokens
    clip = (np.full((4, 6), 0.5, np.float32), np.array([1, 1, 1, 1, 0, 0], np.float32))
    prompts = [NativePrompt("", [picture], audio=clip), NativePrompt("what color?", [picture]),
               NativePrompt("", audio=clip)]
    # rendered as the training conversations read: "<image>\n<audio>", "<image>\nwhat color?"
    turn = chat.prompt([conversation_turns([{"from": "human", "value": "<image>\n<audio>"},
                                            {"from": "gpt", "value": "x"}])[0]], images=1, audios=1, sizes=[4, 3])
    np.testing.assert_array_equal(native.encode(prompts[0]), turn.ids)
    batch = native.batch(prompts, 4)
    capacity = native.capacity(native.vision_size(prompts))
    zero_row = capacity + 3 * 3
    for row, p in enumerate(prompts):
        ids = native.encode(p)
        slots = batch.slot_index[row, batch.ids.shape[1] - len(ids):]
        rendered = chat.prompt([user_turn(p.question, [IMAGE_SLOT] * len(p.attachments), p.audio is not None)],
                               images=len(p.attachments), audios=int(p.audio is not None),
                               sizes=[4] * len(p.attachments) + [3] * (p.audio is not None))
        np.testing.assert_array_equal(slots[rendered.kinds == IMAGE_SLOT], 4 * [0, 1][row] + np.arange(4)
                                      if row < 2 else [])
        np.testing.assert_array_equal(slots[rendered.kinds == AUDIO_SLOT], capacity + 3 * row + np.arange(3)
                                      if p.audio is not None else [])
        assert (slots[rendered.kinds == 0] == zero_row).all()
    np.testing.assert_array_equal(batch.mel[[0, 2]], np.stack([clip[0]] * 2))
    assert not batch.mel[1].any() and batch.frame_mask.sum() == 8
    with pytest.raises(InputError, match="audio: this model reads images and video"):
        layout().encode(NativePrompt("", audio=clip))
