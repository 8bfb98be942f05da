"""The host-side token choice: each setting against its definition on hand-made logits."""
import numpy as np

from mindvl.engine.sampling import SamplingConfig, next_tokens, penalise_repetition


def test_greedy_is_argmax():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]], np.float32)
    assert next_tokens(logits, SamplingConfig(), np.random.default_rng(0)).tolist() == [1, 0]


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = np.array([[2.0, -2.0, 1.0]])
    out = penalise_repetition(logits, np.array([[True, True, False]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


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
    from mindvl.engine.sampling import TextSequence, sampling_config

    class Words:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(i) for i in ids)

    stopping = TextSequence(0, Words(), sampling_config(), stop_ids={9})
    assert stopping.add(9, last_step=False).finish == "stop"
    going = TextSequence(0, Words(), sampling_config(ignore_eos=True), stop_ids={9})
    deltas = [going.add(token, last_step=index == 2) for index, token in enumerate((4, 9, 5))]
    assert [d.finish for d in deltas] == [None, None, "length"]
    assert "".join(d.text for d in deltas) == "4 5"
