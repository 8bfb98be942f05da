"""Prompt lookup's drafts (mindvl.engine.prompt_lookup): what followed the latest earlier occurrence of the last
n-gram, the longest n first, none without a match."""
import numpy as np

from mindvl.engine.prompt_lookup import drafts


def test_drafts_continue_the_latest_earlier_occurrence_of_the_last_ngram():
    history = np.array([1, 2, 3, 4, 5, 6, 9, 2, 3, 8, 7, 1, 2, 3], np.int32)
    # "2 3" last: its latest earlier occurrence (positions 7-8) is followed by 8 7 1 ...; but "1 2 3" (n = 3)
    # matches first, at 0-2, followed by 4 5 6
    assert drafts(history, 3).tolist() == [4, 5, 6]
    assert drafts(history, 20).tolist() == history[3:].tolist()
    assert drafts(np.array([5, 6, 7, 5, 6], np.int32), 4).tolist() == [7, 5, 6]  # n = 2
    assert drafts(np.array([1, 2, 3, 4], np.int32), 4).size == 0  # nothing repeats
    assert drafts(np.array([1, 2, 1, 3], np.int32), 4).size == 0  # one token alone is not matched
    assert drafts(history, 0).size == 0


def test_drafts_are_verified_only_while_what_they_add_pays_for_the_longer_call():
    from mindvl.engine.prompt_lookup import FIRST_EXPECTED, expected_after, worth_verifying

    assert worth_verifying(FIRST_EXPECTED, 1, 1.34)  # untried: verified
    assert not worth_verifying(0.5, 2, 1.34) and worth_verifying(0.5, 1, 1.34)  # every row pays for the call
    expected = FIRST_EXPECTED
    for _ in range(4):  # drafts that keep failing
        expected = expected_after(expected, 0)
    assert not worth_verifying(expected, 1, 1.85)
    for _ in range(3):  # its text starts repeating: unverified first drafts that were the next token
        expected = expected_after(expected, 1)
    assert worth_verifying(expected, 1, 1.34)
