"""A native recipe's conversations packed into rows: each image's merged tokens pointing into the batch's packed
vision sequence, and for a model that hears, each clip's slots at its conversation's row of the clips' tokens after
them; text at the table's zero row; a clip of the wrong size refused by name."""
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, ChatEncoder, chat_template, conversation_turns
from mindvl.data.reading.native_conversations import slot_sizes
from mindvl.data.reading.native_packing import NativeConversationPacker
from mindvl.engine.vision_layout import ViTPacking
from mindvl.errors import InputError
from mindvl.preprocess.native_resolution import IMAGE

TOKENIZER = Path(__file__).parents[2] / "references" / "tiny_gemma3_text" / "tokenizer.json"
CLIP = 3


def picture(side: int):
    return (IMAGE, np.ones((side * side, 12), np.float32), np.array([1, side, side]), 1.0)


def rendered(chat, value: str, images, clip_tokens=CLIP):
    turns = conversation_turns([{"from": "human", "value": value}, {"from": "gpt", "value": "a red circle"}])
    sizes = [int(np.prod(grid)) // 4 for _, _, grid, _ in images]
    return chat.render(turns, len(images), int("<audio>" in value), sizes=slot_sizes(turns, sizes, clip_tokens))


def test_clips_follow_the_vision_tokens_in_the_slot_table():
    chat = ChatEncoder(Tokenizer.from_file(str(TOKENIZER)), chat_template("plain"), 0, CLIP)
    items = [[picture(4)], [picture(2), picture(4)], [picture(2)]]
    batch = [rendered(chat, "<image>\n<audio>", items[0]), rendered(chat, "<image><image>\nSame?", items[1]),
             rendered(chat, "<image>\n<audio>", items[2])]
    packer = NativeConversationPacker(64, [1, 2, 3], [16, 32], 16, ViTPacking(table=8, merge=2, patch_values=12),
                                      mrope=False, audio_tokens=CLIP)
    packed, vision = packer(batch, items)
    capacity = packer.vision_size([g for group in items for _, _, g, _ in group]) // 4
    assert len(vision[3]) == capacity * 4  # keep: every merged token's 4 patch rows
    first, seen = [0, 4, 9], set()
    for r in range(packed.shape[0]):
        for seg in range(1, packed.segment[r].max() + 1):
            where = np.flatnonzero(packed.segment[r] == seg)
            b = next(i for i, s in enumerate(batch) if len(s) == len(where) and np.array_equal(s.ids, packed.ids[r, where]))
            seen.add(b)
            slots, kinds = packed.slot_index[r, where], batch[b].kinds
            np.testing.assert_array_equal(slots[kinds == IMAGE_SLOT], first[b] + np.arange((kinds == IMAGE_SLOT).sum()))
            np.testing.assert_array_equal(slots[kinds == AUDIO_SLOT],
                                          capacity + b * CLIP + np.arange((kinds == AUDIO_SLOT).sum()))
            assert (slots[kinds == 0] == capacity + len(batch) * CLIP).all()
            np.testing.assert_array_equal(packed.positions[r, where], np.arange(len(where)))
    assert seen == {0, 1, 2} and (batch[0].kinds == AUDIO_SLOT).sum() == CLIP


def test_a_clip_of_another_size_is_refused_by_name():
    chat = ChatEncoder(Tokenizer.from_file(str(TOKENIZER)), chat_template("plain"), 0, CLIP)
    packer = NativeConversationPacker(64, [1, 2], [16], 16, ViTPacking(table=8, merge=2, patch_values=12),
                                      mrope=False, audio_tokens=CLIP)
    with pytest.raises(InputError, match="conversation 0: 5 audio slots, but the model gives 3 tokens per clip"):
        packer([rendered(chat, "<image>\n<audio>", [picture(2)], clip_tokens=5)], [[picture(2)]])
