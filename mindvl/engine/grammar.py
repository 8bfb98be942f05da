"""Structured output: what a sequence may say, as a grammar applied as a token mask in the one decode loop.

A `Grammar` names what the answer must be: JSON that validates against a JSON schema, any JSON object, text a
regular expression matches, or one of given strings (OpenAI's `response_format`, vLLM's guided_json / guided_regex
/ guided_choice). llguidance compiles it against the model's tokenizer (its tokenizer.json, byte-level BPE or
SentencePiece-style BPE with byte fallback) into a matcher per sequence: before each token is chosen, the matcher's
bitmask leaves only the tokens that keep the text inside the grammar (the end of turn only once the grammar is
complete), so a model never trained for JSON still writes JSON that parses. The mask comes first, before the
penalties, temperature and filters; the log-probabilities stay the model's own. A grammar the library cannot
compile is refused with its message before anything is generated.

Building the library's view of a vocabulary costs seconds for 262,144 tokens (Gemma 3), so a `Grammars` is made
once per tokenizer and kept (the decode batch holds one, built on first use).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from mindvl.errors import ConfigError, shown

KINDS = ("json_schema", "json_object", "regex", "choice")
# compact JSON: a model free to put whitespace anywhere can spend its whole budget on newlines
JSON_DEFAULTS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    """What the answer must be: kind (KINDS) and its value: a JSON schema (a dict), nothing (json_object), a
    regular expression (llguidance's syntax, Rust's regex) or a list of strings (choice)."""

    kind: str
    value: Any = None

    def validate(self) -> None:
        """ConfigError naming the grammar when its value is not of its kind's type."""
        if self.kind not in KINDS:
            raise ConfigError(f"grammar: unknown kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        expected = {"json_schema": (dict, "a JSON schema (an object)"), "regex": (str, "a regular expression"),
                    "choice": (list, "a non-empty list of strings")}.get(self.kind)
        if expected and not isinstance(self.value, expected[0]):
            raise ConfigError(f"{self.kind}: expected {expected[1]}, got {shown(self.value)}")
        if self.kind == "choice" and (not self.value or not all(isinstance(c, str) and c for c in self.value)):
            raise ConfigError(f"choice: expected a non-empty list of non-empty strings, got {shown(self.value)}")

    def source(self) -> str:
        """The grammar in llguidance's form."""
        from llguidance import LLMatcher

        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.value, defaults=JSON_DEFAULTS)
        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(choice) for choice in self.value))


class Constraint:
    """One sequence's matcher: `allowed()` the tokens that may come next, `consume(token)` after one is chosen."""

    def __init__(self, matcher, vocab_size: int) -> None:
        import llguidance.numpy as masks

        self.matcher, self.vocab_size = matcher, vocab_size
        self._fill = masks.fill_next_token_bitmask
        self.bitmask = masks.allocate_token_bitmask(1, vocab_size)

    def allowed(self, width: int) -> np.ndarray:
        """(width,) bool: the tokens that keep the text inside the grammar (a model's rows past its tokenizer's
        vocabulary never do)."""
        self._fill(self.matcher, self.bitmask)
        bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[:min(width, self.vocab_size)]
        allowed = np.zeros(width, bool)
        allowed[:len(bits)] = bits
        return allowed

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise ConfigError(f"grammar: token {token} was not allowed ({self.matcher.get_error()})")


class Grammars:
    """Grammars compiled against one tokenizer (a `tokenizers.Tokenizer`): `stop_ids` end an answer once its
    grammar is complete."""

    def __init__(self, tokenizer, stop_ids: Sequence[int]) -> None:
        from llguidance import LLTokenizer

        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        try:
            self.tokenizer = LLTokenizer(tokenizer.to_str(), n_vocab=self.vocab_size,
                                         eos_token=sorted(int(t) for t in stop_ids))
        except ValueError as error:  # a word-level vocabulary cannot spell arbitrary text
            raise ConfigError(f"grammar: this model's tokenizer cannot spell what a grammar may ask for (the grammar "
                              f"library: {_first_line(error)}); structured output needs a BPE tokenizer (byte-level, "
                              f"or SentencePiece-style with byte fallback), as every converted LLM has") from None

    def check(self, grammar: Grammar) -> None:
        """ConfigError with the library's message when the grammar cannot be compiled (a request's, before it
        joins the batch)."""
        from llguidance import LLMatcher

        problem = LLMatcher.validate_grammar(self._source(grammar), self.tokenizer)
        if problem:
            raise ConfigError(f"{grammar.kind}: cannot be compiled ({_first_line(problem)})")

    @staticmethod
    def _source(grammar: Grammar) -> str:
        grammar.validate()
        try:
            return grammar.source()
        except (ValueError, TypeError, RuntimeError) as error:
            raise ConfigError(f"{grammar.kind}: cannot be compiled ({_first_line(error)})") from None

    def constraint(self, grammar: Optional[Grammar]) -> Optional[Constraint]:
        """A fresh matcher for one sequence (None without a grammar): compiled once, its errors the library's."""
        if grammar is None:
            return None
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, self._source(grammar))
        if matcher.is_error():
            raise ConfigError(f"{grammar.kind}: cannot be compiled ({_first_line(matcher.get_error())})")
        return Constraint(matcher, self.vocab_size)


def _first_line(error: Any) -> str:
    """The library's message on one line: its lines joined, the caret lines that point into the source left out."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip(" ^|~\t")]
    return "; ".join(lines)[:400]
