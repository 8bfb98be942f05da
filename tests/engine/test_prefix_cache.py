"""The prefix cache's keys and bookkeeping (mindvl.engine.prefix_cache): what two prompts share, attachments
told apart by their digest, entries continued by a longer prompt dropped, the least recently used evicted."""
import numpy as np

from mindvl.engine.prefix_cache import MIN_REUSED, PrefixCache, PromptKey
from mindvl.engine.prompts import PromptBatch


def key(tokens, slots=(), digest=b"a"):
    tokens = np.asarray(tokens, np.int32)
    mask = np.zeros(len(tokens), bool)
    mask[list(slots)] = True
    return PromptKey(tokens, mask, digest, np.arange(len(tokens), dtype=np.int32))


def rows(length, layers=2, width=4, fill=1.0):
    return [np.full((length, width), fill + i, np.float32) for i in range(2 * layers)]


def test_prompts_share_their_common_tokens_and_the_slots_only_with_the_same_attachments():
    base = list(range(20))
    assert key(base).shared(key(base[:12] + [99] * 8)) == 12
    with_image = key(base, slots=range(4, 8), digest=b"cat")
    assert with_image.shared(key(base, slots=range(4, 8), digest=b"cat")) == 20
    assert with_image.shared(key(base, slots=range(4, 8), digest=b"dog")) == 4  # the text before the image
    assert with_image.shared(key(base)) == 4  # a slot where the other has text


def test_a_prompt_batch_row_is_keyed_by_its_valid_tokens_slots_and_attachments():
    ids = np.array([[0, 0, 5, 3, 3, 7]], np.int32)
    valid = np.array([[False, False, True, True, True, True]])
    slot_index = np.array([[9, 9, 9, 0, 1, 9]], np.int32)  # 9: text (the zero row), 0 and 1: the image's tokens
    image = np.ones((1, 3, 2, 2), np.float32)
    first = PromptKey.of(PromptBatch(ids, valid, [], slot_index, image, np.zeros((1, 2, 2), np.float32),
                                     np.zeros((1, 2), np.float32)))
    assert first.tokens.tolist() == [5, 3, 3, 7] and first.slots.tolist() == [False, True, True, False]
    assert first.positions.tolist() == [0, 1, 2, 3]
    other = PromptKey.of(PromptBatch(ids, valid, [], slot_index, image * 2, np.zeros((1, 2, 2), np.float32),
                                     np.zeros((1, 2), np.float32)))
    assert first.digest != other.digest and first.shared(other) == 1


def test_lookup_gives_the_longest_shared_prefix_leaving_the_last_token_to_compute():
    cache = PrefixCache(1 << 20)
    cache.add(key(range(30)), rows(30))
    cache.add(key(list(range(10)) + [50] * 20), rows(30, fill=5.0))
    entry, reused = cache.lookup(key(list(range(25)) + [7, 7]))
    assert reused == 25 and entry.rows[0][0, 0] == 1.0
    entry, reused = cache.lookup(key(range(30)))  # the same prompt: all but its last token
    assert reused == 29
    assert cache.lookup(key([1] + list(range(1, 30)))) is None  # shares nothing
    assert cache.lookup(key(list(range(MIN_REUSED - 1)) + [99] * 5)) is None  # too little to reuse
    assert cache.lookup(key(list(range(20)) + [3, 4], slots=[21])) is None  # a new image after the shared text
    assert (cache.hits, cache.misses, cache.reused_tokens) == (2, 3, 54)


def test_a_continued_prompt_replaces_its_prefix_and_the_least_recently_used_go_first():
    one = rows(20)[0].nbytes * 4  # an entry of 20 tokens
    cache = PrefixCache(3 * one)
    cache.add(key(range(20)), rows(20))
    cache.add(key(range(10)), rows(10))
    cache.add(key(range(20)), rows(20))  # the same prompt again: one entry
    assert len(cache.entries) == 1  # the 10-token prompt is a prefix of the 20-token one
    cache.add(key([5] * 20), rows(20))
    cache.add(key([6] * 20), rows(20))
    cache.lookup(key(range(20)))  # used: the [5] * 20 entry is now the oldest
    cache.add(key([7] * 20), rows(20))
    assert [e.key.tokens[0] for e in cache.entries.values()] == [6, 0, 7] and cache.size == 3 * one
    cache.add(key(range(200)), rows(200))  # larger than the whole cache: not kept
    assert len(cache.entries) == 3
