"""The host-side token choice: each setting against its definition on hand-made logits."""
from pathlib import Path

import numpy as np
import pytest

from mindvl.engine.sampling import (SamplingConfig, StopMatcher, TextSequence, next_tokens, penalise_presence,
                                    penalise_repetition, sampling_config, token_logprobs, top_logprobs)
from mindvl.engine.grammar import Grammar
from mindvl.errors import ConfigError


def test_greedy_is_argmax():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]], np.float32)
    assert next_tokens(logits, SamplingConfig(), np.random.default_rng(0)).tolist() == [1, 0]


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = np.array([[2.0, -2.0, 1.0]])
    out = penalise_repetition(logits, np.array([[True, True, False]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_presence_and_frequency_penalties_lower_generated_tokens_by_openai_s_formula():
    logits = np.array([[2.0, 1.0, 0.5, 0.0]])
    counts = np.array([[3, 1, 0, 0]])
    out = penalise_presence(logits, counts, SamplingConfig(presence_penalty=0.5, frequency_penalty=0.25))
    np.testing.assert_allclose(out, [[2.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 0.5, 0.0]])
    # greedy under a strong frequency penalty leaves the tokens said: 2 - 3, 1 - 1 fall below token 2's 0.5
    assert next_tokens(logits, SamplingConfig(frequency_penalty=1.0), np.random.default_rng(0), counts=counts)[0] == 2
    assert penalise_presence(logits, counts, SamplingConfig()) is logits  # off: untouched


def test_top_logprobs_are_the_model_s_most_likely_tokens_with_the_chosen_token_s_logprob():
    logits = np.array([1.0, 3.0, 3.0, -2.0, 0.5], np.float32)
    top = top_logprobs(logits, 3)
    assert [token for token, _ in top] == [1, 2, 0]  # ties by id
    log_softmax = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    np.testing.assert_allclose([p for _, p in top], log_softmax[[1, 2, 0]])
    assert top[0][1] == pytest.approx(float(token_logprobs(logits[None], np.array([1]))[0]))
    assert len(top_logprobs(logits, 20)) == 5


def test_top_k_and_top_p_only_draw_from_the_kept_tokens():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    draws = {int(next_tokens(logits, SamplingConfig(temperature=1.0, top_k=2), rng)[0]) for _ in range(200)}
    assert draws == {0, 1}
    # top_p 0.7: 0.5 alone is short of it, 0.5 + 0.3 crosses it: tokens 0 and 1
    draws = {int(next_tokens(logits, SamplingConfig(temperature=1.0, top_p=0.7), rng)[0]) for _ in range(200)}
    assert draws == {0, 1}
    draws = [int(next_tokens(logits, SamplingConfig(temperature=1.0), rng)[0]) for _ in range(4000)]
    assert abs(draws.count(0) / 4000 - 0.5) < 0.05 and 3 in draws


def test_ignore_eos_generates_past_the_end_of_sequence_token_and_keeps_it_out_of_the_text():
    class Words:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(i) for i in ids)

    stopping = TextSequence(0, Words(), sampling_config(), stop_ids={9})
    assert stopping.add(9, last_step=False).finish == "stop"
    going = TextSequence(0, Words(), sampling_config(ignore_eos=True), stop_ids={9})
    deltas = [going.add(token, last_step=index == 2) for index, token in enumerate((4, 9, 5))]
    assert [d.finish for d in deltas] == [None, None, "length"]
    assert "".join(d.text for d in deltas) == "4 5"


@pytest.mark.parametrize("setting, message", [
    ({"temperature": float("nan")}, "temperature: expected a value in \\[0, 2\\] \\(0: greedy\\), got nan"),
    ({"temperature": float("inf")}, "temperature: expected a value in \\[0, 2\\] \\(0: greedy\\), got inf"),
    ({"temperature": 2.5}, "temperature: expected a value in \\[0, 2\\] \\(0: greedy\\), got 2.5"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty: expected a value > 0, got nan"),
    ({"top_p": float("nan")}, "top_p: expected a value in \\(0, 1\\], got nan"),
    ({"top_p": 0.0}, "top_p: expected a value in \\(0, 1\\]"),
    ({"max_new_tokens": 1.5}, "max_new_tokens: expected an integer, got 1.5"),
    ({"max_new_tokens": float("inf")}, "max_new_tokens: expected an integer, got inf"),
    ({"max_new_tokens": True}, "max_new_tokens: expected an integer, got True"),
    ({"top_k": -1}, "top_k: expected an integer >= 0, got -1"),
    ({"seed": 2 ** 64}, "seed: expected an integer in \\[-9223372036854775808, 9223372036854775808\\)"),
    ({"seed": "7"}, "seed: expected an integer, got '7'"),
    ({"ignore_eos": "no"}, "ignore_eos: expected true or false, got 'no'"),
    ({"stop_strings": ["a", "b", "c", "d", "e"]}, "stop_strings: 5 given, at most 4 are matched"),
    ({"presence_penalty": 2.5}, "presence_penalty: expected a value in \\[-2, 2\\], got 2.5"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty: expected a value in \\[-2, 2\\], got nan"),
    ({"top_logprobs": 21}, "top_logprobs: expected an integer in \\[0, 21\\), got 21"),
    ({"grammar": Grammar("json_object"), "ignore_eos": True}, "ignore_eos: a grammar ends the answer"),
    ({"stop_strings": ["x" * 120000]}, "stop_strings: a string of 120000 characters, more than the limit of 256"),
])
def test_every_setting_the_sampler_cannot_use_is_refused_by_name(setting, message):
    with pytest.raises(ConfigError, match=message):
        sampling_config(**setting)


def test_a_negative_seed_samples_reproducibly():
    """OpenAI's seed is any 64-bit integer: a negative one is taken modulo 2^64."""
    from mindvl.engine.decode_loop import _generator

    assert _generator(-1).integers(1 << 30) == _generator(-1).integers(1 << 30) == \
        np.random.default_rng(2 ** 64 - 1).integers(1 << 30)


def naive_first_stop(text, strings):
    return min((text.find(s) for s in strings if s in text), default=None)


def test_the_stop_matcher_finds_what_a_search_of_the_whole_text_finds():
    """Fed a piece at a time, the earliest stop string completed is where a search of the text so far finds the
    first one, and the characters held back are the longest end of the text that starts one."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        strings = ["".join(rng.choice(list("ab"), rng.integers(1, 5))) for _ in range(rng.integers(1, 4))]
        text = "".join(rng.choice(list("abc"), rng.integers(0, 30)))
        matcher, fed = StopMatcher(strings), ""
        for start in range(0, len(text), 3):
            piece = text[start:start + 3]
            found = matcher.feed(piece)
            before = naive_first_stop(fed, strings)
            fed += piece
            if before is not None:
                break
            assert found == naive_first_stop(fed, strings), (strings, fed)
            if found is None:
                held = max((k for s in strings for k in range(1, len(s)) if fed.endswith(s[:k])), default=0)
                assert matcher.held == held, (strings, fed)


TOKENIZERS = Path(__file__).parents[1] / "references"


@pytest.mark.parametrize("folder", ["tiny_gemma3_text", "tiny_qwen2", "tiny_llama"])
def test_incremental_detokenisation_gives_what_decoding_the_whole_answer_gives(folder):
    """Deltas decoded a window at a time concatenate to the whole answer's decoding, multi-byte characters (split
    over byte tokens) included, and no delta holds half a character."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZERS / folder / "tokenizer.json"))
    text = "Der Kreis ist rot — 円は赤い 🟥, the  shape's  colour:\n  RED?! "
    tokens = tokenizer.encode(text, add_special_tokens=False).ids
    sequence = TextSequence(0, tokenizer, sampling_config(), stop_ids=set())
    deltas = [sequence.add(t, last_step=i == len(tokens) - 1).text for i, t in enumerate(tokens)]
    assert "".join(deltas) == tokenizer.decode(tokens, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


def test_a_stop_string_cuts_the_answer_and_what_may_start_one_is_held_back():
    class Letters:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    sequence = TextSequence(0, Letters(), sampling_config(stop_strings=["cab", "abd"]), stop_ids=set())
    deltas = [sequence.add(ord(c), last_step=False) for c in "xcacab"]
    # "c", "ca" (a start of "cab"), "a" (of "abd") are held until the text shows they start no stop string
    assert [d.text for d in deltas] == ["x", "", "", "ca", "", ""]
    assert [d.finish for d in deltas] == [None] * 5 + ["stop"]  # "cab" completes at the 6th character
    assert "".join(d.text for d in deltas) == "xca"  # cut before it
