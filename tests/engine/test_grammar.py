"""Structured output's mask (engine.grammar over llguidance) on the tiny Gemma 3 and Qwen2.5-VL references'
tokenizers: every token a grammar allows keeps the text inside it, random logits walked under a JSON schema
always give JSON that validates, a choice only its strings, and what cannot be compiled or spelled is refused by
name."""
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models

from mindvl.engine.grammar import Grammar, Grammars
from mindvl.engine.sampling import SamplingConfig, next_tokens
from mindvl.errors import ConfigError

REFERENCES = Path(__file__).resolve().parents[1] / "references"
SCHEMA = {"type": "object", "properties": {"shape": {"type": "string", "enum": ["circle", "square"]},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["shape", "count"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["tiny_qwen2_5_vl", "tiny_gemma3_text"])
def vocabulary(request):
    tokenizer = Tokenizer.from_file(str(REFERENCES / request.param / "tokenizer.json"))
    stop = next(t for t in (tokenizer.token_to_id(s) for s in ("<|im_end|>", "<eos>", "</s>")) if t is not None)
    return tokenizer, stop, Grammars(tokenizer, [stop])


def walk(vocabulary, grammar, seed, steps=80, temperature=1.0):
    """Random logits 8 wider than the tokenizer (a model's padded rows), sampled under the grammar's mask."""
    tokenizer, stop, grammars = vocabulary
    constraint = grammars.constraint(grammar)
    rng = np.random.default_rng(seed)
    tokens = []
    for _ in range(steps):
        logits = rng.standard_normal((1, grammars.vocab_size + 8)).astype(np.float32)
        allowed = constraint.allowed(logits.shape[-1])
        assert not allowed[grammars.vocab_size:].any() and allowed.any()
        token = int(next_tokens(np.where(allowed[None], logits, -np.inf), SamplingConfig(temperature=temperature),
                                rng)[0])
        constraint.consume(token)
        if token == stop:
            break
        tokens.append(token)
    return token == stop, tokenizer.decode(tokens)


def test_a_json_schema_walk_always_ends_in_json_that_validates(vocabulary):
    import jsonschema

    for seed in range(6):
        stopped, text = walk(vocabulary, Grammar("json_schema", SCHEMA), seed)
        assert stopped, text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_choice_and_a_regex_allow_only_their_texts(vocabulary):
    import re

    for seed in range(4):
        stopped, text = walk(vocabulary, Grammar("choice", ["yes", "no", "not sure"]), seed)
        assert stopped and text in ("yes", "no", "not sure")
        stopped, text = walk(vocabulary, Grammar("regex", "[0-9]{2}-[a-c]{1,3}"), seed)
        assert stopped and re.fullmatch("[0-9]{2}-[a-c]{1,3}", text), text


@pytest.mark.parametrize("grammar, message", [
    (Grammar("json_schema", {"$ref": "#/missing"}), "json_schema: cannot be compiled .*missing"),
    (Grammar("regex", "[0-9"), "regex: cannot be compiled .*unclosed character class"),
    (Grammar("choice", []), "choice: expected a non-empty list of non-empty strings"),
    (Grammar("json_schema", "{}"), "json_schema: expected a JSON schema"),
    (Grammar("lark", "start: x"), "grammar: unknown kind 'lark'"),
])
def test_what_cannot_be_compiled_is_refused_with_the_library_s_message(vocabulary, grammar, message):
    with pytest.raises(ConfigError, match=message):
        vocabulary[2].check(grammar)


def test_a_word_level_vocabulary_is_refused_by_name():
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "red": 1, "[EOS]": 2}, unk_token="[UNK]"))
    with pytest.raises(ConfigError, match="tokenizer cannot spell what a grammar may ask for"):
        Grammars(words, [2])
