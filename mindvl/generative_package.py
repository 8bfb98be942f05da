"""Generation over a model package's graphs, the one loop `mindvl export verify`, the server and the device run.

A generative package holds an `attachments` graph (image and audio -> projected tokens), a prefill graph per
prompt-length bucket (`prefill_<L>`) and ONE decode graph; the manifest's "generation" section says how they
fit (GenerationSpec). The graphs are called through a `run(name, inputs) -> outputs` function, so the same
loop drives GraphCells, Lite models or anything else that runs a graph, and `to_numpy` turns an output into
an array (caches stay as the runtime returned them between steps: no copy per step).

`DecodeBatch` holds the sequences generating together. Each writes its next token at its own cache slot, so
sequences join (a prefill, then their caches appended as rows) and leave (their rows dropped) between decode
steps: the server's continuous batching is this batch fed with requests as they come; verification and the
device feed it once. Each sequence samples with its own settings and its own seeded generator, so what a
request gets never depends on who it shares the batch with.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from mindvl.chat import ChatEncoder, chat_template
from mindvl.config import ConfigError
from mindvl.decoding import Generation, SamplingConfig, TextSequence, next_tokens, token_logprobs
from mindvl.prompting import MultimodalPrompt, PromptBatch, PromptLayout

SECTION = "generation"  # the manifest's key
ATTACHMENTS = "attachments"
DECODE = "decode"

Run = Callable[[str, Sequence[Any]], Sequence[Any]]


def prefill_name(bucket: int) -> str:
    return f"prefill_{bucket}"


@dataclass
class GenerationSpec:
    """What a generative package's graphs need to generate: the cache, the buckets, the decoder's shape, the
    chat template and the tokens that stop an answer; `max_new_tokens` bounds a request."""

    cache_len: int
    buckets: List[int]
    layers: int
    vocab_size: int
    width: int
    kv_width: int
    image_tokens: int
    audio_tokens: int
    pad_id: int
    stop_ids: List[int]
    chat_template: str
    max_new_tokens: int
    tokenizer: str = "tokenizer.json"
    defaults: Dict[str, Any] = field(default_factory=dict)  # SamplingConfig fields a request leaves out

    @classmethod
    def from_manifest(cls, manifest: dict) -> "GenerationSpec":
        section = manifest.get(SECTION)
        if not isinstance(section, dict):
            raise ConfigError(f"package {manifest.get('name')}: no {SECTION!r} section; not a generative package "
                              f"(export a generative run, e.g. vlm-tiny)")
        return cls(**section)

    def to_dict(self) -> dict:
        return asdict(self)

    def graph_names(self) -> List[str]:
        return [ATTACHMENTS, *(prefill_name(b) for b in self.buckets), DECODE]


def package_chat(folder: Path, spec: GenerationSpec) -> ChatEncoder:
    """The package's chat template over its tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(folder) / spec.tokenizer))
    return ChatEncoder(tokenizer, chat_template(spec.chat_template), spec.image_tokens, spec.audio_tokens,
                       spec.pad_id)


@dataclass
class Running:
    """One sequence while it generates: its text state, settings, sampler and where it is in the cache."""

    sequence: TextSequence
    settings: SamplingConfig
    rng: np.random.Generator
    seen: np.ndarray  # (vocab,) bool: the repetition penalty's tokens
    slot_valid: np.ndarray  # (cache_len,) bool
    slot: int  # the cache slot its next token is written to
    position: int  # that token's position (valid tokens before it)
    prompt_tokens: int
    logits: Optional[np.ndarray] = None  # (vocab,) the next token's, once prefill or a decode step gave them
    owner: Any = None  # whoever waits for its deltas (the server's request)
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.cancelled or self.sequence.finish is not None


class DecodeBatch:
    """The sequences generating together over one package's graphs (see the module docstring)."""

    def __init__(self, spec: GenerationSpec, layout: PromptLayout, run: Run, to_numpy: Callable[[Any], np.ndarray],
                 sizes: Sequence[int] = ()):
        """sizes: the batch sizes the graphs run at, rows padded up to the smallest that holds them (the padding
        rows compute, unread). A dynamic-batch graph compiles anew for every batch size it meets and keeps each
        compilation's working memory (vlm-s's decode graph: +0.2 GB at batch 2 ... +1.2 GB at 16; all 16 sizes
        of decode and prefill exhausted 24 GB), so a server runs a few; empty: the exact row count."""
        self.spec = spec
        self.layout = layout
        self.run = run
        self.to_numpy = to_numpy
        self.sizes = tuple(sorted(sizes))
        self.tokenizer = layout.chat.tokenizer
        self.rows: List[Running] = []
        self.caches: Optional[List[Any]] = None  # 2 x layers, each (padded rows, cache_len, kv_width)

    def padded(self, count: int) -> int:
        """The batch size `count` rows run at."""
        return next((size for size in self.sizes if size >= count), count)

    def _pad_rows(self, arrays: Sequence[np.ndarray], count: int) -> List[np.ndarray]:
        """Each array's first `count` rows, padded to padded(count) rows with repeats of its last row."""
        extra = self.padded(count) - count
        return [np.concatenate([a[:count], np.repeat(a[count - 1:count], extra, axis=0)]) if extra else a[:count]
                for a in arrays]

    def __len__(self) -> int:
        return len(self.rows)

    # ---- joining ------------------------------------------------------------------------------------

    def prefill(self, prompts: Sequence[MultimodalPrompt], settings: Sequence[SamplingConfig],
                owners: Optional[Sequence[Any]] = None) -> List[Running]:
        """Prefill `prompts` together (one bucket, the longest's) and add them to the batch; -> their rows."""
        longest_new = max(s.max_new_tokens for s in settings)
        prompts = list(prompts)
        batch = self.layout.batch(prompts + prompts[-1:] * (self.padded(len(prompts)) - len(prompts)), longest_new)
        outputs = self.run(prefill_name(batch.bucket), self.prefill_inputs(batch))
        logits = self.to_numpy(outputs[0])
        rows = []
        for index, (config, encoded) in enumerate(zip(settings, batch.encoded)):
            valid = np.zeros(self.spec.cache_len, bool)
            valid[:batch.bucket] = batch.valid[index]
            seen = np.zeros(self.spec.vocab_size, bool)
            seen[np.asarray(encoded, np.int64)] = True
            stop_ids = set(self.spec.stop_ids) | set(config.stop_tokens)
            rows.append(Running(TextSequence(0, self.tokenizer, config, stop_ids), config,
                                  np.random.default_rng(config.seed), seen, valid, batch.bucket,
                                  int(batch.valid[index].sum()), int(batch.valid[index].sum()), logits[index],
                                  owners[index] if owners is not None else None))
        self._append(rows, [self.to_numpy(c)[:len(rows)] for c in outputs[1:]])
        return rows

    def prefill_inputs(self, batch: PromptBatch) -> List[np.ndarray]:
        """A PromptBatch as its prefill graph's inputs; the attachments graph runs only when a prompt has one."""
        count = len(batch.ids)
        if batch.image.any() or batch.frame_mask.any():
            image_tokens, audio_tokens = (self.to_numpy(o) for o in self.run(ATTACHMENTS, [
                batch.image, batch.mel, batch.frame_mask]))
        else:
            image_tokens = np.zeros((count, self.spec.image_tokens, self.spec.width), np.float32)
            audio_tokens = np.zeros((count, self.spec.audio_tokens, self.spec.width), np.float32)
        return [batch.ids, batch.valid.astype(np.int32), batch.slot_index, image_tokens, audio_tokens]

    def _append(self, rows: List[Running], caches: List[np.ndarray]) -> None:
        if self.rows:
            caches = [np.concatenate([self.to_numpy(old)[:len(self.rows)], new])
                      for old, new in zip(self.caches, caches)]
        self.rows += rows
        self.caches = self._pad_rows(caches, len(self.rows))

    # ---- stepping -----------------------------------------------------------------------------------

    def sample(self) -> List[tuple]:
        """Choose every running sequence's next token from its logits -> [(row, Delta)]; rows that finished or
        were cancelled leave the batch (their cache rows freed)."""
        emitted = []
        for row in self.rows:
            if row.done:
                continue
            logits = row.logits[None]
            token = next_tokens(logits, row.settings, row.rng, row.seen[None])
            logprob = float(token_logprobs(logits, token)[0])
            token = int(token[0])
            row.seen[token] = True
            last = len(row.sequence.tokens) + 1 >= row.settings.max_new_tokens
            emitted.append((row, row.sequence.add(token, last, logprob)))
        self.drop_done()
        return emitted

    def drop_done(self) -> None:
        keep = [i for i, row in enumerate(self.rows) if not row.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self.caches = None if not keep else self._pad_rows([self.to_numpy(c)[keep] for c in self.caches], len(keep))

    def decode(self) -> None:
        """One decode step of every row: its last token in, its next logits out."""
        if not self.rows:
            return
        token = np.array([[row.sequence.tokens[-1]] for row in self.rows], np.int32)
        position = np.array([[row.position] for row in self.rows], np.int32)
        slot = np.array([[row.slot] for row in self.rows], np.int32)
        for row in self.rows:
            row.slot_valid[row.slot] = True
        slot_valid = np.stack([row.slot_valid for row in self.rows]).astype(np.int32)
        steps = self._pad_rows([token, position, slot, slot_valid], len(self.rows))
        outputs = self.run(DECODE, [*steps, *self.caches])
        logits = self.to_numpy(outputs[0])
        self.caches = list(outputs[1:])
        for index, row in enumerate(self.rows):
            row.logits = logits[index]
            row.slot += 1
            row.position += 1


def generate(spec: GenerationSpec, layout: PromptLayout, run: Run, to_numpy: Callable[[Any], np.ndarray],
             prompts: Sequence[MultimodalPrompt], settings: SamplingConfig,
             sizes: Sequence[int] = ()) -> List[Generation]:
    """Every prompt's generation, the prompts prefilled and decoded together (verification, evaluation, the
    device); `sizes`: DecodeBatch's."""
    batch = DecodeBatch(spec, layout, run, to_numpy, sizes)
    rows = batch.prefill(prompts, [settings] * len(prompts), owners=list(range(len(prompts))))
    results = [Generation("", prompt_tokens=row.prompt_tokens) for row in rows]
    while batch.rows:
        for row, delta in batch.sample():
            results[row.owner].add(delta)
        batch.decode()
    return results
