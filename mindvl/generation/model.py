"""A converted LLM folder as a model that generates: `LanguageModel.generate` and `.stream`.

Generation runs two kinds of graph over one set of weights (cells.decoder): a prefill per prompt-length
bucket (16, 24, 32, 48, 64, ... tokens; a batch is left-padded to the smallest bucket that holds its longest
prompt) and ONE decode graph for every step of every call of a given batch size, its cache slot and
positions tensors rather than constants. Each sequence of a batch is masked, positioned and stopped on its
own, so a prompt gives the same tokens in a batch as alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Sequence, Union

import numpy as np

from mindvl.config import ConfigError
from mindvl.decoding import (Delta, Generation, SamplingConfig, TextSequence, next_tokens, sampling_config,
                             token_logprobs)
from mindvl.pretrained.llm import FORMAT, TOKENIZER_FILE, load_llm_weights, read_llm_config
from mindvl.prompting import SMALLEST_BUCKET, choose_bucket, prompt_buckets


GENERATION_KERNELS = ("fused", "standard")  # LanguageModel(kernels=...): see its docstring


def check_kernels(kernels: str) -> None:
    if kernels not in GENERATION_KERNELS:
        raise ConfigError(f"kernels: expected one of {list(GENERATION_KERNELS)}, got {kernels!r}")


class LanguageModel:
    """A converted decoder (mindvl convert llm) with its tokenizer, ready to generate.

    cache_len: the key/value cache's length, the most prompt + new tokens one call holds (a bigger cache
    costs memory and a little time per step: layers * batch * cache_len * kv_width * 8 bytes).
    kernels: "fused" runs RMSNorm and the rotary rotation as mindvl's CPU kernels (one pass each instead of
    five or six MindSpore kernels: 2x faster alone at every prefill and decode shape timed) and the LM head
    as one sgemm per worker over its share of the vocabulary: decode ~25% faster on Gemma 3 270M, the same
    tokens (docs/llm.md). "standard" keeps MindSpore's operators. The blocks' products stay MindSpore's
    here: at one token a step they are no faster as the kernels' sgemm."""

    def __init__(self, folder: Union[str, Path], cache_len: int = 1024, kernels: str = "fused"):
        import mindspore as ms
        from mindspore.nn.utils import no_init_parameters
        from tokenizers import Tokenizer

        from mindvl.cells.decoder import CausalLM

        self.folder = Path(folder)
        self.config, self.cfg = read_llm_config(self.folder)
        check_kernels(kernels)  # before the weights load
        if cache_len <= SMALLEST_BUCKET:
            raise ConfigError(f"cache_len: expected more than {SMALLEST_BUCKET} tokens, got {cache_len}")
        self.cache_len = min(cache_len, self.cfg.max_positions)
        self.tokens = self.config["tokens"]
        self.stop_ids = {int(t) for t in self.tokens.get("stop") or [] if t is not None}
        self.pad_id = int(self.tokens.get("pad") if self.tokens.get("pad") is not None else 0)
        self.tokenizer = Tokenizer.from_file(str(self.folder / TOKENIZER_FILE))
        ms.set_context(mode=ms.GRAPH_MODE)
        with no_init_parameters():  # no random weights drawn only to be replaced (1 GB at Gemma 3 270M)
            lm = CausalLM(self.cfg, self.cache_len)
        load_llm_weights(self.folder, lm)
        self._ready(lm, kernels)

    def _ready(self, lm, kernels: str) -> None:
        """The graphs over `lm` (a CausalLM whose cache_len is this model's), its kernels chosen."""
        from mindvl.cells.decoder import Decode, Prefill
        from mindvl.cells.kernels import use_kernels
        from mindvl.cells.kernels.cpu import FusedHeadMatMul, FusedRMSNorm, FusedRotateHalf

        check_kernels(kernels)
        self.lm = lm
        lm.set_train(False)
        use_kernels(lm, kernels, only=(FusedRMSNorm, FusedRotateHalf, FusedHeadMatMul))
        self.prefill_graph = Prefill(lm)
        self.decode_graph = Decode(lm)
        self.buckets = prompt_buckets(self.cache_len)

    # ------------------------------------------------------------------ tokens

    def encode(self, text: str) -> List[int]:
        """The prompt's ids as the model was trained to read them (BOS first where the tokenizer adds it)."""
        return self.tokenizer.encode(text).ids

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @staticmethod
    def is_single(prompts) -> bool:
        """One prompt (a Generation back) rather than a list of them."""
        return isinstance(prompts, str)

    def prompt_length(self, prompt) -> int:
        return len(self.encode(prompt))

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Every position's logits (seq, vocab) of one sequence (parity checks, scoring)."""
        from mindspore import Tensor

        ids = np.asarray(ids, np.int32)[None]
        return self.lm(Tensor(ids), Tensor(np.ones_like(ids, bool))).asnumpy()[0]

    # ------------------------------------------------------------------ generation

    def settings(self, **overrides) -> SamplingConfig:
        return sampling_config(**overrides)

    def _bucket(self, longest: int, max_new_tokens: int) -> int:
        return choose_bucket(self.buckets, self.cache_len, longest, max_new_tokens)

    def stream(self, prompts: Union[str, Sequence[str]], **settings) -> Iterator[Delta]:
        """Deltas as tokens are chosen, step by step, for every sequence still running."""
        from mindspore import Tensor

        config = self.settings(**settings)
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ConfigError("generate: no prompt given")
        encoded = [self.encode(p) for p in prompts]
        if any(not ids for ids in encoded):
            raise ConfigError("generate: an empty prompt (no tokens); give some text")
        batch, longest = len(encoded), max(len(ids) for ids in encoded)
        bucket = self._bucket(longest, config.max_new_tokens)
        ids = np.full((batch, bucket), self.pad_id, np.int32)
        valid = np.zeros((batch, bucket), bool)
        for row, sequence in enumerate(encoded):  # left padding: every sequence ends at slot bucket - 1
            ids[row, bucket - len(sequence):] = sequence
            valid[row, bucket - len(sequence):] = True
        logits, cache_k, cache_v = self.prefill_graph(Tensor(ids), Tensor(valid))
        yield from self.continue_from(logits, cache_k, cache_v, valid, encoded, config)

    def continue_from(self, logits, cache_k, cache_v, valid: np.ndarray, encoded: Sequence[Sequence[int]],
                      config: SamplingConfig) -> Iterator[Delta]:
        """The decode loop after a prefill (of token ids here, of a multimodal prompt's embeddings in
        mindvl.generation.multimodal): its last logits and caches, the left-padded prompts' valid slots
        (batch, bucket) and their ids (the repetition penalty's "seen" tokens)."""
        from mindspore import Tensor

        batch, bucket = valid.shape
        stop_ids = self.stop_ids | set(config.stop_tokens)
        sequences = [TextSequence(i, self.tokenizer, config, stop_ids) for i in range(batch)]
        seen = np.zeros((batch, self.cfg.vocab_size), bool)
        for row, sequence in enumerate(encoded):
            seen[row, np.asarray(sequence, np.int64)] = True
        rng = np.random.default_rng(config.seed)
        slot_valid = np.zeros((batch, self.cache_len), bool)
        slot_valid[:, :bucket] = valid
        positions = valid.sum(axis=1).astype(np.int32)
        for step in range(config.max_new_tokens):
            step_logits = logits.asnumpy()
            chosen = next_tokens(step_logits, config, rng, seen)
            logprobs = token_logprobs(step_logits, chosen)
            last = step == config.max_new_tokens - 1
            for sequence, token, logprob in zip(sequences, chosen, logprobs):
                if sequence.finish is None:
                    seen[sequence.index, token] = True
                    yield sequence.add(int(token), last, logprob)
            if all(s.finish for s in sequences):
                return
            chosen = np.where([s.finish is None for s in sequences], chosen, self.pad_id).astype(np.int32)
            slot = bucket + step
            slot_valid[:, slot] = True
            logits, cache_k, cache_v = self.decode_graph(
                Tensor(chosen[:, None]), Tensor(positions[:, None]), Tensor(np.full((batch, 1), slot, np.int32)),
                Tensor(slot_valid), *cache_k, *cache_v)
            positions += 1

    def generate(self, prompts: Union[str, Sequence[str]], **settings) -> Union[Generation, List[Generation]]:
        """The finished generation of each prompt (one Generation for a string, a list for a list)."""
        single = self.is_single(prompts)
        batch = [prompts] if single else list(prompts)
        results = [Generation("", prompt_tokens=self.prompt_length(p)) for p in batch]
        for delta in self.stream(batch, **settings):
            results[delta.index].add(delta)
        return results[0] if single else results


def from_pretrained(folder: Union[str, Path], cache_len: int = 1024, kernels: str = "fused") -> LanguageModel:
    """A converted LLM folder as a LanguageModel."""
    return LanguageModel(folder, cache_len, kernels)


def is_llm_folder(folder: Union[str, Path]) -> bool:
    """A folder `mindvl convert llm` wrote (its config.json says so)."""
    import json

    config = Path(folder) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False
