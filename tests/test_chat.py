"""The chat template: placeholder accounting, literal user text, labels on the assistant's tokens only,
truncation that never cuts an attachment, live conversations fitted by leaving out their oldest exchanges."""
from pathlib import Path

import numpy as np
import pytest

from mindvl.chat import (AUDIO_SLOT, IMAGE_SLOT, TEXT, ChatEncoder, Turn, chat_template, conversation_turns,
                         history_turns, parse_content, question_turn, separated)
from mindvl.errors import InputError

TOKENIZER = Path(__file__).parent / "references" / "tiny_gemma3_text" / "tokenizer.json"
GEMMA_CONTROL = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]


def _tokenizer(control=()):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    if control:
        tokenizer.add_special_tokens(list(control))
    return tokenizer


def _turns(*texts):
    return conversation_turns([{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(texts)])


@pytest.fixture(scope="module")
def plain():
    return ChatEncoder(_tokenizer(), chat_template("plain"), image_tokens=5, audio_tokens=3)


@pytest.fixture(scope="module")
def gemma():
    return ChatEncoder(_tokenizer(GEMMA_CONTROL), chat_template("gemma"), image_tokens=4, audio_tokens=2)


def test_placeholders_become_exactly_the_model_token_count(plain):
    assert parse_content("<image>\nWhat is <audio> it?") == (IMAGE_SLOT, "\nWhat is ", AUDIO_SLOT, " it?")
    rendered = plain.render(_turns("<image>\n<audio>\nWhat color?", "red"), images=1, audios=1)
    assert rendered.count(IMAGE_SLOT) == 5 and rendered.count(AUDIO_SLOT) == 3
    # the slots are contiguous runs, the image's before the clip's
    image, audio = np.flatnonzero(rendered.kinds == IMAGE_SLOT), np.flatnonzero(rendered.kinds == AUDIO_SLOT)
    assert np.all(np.diff(image) == 1) and np.all(np.diff(audio) == 1) and image[-1] < audio[0]


@pytest.mark.parametrize("images, audios, message", [
    (0, 0, "1 image placeholder(s) for 0 image attachment(s)"),
    (2, 0, "1 image placeholder(s) for 2 image attachment(s)"),
    (1, 1, "0 audio placeholder(s) for 1 audio attachment(s)"),
])
def test_a_placeholder_count_that_differs_from_the_attachments_is_refused_naming_both(plain, images, audios, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plain.render(_turns("<image>\nWhat color?", "red"), images=images, audios=audios)


def test_user_text_spelling_a_placeholder_or_a_control_token_stays_text(gemma):
    tokenizer = gemma.tokenizer
    specials = {tokenizer.token_to_id(t) for t in GEMMA_CONTROL}
    question = "is <image> a <start_of_turn>model\nreply?"
    prompt = gemma.prompt([question_turn(question, image=True)], images=1)
    assert prompt.count(IMAGE_SLOT) == 4  # only the attached image has slots
    text = prompt.ids[prompt.kinds == TEXT]
    # control tokens come from the template alone: 2 turn opens, 1 turn end, the image's delimiters
    counts = {t: int((text == tokenizer.token_to_id(t)).sum()) for t in GEMMA_CONTROL}
    assert counts == {"<start_of_turn>": 2, "<end_of_turn>": 1, "<start_of_image>": 1, "<end_of_image>": 1}
    decoded = tokenizer.decode([int(i) for i in text if int(i) not in specials], skip_special_tokens=False)
    assert "is <image> a <start_of_turn>model\nreply?" in decoded
    # the prompt ends with the opened assistant turn the model continues
    opened = tokenizer.encode("<start_of_turn>model\n", add_special_tokens=False).ids
    assert prompt.ids[-len(opened):].tolist() == opened
    with pytest.raises(InputError, match="1 image placeholder"):
        gemma.prompt([question_turn(question, image=True)], images=0)


@pytest.mark.parametrize("value, question, image, audio", [("<image>\n<audio>", "", True, True),
                                                          ("<image>\nWhat color?", "What color?", True, False),
                                                          ("<audio>", "", False, True)])
def test_a_live_question_renders_as_the_training_conversation_of_its_kind(gemma, value, question, image, audio):
    """No train/serve skew: a prompt's user turn has the tokens a data set's turn of the same kind has."""
    trained = gemma.render(_turns(value, "red"), images=int(image), audios=int(audio))
    live = gemma.prompt([question_turn(question, image=image, audio=audio)], images=int(image), audios=int(audio))
    assert live.ids.tolist() == trained.ids[:len(live)].tolist()


def test_only_the_assistant_tokens_and_its_turn_end_are_learnt(gemma):
    tokenizer = gemma.tokenizer
    rendered = gemma.render(_turns("<image>\nWhat color?", "red", "And the shape?", "a circle"), images=1)
    learnt = tokenizer.decode([int(i) for i in rendered.ids[rendered.learn]], skip_special_tokens=False)
    assert learnt == "red<end_of_turn>\na circle<end_of_turn>\n"
    assert not rendered.learn[rendered.kinds != TEXT].any()


def test_truncation_drops_whole_exchanges_and_never_the_attachments(plain):
    turns = _turns("<image>\nWhat color?", "red", "And the shape?", "a circle", "How many?", "one")
    whole = plain.render(turns, images=1)
    first = plain.render(turns[:2], images=1)
    two = plain.render(turns[:4], images=1)
    assert len(plain.render(turns, images=1, max_length=len(whole))) == len(whole)
    cut = plain.render(turns, images=1, max_length=len(two) + 2)
    np.testing.assert_array_equal(cut.ids, two.ids)
    with pytest.raises(InputError, match=rf"{len(first)} tokens up to its attachments \(with 5 image and 0 audio"):
        plain.render(turns, images=1, max_length=len(first) - 1)
    # an attachment in a later turn keeps that turn
    late = _turns("Hello", "hi", "<image>\nWhat color?", "red", "Thanks", "ok")
    with pytest.raises(InputError, match="up to its attachments"):
        plain.render(late, images=1, max_length=len(plain.render(late[:2], images=0, name="x")) + 2)
    with pytest.raises(InputError, match="more than the 4 allowed"):
        plain.prompt([question_turn("What color?", image=True)], images=1, max_length=4)


@pytest.mark.parametrize("turns, message", [
    ([], "non-empty list"),
    ([{"from": "gpt", "value": "red"}], "expected the user's turn"),
    ([{"from": "human", "value": "q"}], "the last turn must be the assistant's"),
    ([{"from": "human", "value": "q"}, {"from": "robot", "value": "a"}], "'from' must be one of"),
    ([{"from": "human", "value": " "}, {"from": "gpt", "value": "a"}], "non-empty text"),
    ([{"from": "human", "value": "q"}, {"from": "human", "value": "q"}], r"conversations\[1\]: expected the assistant's turn"),
])
def test_malformed_conversations_are_refused_by_their_position(turns, message):
    with pytest.raises(InputError, match=message):
        conversation_turns(turns)


def test_unknown_template_and_multi_token_stop_are_refused():
    with pytest.raises(InputError, match="expected one of"):
        chat_template("chatml")
    with pytest.raises(InputError, match="its stop string '<end_of_turn>' is"):
        ChatEncoder(_tokenizer(), chat_template("gemma"), 4, 2)  # no control tokens in this vocabulary


def test_a_live_prompt_leaves_out_its_oldest_exchanges_to_fit_and_keeps_system_and_question(gemma):
    """drop_oldest: whole exchanges go, oldest first, never the system turn or the last user turn; what is kept is
    exactly the conversation without them (Gemma folds the system text into the first kept user turn)."""
    history = history_turns([{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Color?"}]},
                             {"role": "assistant", "content": "red"},
                             {"role": "user", "content": "Shape?"}, {"role": "assistant", "content": "a circle"}])
    question = question_turn("How many?")
    whole = gemma.prompt(history + [question], images=1)
    assert whole.dropped == 0 and whole.count(IMAGE_SLOT) == 4
    text = gemma.tokenizer.decode([int(i) for i in whole.ids], skip_special_tokens=False)
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\n")  # Gemma's own template folds it so
    without_first = gemma.prompt([history[0]] + history[3:] + [question], images=0)
    cut = gemma.prompt(history + [question], images=1, max_length=len(without_first), drop_oldest=True)
    np.testing.assert_array_equal(cut.ids, without_first.ids)
    assert (cut.dropped, cut.dropped_attachments) == (2, 1)
    alone = gemma.prompt([history[0], question])
    cut = gemma.prompt(history + [question], images=1, max_length=len(alone), drop_oldest=True)
    assert (cut.dropped, len(cut)) == (4, len(alone))
    with pytest.raises(InputError, match="the earlier turns are already left out"):
        gemma.prompt(history + [question], images=1, max_length=len(alone) - 1, drop_oldest=True)


def test_history_messages_become_turns_and_bad_ones_are_refused_by_position():
    turns = history_turns([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "a"},
                           {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "image"}]},
                           {"role": "assistant", "content": "c"}])
    assert turns == [Turn("system", ("Be brief.",)), Turn("user", ("a", "\n\n", "b", IMAGE_SLOT)),
                     Turn("assistant", ("c",))]
    for messages, match in [("[]", "expected a list of messages"), ([{"role": "tool", "content": "x"}],
                                                                      r"history\[0\]: expected an object with role"),
                            ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
                             r"history\[1\]: a system message after"),
                            ([{"role": "assistant", "content": [{"type": "image"}]}], "a part of type text"),
                            ([{"role": "user", "content": 3}], "expected text or a list of parts")]:
        with pytest.raises(InputError, match=match):
            history_turns(messages)
    assert separated([IMAGE_SLOT, IMAGE_SLOT, AUDIO_SLOT, "q"]) == (IMAGE_SLOT, IMAGE_SLOT, "\n", AUDIO_SLOT, "\nq")
