"""Draft tokens from the text itself (prompt lookup, draft-free n-gram speculation): where the sequence's last
n tokens occurred before, the tokens that followed them then are guessed to follow now. Quoting, extracting and
rewriting answers repeat their prompt, so the guesses often hold; the engine verifies them in one several-token
decoder step (decode_loop.DecodeBatch), keeping exactly the tokens its sampler would have chosen anyway."""
import numpy as np

NGRAMS = (3, 2)  # the n-gram lengths matched, longest first: one token matched alone guesses wrong too often


def drafts(history: np.ndarray, count: int) -> np.ndarray:
    """Up to `count` tokens following the latest earlier occurrence of the history's last n tokens (the longest
    n of NGRAMS that occurs); empty when none does."""
    if count < 1:
        return history[:0]
    for n in NGRAMS:
        if len(history) <= n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(history[:-1], n)
        found = np.flatnonzero((windows == history[-n:]).all(1))
        if found.size:
            start = int(found[-1]) + n
            return history[start:start + count]
    return history[:0]
