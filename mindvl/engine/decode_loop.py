"""The decode loop, once, for every runtime: `DecodeBatch` holds the sequences generating together.

Prefill, join, step, sample, stop, leave: every generation of mindvl runs here, over whatever runs its
graphs (the `graphs` object):

    graphs.prefill(batch: PromptBatch) -> (last logits (rows, vocab) array, caches)
    graphs.decode(token, position, slot, slot_valid, caches) -> (logits (rows * steps, vocab) array, caches,
                                  or the step's new key and value rows (rows, steps, kv_width) that the engine
                                  writes at their slots: a wide step's, cells.decoder.CausalLM.decode's `beside`)
                                  (token, position, slot (rows, steps): steps 1, or graphs.extend_steps)
    graphs.to_numpy(output) -> array

mindvl.generation's CellGraphs are the framework's cells (LanguageModel, MultimodalGenerator);
engine.package_graphs.PackageGraphs are a model package's graphs called by name (the server's continuous
batching, `export verify` and evaluate, the device pipeline). Prompts are laid out by the layout
(engine.prompts: TextLayout or PromptLayout), whose GenerationLimits refuse what the graphs cannot hold.

Each sequence writes its next token at its own cache slot, so sequences join (a prefill, then its cache
rows written into a free row of the batch's caches) and leave (their row marked free) between decode steps: the
server's continuous batching is this batch fed with requests as they come; `generate` and `stream` feed it once.
Joining and leaving copy a row, not the batch (at 16 rows of a 768-slot cache, concatenating vlm-s's 36 cache
arrays took 1.05 s a join): the caches grow to the next batch size when no row is free, and shrink to a smaller
one (the running rows packed) only once the rows have fitted it for SHRINK_AFTER steps, since free rows still
compute. Each sequence samples with
its own settings and its own seeded generator, so what a request gets never depends on who it shares the
batch with.

Graphs that take several tokens a step (`graphs.extend_steps` > 0: decode with tokens (rows, steps)) give two
savings, both off unless asked for: a PrefixCache (engine.prefix_cache) prefills a prompt that starts like an
earlier one from its first new token, and `speculative_tokens` verifies that many prompt-lookup drafts
(engine.prompt_lookup) in one step. Either way each token is still sampled from the logits of exactly the tokens
before it, so the tokens are the ones the plain loop would choose.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.engine.grammar import Constraint, Grammars
from mindvl.engine.prefix_cache import PrefixCache, PromptKey
from mindvl.engine.prompt_lookup import FIRST_EXPECTED, drafts, expected_after, worth_verifying
from mindvl.engine.sampling import (Delta, Generation, SamplingConfig, TextSequence, next_tokens, token_logprobs,
                                   top_logprobs)
from mindvl.errors import ConfigError, MindvlError

SHRINK_AFTER = 4  # decode steps the rows fit a smaller batch size before the caches are packed into it (one copy
# of the running rows for a smaller step each time after; a row that joins soon after a leave takes the free row)


@dataclass
class Running:
    """One sequence while it generates: its text state, settings, sampler and where it is in the cache."""

    sequence: TextSequence
    settings: SamplingConfig
    rng: np.random.Generator
    seen: np.ndarray  # (vocab,) bool: the repetition penalty's tokens
    counts: Optional[np.ndarray]  # (vocab,) int32: each token's count in the answer (presence/frequency penalties)
    slot_valid: np.ndarray  # (cache_len,) bool
    slot: int  # the cache slot its next token is written to
    position: int  # that token's position (valid tokens before it)
    prompt_tokens: int
    logits: Optional[np.ndarray] = None  # (vocab,) the next token's, once prefill or a decode step gave them
    owner: Any = None  # whoever waits for its deltas (the server's request, a prompt's index)
    cancelled: bool = False
    dropped: int = 0  # its conversation's oldest turns left out to fit (the layout's fit)
    constraint: Optional[Constraint] = None  # its grammar's matcher (engine.grammar), when its settings have one
    context: Optional[np.ndarray] = None  # the prompt's text ids (prompt lookup's drafts come from them)
    drafted: List[int] = field(default_factory=list)  # tokens a several-token step verified, not yet sampled
    pending: List[np.ndarray] = field(default_factory=list)  # the logits after each of them
    expected: float = FIRST_EXPECTED  # draft tokens a verification of its drafts is expected to add (prompt_lookup)
    unverified: int = -1  # the first of its drafts this step did not verify (-1: none): was it the next token?
    place: int = -1  # its row in the batch's caches (DecodeBatch._place)

    @property
    def done(self) -> bool:
        return self.cancelled or self.sequence.finish is not None


class DecodeBatch:
    """The sequences generating together over one set of graphs (see the module docstring)."""

    def __init__(self, layout, graphs, sizes: Sequence[int] = (), prefixes: Optional[PrefixCache] = None,
                 speculative_tokens: int = 0):
        """layout: the prompts' (engine.prompts), with the limits and the ids that stop an answer; graphs: see
        the module docstring. sizes: the batch sizes the graphs run at, rows padded up to the smallest that
        holds them (the padding rows compute, unread). A dynamic-batch graph compiles anew for every batch size
        it meets and keeps each compilation's working memory (vlm-s's decode graph: +0.2 GB at batch 2 ... +1.2
        GB at 16; all 16 sizes of decode and prefill exhausted 24 GB), so a server runs a few; a framework
        graph compiled for one batch keeps that one; empty: the exact row count. prefixes, speculative_tokens:
        see the module docstring (the graphs' extend_steps must hold speculative_tokens + 1)."""
        steps = getattr(graphs, "extend_steps", 0)
        if (prefixes is not None or speculative_tokens) and not steps:
            raise ConfigError("prefix caching and speculative decoding need the decoder's several-token step, which "
                              "these graphs lack (a package exported before it: export it again)")
        if speculative_tokens and not 0 < speculative_tokens < steps:
            raise ConfigError(f"speculative_tokens: expected 1..{steps - 1} (the decoder's several-token step takes "
                              f"{steps} tokens: the last one and the drafts), got {speculative_tokens}")
        self.prefixes = prefixes
        self.speculative_tokens = int(speculative_tokens)
        self.drafted = self.accepted = 0  # draft tokens verified, and of those the ones sampled anyway
        self.call_ms: dict = {}  # (padded rows, steps) -> running mean of a decoder call's milliseconds (None:
        # called once, untimed)
        self.layout = layout
        self.graphs = graphs
        self.sizes = tuple(sorted(sizes))
        self.rows: List[Running] = []
        self.caches: Optional[List[Any]] = None  # 2 x layers, each (capacity, cache_len, kv_width): a row a place
        self._fitted = 0  # consecutive steps the running rows fitted a smaller batch size
        self._grammars: Optional[Grammars] = None

    def grammars(self) -> Grammars:
        """The grammars of this layout's tokenizer (built on first use: seconds for a large vocabulary)."""
        if self._grammars is None:
            self._grammars = Grammars(self.layout.tokenizer, self.layout.stop_ids)
        return self._grammars

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

    @property
    def capacity(self) -> int:
        """The caches' rows (a batch size): the running rows' places and free ones."""
        return 0 if self.caches is None else int(self.caches[0].shape[0])

    # ---- joining ------------------------------------------------------------------------------------

    def admit(self, prompts: Sequence, settings: Sequence[SamplingConfig], field: str = "max_new_tokens") -> List[int]:
        """Each prompt's token count, or ConfigError when the graphs cannot generate it (the layout's limits:
        largest bucket, cache room, the new-token ceiling; `field` names the setting in the message)."""
        if not prompts:
            raise ConfigError("generate: no prompt given")
        _, encoded = self.layout.admit(prompts, max(s.max_new_tokens for s in settings), field)
        for config in settings:
            if config.grammar is not None:
                self.grammars().check(config.grammar)
        return [len(e) for e in encoded]

    def together(self, prompts: Sequence, settings: Sequence[SamplingConfig], tokens: int) -> int:
        """How many of `prompts` (fitted, in order; the first always) prefill in one call within `tokens` prompt
        tokens (the bucket times the padded rows): those of the first's bucket whose attachments fit one call
        (the layout's packs). With a PrefixCache, one: a prompt prefilled with others reuses no prefix."""
        first, count = self._bucket(prompts[0], settings[0]), 1
        while first and count < len(prompts) and self.prefixes is None:
            group = prompts[:count + 1]
            rows = self.padded(len(group))
            if rows * first > tokens or self._bucket(group[-1], settings[count]) != first \
                    or not self.layout.packs(group + group[-1:] * (rows - len(group))):
                break
            count += 1
        return count

    def _bucket(self, prompt, config: SamplingConfig) -> int:
        """The prompt's bucket (0 when the layout refuses it: its prefill says why, alone)."""
        try:
            return self.layout.admit([prompt], config.max_new_tokens)[0]
        except MindvlError:
            return 0

    def prefill(self, prompts: Sequence, settings: Sequence[SamplingConfig],
                owners: Optional[Sequence[Any]] = None) -> List[Running]:
        """Prefill `prompts` together (one bucket, the longest's) and add them to the batch; -> their rows. Each
        is fitted first (a conversation's oldest turns left out as its new tokens need, the layout's fit); the
        layout refuses what the graphs cannot generate (ConfigError) before any graph runs. With a PrefixCache,
        a single prompt that starts like a cached one is extended from there instead."""
        if not prompts:
            raise ConfigError("generate: no prompt given")
        prompts = [self.layout.fit(prompt, config.max_new_tokens) for prompt, config in zip(prompts, settings)]
        owners = list(owners) if owners is not None else list(range(len(prompts)))
        single = None
        if self.prefixes is not None and len(prompts) == 1:
            single = self.layout.batch(prompts, settings[0].max_new_tokens)
            key = PromptKey.of(single)
            hit = self.prefixes.lookup(key)
            if hit is not None:
                return self._extend_prefix(prompts[0], settings[0], owners[0], single, key, *hit)
        extra = self.padded(len(prompts)) - len(prompts)
        batch = single if single is not None and not extra else \
            self.layout.batch(prompts + prompts[-1:] * extra, max(s.max_new_tokens for s in settings))
        logits, caches = self.graphs.prefill(batch)
        cache_len, bucket = self.layout.limits.cache_len, batch.ids.shape[1]
        rows = []
        for index, config in enumerate(settings):
            valid = np.zeros(cache_len, bool)
            valid[:bucket] = batch.valid[index]
            length = int(batch.valid[index].sum())
            position = length + (int(batch.deltas[index]) if batch.deltas is not None else 0)  # M-RoPE's delta
            rows.append(self._running(index, config, batch.encoded[index], valid, bucket, position, length,
                                      logits[index], owners[index], prompts[index]))
        caches = [self.graphs.to_numpy(c)[:len(rows)] for c in caches]
        if self.prefixes is not None:
            for index, row in enumerate(rows):
                self.prefixes.add(PromptKey.of(batch, index),
                                  [c[index, bucket - row.prompt_tokens:bucket] for c in caches])
        self._place(rows, caches)
        return rows

    def _running(self, index: int, config: SamplingConfig, encoded, valid: np.ndarray, slot: int, position: int,
                 length: int, logits: np.ndarray, owner, prompt) -> Running:
        """A prefilled prompt's row: its next token goes to `slot`, at `position`."""
        vocab = logits.shape[-1]
        seen = np.zeros(vocab, bool)
        seen[np.asarray(encoded, np.int64)] = True
        counts = np.zeros(vocab, np.int32) if config.presence_penalty or config.frequency_penalty else None
        stop_ids = set(self.layout.stop_ids) | set(config.stop_tokens)
        return Running(TextSequence(index, self.layout.tokenizer, config, stop_ids), config, _generator(config.seed),
                       seen, counts, valid, slot, position, length, logits, owner,
                       dropped=getattr(prompt, "dropped", 0),
                       constraint=self.grammars().constraint(config.grammar) if config.grammar else None,
                       context=np.asarray(encoded, np.int32))

    def _extend_prefix(self, prompt, config: SamplingConfig, owner, batch, key: PromptKey, entry, reused: int
                       ) -> List[Running]:
        """Prefill one prompt from `reused` tokens of a cached prefix: its rows copied into a fresh cache row
        (the prompt at slot 0 on), the rest fed through the several-token step."""
        limits, steps = self.layout.limits, self.graphs.extend_steps
        length = len(key.tokens)
        caches = []
        for rows in entry.rows:
            cache = np.zeros((1, limits.cache_len, rows.shape[-1]), np.float32)
            cache[0, :reused] = rows[:reused]
            caches.append(cache)
        caches = self._pad_rows(caches, 1)
        valid = np.zeros(limits.cache_len, bool)
        valid[:reused] = True
        for start in range(reused, length, steps):
            count = min(steps, length - start)
            pad = steps - count  # the last chunk's unused steps: later slots, never marked valid
            tokens = np.concatenate([key.tokens[start:start + count], np.repeat(key.tokens[length - 1], pad)])
            positions = np.concatenate([key.positions[start:start + count],
                                        key.positions[length - 1] + 1 + np.arange(pad)]).astype(np.int32)
            slots = np.arange(start, start + steps, dtype=np.int32)
            valid[start:start + count] = True
            logits, caches = self._decode_rows([tokens[None].astype(np.int32), positions[None], slots[None],
                                                valid[None]], caches, 1)
        row = self._running(0, config, batch.encoded[0], valid, length, int(key.positions[-1]) + 1, length,
                            logits[0, count - 1], owner, prompt)
        caches = [self.graphs.to_numpy(c)[:1] for c in caches]
        self.prefixes.add(key, [c[0, :length] for c in caches])
        self._place([row], caches)
        return [row]

    def _decode_rows(self, inputs: List[np.ndarray], caches, count: int) -> Tuple[np.ndarray, List[Any]]:
        """The decoder's step over `count` rows (token, position, slot, slot_valid: padded to the batch size
        here) -> (logits (count, steps, vocab), the caches)."""
        token, position, slot, slot_valid = self._pad_rows(inputs, count)
        start = time.perf_counter()
        logits, outputs = self.graphs.decode(token, position, slot, slot_valid, caches)
        caches = self._written(caches, outputs, slot)
        shape, spent = token.shape, (time.perf_counter() - start) * 1000
        if shape not in self.call_ms:  # a shape's first call may compile its graph: not timed
            self.call_ms[shape] = None
        else:
            self.call_ms[shape] = spent if self.call_ms[shape] is None else 0.8 * self.call_ms[shape] + 0.2 * spent
        return logits.reshape(len(token), token.shape[1], -1)[:count], caches

    def _written(self, caches: Sequence[Any], outputs: Sequence[Any], slot: np.ndarray) -> List[Any]:
        """The caches after a step: the graph's outputs when they are caches, else (its new key and value rows,
        (rows, steps, kv_width)) the caches given with those rows written at each row's slots, in place."""
        if self.graphs.to_numpy(outputs[0]).shape[1] == self.layout.limits.cache_len:
            return list(outputs)
        arrays = [self.graphs.to_numpy(c) for c in caches]
        rows = np.arange(len(slot))[:, None]
        for array, written in zip(arrays, outputs):
            array[rows, slot] = self.graphs.to_numpy(written)
        return arrays

    def _place(self, rows: List[Running], caches: List[np.ndarray]) -> None:
        """Add prefilled `rows` (their caches: each array's first rows, in order) at free places of the batch's
        caches, written in place (through the arrays the runtime returned: no copy of the batch), their written
        slots only: a place's later slots hold what an earlier row left there, which no query sees (each row's
        slot_valid masks them until its own step writes them; 4 rows of vlm-s-native's 48-token prompts copied
        113 MB whole, 7 MB so); the caches grow to the batch size that holds everyone when too few places are
        free."""
        if self.capacity - len(self.rows) < len(rows):
            self._resize(self.padded(len(self.rows) + len(rows)), caches)
        taken = {row.place for row in self.rows}
        places = [place for place in range(self.capacity) if place not in taken][:len(rows)]
        arrays = [self.graphs.to_numpy(c) for c in self.caches]
        used = max(row.slot for row in rows)  # the slots written so far; a free row's later slots are never read
        for array, new in zip(arrays, caches):
            array[places, :used] = new[:len(rows), :used]
        for row, place in zip(rows, places):
            row.place = place
        self.caches = arrays
        self.rows += rows

    def _resize(self, capacity: int, like: Sequence[np.ndarray] = ()) -> None:
        """The caches at `capacity` rows (shaped like the caches' rows, or `like`'s when there are none yet):
        growing keeps every running row at its place, shrinking packs them into the first places."""
        kept = [self.graphs.to_numpy(c) for c in self.caches] if self.caches is not None else []
        arrays = [np.zeros((capacity, *a.shape[1:]), a.dtype) for a in kept or like]
        if kept:
            grows = capacity >= len(kept[0])
            places = list(range(len(kept[0]))) if grows else [row.place for row in self.rows]
            for array, old in zip(arrays, kept):
                array[:len(places)] = old[places]
            if not grows:
                for index, row in enumerate(self.rows):
                    row.place = index
        self.caches = arrays

    def row_caches(self, rows: Sequence[Running]) -> List[np.ndarray]:
        """`rows`' caches (each array's rows at their places, in order): a decode graph's stored sample."""
        places = [row.place for row in rows]
        return [self.graphs.to_numpy(c)[places] for c in self.caches]

    # ---- stepping -----------------------------------------------------------------------------------

    def sample(self) -> List[Tuple[Running, Union[Delta, Exception]]]:
        """Choose every running sequence's next token from its logits -> [(row, its Delta, or the exception that
        failed it)]; rows that finished, failed or were cancelled leave the batch (their cache rows freed). A
        failure is the row's own (its logits, its settings): its neighbours in the batch go on."""
        emitted: List[Tuple[Running, Union[Delta, Exception]]] = []
        for row in self.rows:
            if row.done:
                continue
            try:
                emitted += [(row, delta) for delta in self._sample_row(row)]
            except Exception as error:  # noqa: BLE001 - the row fails alone, its caller gets the error
                row.cancelled = True
                emitted.append((row, error))
        self.drop_done()
        return emitted

    def sample_or_raise(self) -> List[Tuple[Running, Delta]]:
        """sample() for a caller whose rows are one request's: a row's failure raised."""
        emitted = self.sample()
        for _, outcome in emitted:
            if isinstance(outcome, Exception):
                raise outcome
        return emitted

    def _sample_row(self, row: Running) -> List[Delta]:
        """The row's next token from its logits; then, while it is the next verified draft, the token after it
        from that draft's logits (its cache row is already written)."""
        deltas = [self._sample_one(row)]
        verified = bool(row.drafted)
        while row.drafted and not row.done and deltas[-1].token == row.drafted[0]:
            row.drafted.pop(0)
            row.slot_valid[row.slot] = True
            row.slot += 1
            row.position += 1
            row.logits = row.pending.pop(0)
            self.accepted += 1
            deltas.append(self._sample_one(row))
        if verified:
            row.expected = expected_after(row.expected, len(deltas) - 1)
        elif row.unverified >= 0:
            row.expected = expected_after(row.expected, float(deltas[0].token == row.unverified))
        row.drafted, row.pending, row.unverified = [], [], -1
        return deltas

    @staticmethod
    def _sample_one(row: Running) -> Delta:
        logits = row.logits[None]
        if not np.isfinite(logits).any():
            raise ConfigError("generate: the model's logits for this sequence are all NaN or infinite; the "
                              "package's graphs or weights are broken (mindvl export verify checks them)")
        choosable = logits
        if row.constraint is not None:  # the grammar's mask first: what it rules out is never drawn
            choosable = np.where(row.constraint.allowed(logits.shape[-1])[None], logits, -np.inf)
        token = next_tokens(choosable, row.settings, row.rng, row.seen[None],
                            None if row.counts is None else row.counts[None])
        logprob = float(token_logprobs(logits, token)[0])
        token = int(token[0])
        row.seen[token] = True
        if row.constraint is not None:
            row.constraint.consume(token)
        if row.counts is not None:
            row.counts[token] += 1
        last = len(row.sequence.tokens) + 1 >= row.settings.max_new_tokens
        top = top_logprobs(row.logits, row.settings.top_logprobs) if row.settings.top_logprobs else ()
        return row.sequence.add(token, last, logprob, top)

    def drop_done(self) -> None:
        """Rows that finished leave: their places are free (the caches untouched), all the caches when none runs."""
        self.rows = [row for row in self.rows if not row.done]
        if not self.rows:
            self.caches, self._fitted = None, 0

    def _fit(self) -> None:
        """Pack the running rows into the smaller batch size they have fitted for SHRINK_AFTER steps."""
        smaller = self.padded(len(self.rows))
        self._fitted = self._fitted + 1 if smaller < self.capacity else 0
        if self._fitted >= SHRINK_AFTER:
            self._resize(smaller)
            self._fitted = 0

    def decode(self) -> None:
        """One decode step of every row: its last token in, its next logits out; with speculative_tokens, where
        a row's text offers drafts (prompt lookup), one several-token step verifies them too. Free places run
        too (token 0 at slot 0 of their own row, unread)."""
        if not self.rows:
            return
        self._fit()
        guesses = [self._drafts(row) for row in self.rows] if self.speculative_tokens else []
        steps = self.graphs.extend_steps if self._verify(guesses) else 1
        ahead = np.arange(steps, dtype=np.int32)
        token, position = (np.zeros((self.capacity, steps), np.int32) for _ in range(2))
        slot = np.tile(ahead, (self.capacity, 1))
        slot_valid = np.zeros((self.capacity, self.layout.limits.cache_len), bool)
        slot_valid[:, 0] = True
        for index, row in enumerate(self.rows):
            guess = guesses[index] if steps > 1 else []
            row.unverified = int(guesses[index][0]) if guesses and steps == 1 and len(guesses[index]) else -1
            token[row.place] = np.concatenate([[row.sequence.tokens[-1]], guess,
                                               np.repeat(row.sequence.tokens[-1], steps - 1 - len(guess))])
            position[row.place] = row.position + ahead
            slot[row.place] = row.slot + ahead
            row.slot_valid[row.slot] = True
            row.drafted = [int(t) for t in guess]
            self.drafted += len(guess)
            slot_valid[row.place] = row.slot_valid
            slot_valid[row.place, row.slot + 1:row.slot + 1 + len(row.drafted)] = True  # the drafts', this step only
        logits, self.caches = self._decode_rows([token, position, slot, slot_valid], self.caches, self.capacity)
        for row in self.rows:
            row.logits = logits[row.place, 0]
            row.pending = list(logits[row.place, 1:1 + len(row.drafted)])
            row.slot += 1
            row.position += 1

    def _verify(self, guesses: Sequence[np.ndarray]) -> bool:
        """Whether this step verifies the rows' drafts: some row has drafts and what they are expected to add
        pays for the several-token call at this batch size (its cost against a one-token call as timed so far;
        untimed, it is tried)."""
        if not any(len(g) for g in guesses):
            return False
        one, several = (self.call_ms.get((self.capacity, steps)) for steps in (1, self.graphs.extend_steps))
        ratio = several / one if one and several else 1.0
        return worth_verifying(sum(row.expected for row, g in zip(self.rows, guesses) if len(g)), len(self.rows),
                               ratio)

    def _drafts(self, row: Running) -> np.ndarray:
        """A row's prompt-lookup drafts, as many as its cache and its token budget leave room for."""
        room = min(self.speculative_tokens, self.layout.limits.cache_len - row.slot - 1,
                   row.settings.max_new_tokens - len(row.sequence.tokens) - 1)
        if room < 1:
            return np.zeros(0, np.int32)
        return drafts(np.concatenate([row.context, np.asarray(row.sequence.tokens, np.int32)]), room)

    # ---- a whole generation -------------------------------------------------------------------------

    def stream(self, prompts: Sequence, settings: SamplingConfig) -> Iterator[Tuple[Running, Delta]]:
        """Generate `prompts` together until every one has finished: (row, Delta) as each token is chosen,
        row.owner the prompt's index."""
        self.prefill(prompts, [settings] * len(prompts), owners=list(range(len(prompts))))
        while self.rows:
            yield from self.sample_or_raise()
            self.decode()

    def generate(self, prompts: Sequence, settings: SamplingConfig) -> List[Generation]:
        """Every prompt's finished generation, the prompts prefilled and decoded together."""
        results = {}
        for row, delta in self.stream(prompts, settings):
            results.setdefault(row.owner, Generation("", prompt_tokens=row.prompt_tokens,
                                                              dropped_turns=row.dropped)).add(delta)
        return [results[index] for index in range(len(prompts))]


def _generator(seed: Optional[int]) -> np.random.Generator:
    """A sequence's own sampler: seeded (a negative seed, which OpenAI's API allows, taken modulo 2^64), or from
    fresh entropy."""
    return np.random.default_rng(None if seed is None else seed % 2 ** 64)


def generate(layout, graphs, prompts: Sequence, settings: SamplingConfig, sizes: Sequence[int] = ()) -> List[Generation]:
    """Every prompt's generation on a fresh batch (verification, evaluation, the device)."""
    return DecodeBatch(layout, graphs, sizes).generate(prompts, settings)
