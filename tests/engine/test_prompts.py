"""The limits every generation keeps, checked in one place (GenerationLimits) with one message each, and text
prompts given as text or as token ids."""
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from mindvl.engine.prompts import GenerationLimits, TextLayout, prompt_buckets
from mindvl.errors import ConfigError

TOKENIZER = Path(__file__).parents[1] / "references" / "tiny_gemma3_text" / "tokenizer.json"


def test_one_message_per_limit_naming_the_field_the_caller_used():
    limits = GenerationLimits.for_cache(64, max_new_tokens=20)
    assert limits.buckets == prompt_buckets(64) == (16, 24, 32, 48)
    for field in ("max_tokens", "max_new_tokens"):
        with pytest.raises(ConfigError, match=f"^{field}: 21 asked, this model generates at most 20 tokens per request"):
            limits.check_new_tokens(21, field)
    limits.check_new_tokens(20)
    assert limits.bucket(17, 20) == 24
    with pytest.raises(ConfigError, match=r"a prompt of 40 tokens \(bucket 48\) \+ max_new_tokens=20 exceed the cache of "
                                          r"64 tokens; lower max_new_tokens \(at most 16 here\)"):
        limits.bucket(40, 20)
    with pytest.raises(ConfigError, match=r"a prompt of 50 tokens is longer than the largest bucket \(48\)"):
        limits.bucket(50, 1)
    GenerationLimits.for_cache(64).check_new_tokens(10 ** 6)  # no ceiling: the cache's room decides
    with pytest.raises(ConfigError, match="cache_len: expected more than 16 tokens, got 16"):
        GenerationLimits.for_cache(16)


def test_text_prompts_are_text_or_token_ids_left_padded_to_one_bucket():
    layout = TextLayout(Tokenizer.from_file(str(TOKENIZER)), GenerationLimits.for_cache(64), vocab_size=512, pad_id=0)
    ids = layout.encode("the cat")
    assert layout.is_single("the cat") and layout.is_single(list(ids)) and layout.is_single(np.asarray(ids))
    assert not layout.is_single(["the cat", "a dog"]) and not layout.is_single([list(ids), list(ids)])
    batch = layout.batch([list(ids), "a red circle and a blue square"], max_new_tokens=8)
    assert batch.ids.shape == (2, 16) and not batch.multimodal
    assert batch.ids[0, 16 - len(ids):].tolist() == ids.tolist() and batch.valid[0].sum() == len(ids)
    with pytest.raises(ConfigError, match=r"token ids must lie in \[0, 512\)"):
        layout.encode([3, 512])
    with pytest.raises(ConfigError, match="a prompt is text or a sequence of token ids"):
        layout.encode(np.zeros((2, 3), np.int32))
    with pytest.raises(ConfigError, match="an empty prompt"):
        layout.encode([])
    with pytest.raises(ConfigError, match="no prompt given"):
        layout.batch([], 4)
