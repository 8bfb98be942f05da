"""Draft tokens from the text itself (prompt lookup, draft-free n-gram speculation): where the sequence's last
n tokens occurred before, the tokens that followed them then are guessed to follow now. Quoting, extracting and
rewriting answers repeat their prompt, so the guesses often hold; the engine verifies them in one several-token
decoder step (decode_loop.DecodeBatch), keeping exactly the tokens its sampler would have chosen anyway.

That step costs more than a one-token step (measured on vlm-s's package: 1.34x, 1.85x with oneDNN held to AVX2),
so drafts that fail would make text that does not repeat slower. The engine verifies only when the tokens the
drafts are expected to add pay for it (`worth_verifying`): each sequence keeps a running mean of the drafted
tokens it accepted (`expected`), learning from its own text, and the engine times its calls of each kind."""
import numpy as np

NGRAMS = (3, 2)  # the n-gram lengths matched, longest first: one token matched alone guesses wrong too often
FIRST_EXPECTED = 2.0  # tokens a sequence's drafts are expected to add before it has tried any: worth a try
SMOOTHING = 0.3  # weight of the newest observation in a sequence's running mean


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


def expected_after(expected: float, accepted: float) -> float:
    """A sequence's running mean of the draft tokens a verification accepts, after one that accepted `accepted`
    (or, where its drafts went unverified, whether the first was the token sampled: 0 or 1)."""
    return (1 - SMOOTHING) * expected + SMOOTHING * accepted


def worth_verifying(expected_tokens: float, rows: int, cost_ratio: float) -> bool:
    """Whether a several-token step pays: it gives the `rows` tokens of a plain step plus the drafts' expected
    tokens for `cost_ratio` times a plain step's time."""
    return expected_tokens > (cost_ratio - 1.0) * rows
