"""A generative package served: its graphs on one thread, generating for every request at once.

Continuous batching: requests wait in a queue; between two decode steps the batcher prefills the next waiting ones
(up to `max_streams` running) and their rows join the decode batch; a request that finishes, or whose client went
away, leaves it at the next step and frees its cache rows. Every running request's step is one decode call of the
engine (mindvl.engine.decode_loop.DecodeBatch), so 16 streams cost about one step of batch 16 rather than 16
steps of batch 1. Waiting requests of one prompt bucket prefill together, up to PREFILL_TOKENS a step, so a burst
of short prompts is in the batch after a few steps while the running streams still step between them.
`max_streams` 1 turns it off: one request at a time, in arrival order.

A request arrives prepared (`prepare`, in a worker thread: its settings validated, its image and clip decoded, its
question tokenised and checked against the graphs' limits), so the engine thread does only the graphs and the
sampling, and a request's own size costs it nothing per token. A request's deltas reach its caller on the
caller's event loop (an asyncio.Queue), ending with None, or with the exception that failed it: a sequence whose
step fails gets its error alone, its neighbours in the batch go on.
"""
import asyncio
import dataclasses
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.chat import Turn, history_turns
from mindvl.engine.decode_loop import DecodeBatch
from mindvl.engine.grammar import KINDS, Grammar
from mindvl.engine.native_prompts import NativePrompt, NativeRequests
from mindvl.engine.package_graphs import GenerationSpec, PackageGraphs, package_layout
from mindvl.engine.prefix_cache import PrefixCache
from mindvl.engine.prompts import MultimodalPrompt, preprocessed_prompt
from mindvl.engine.sampling import Generation, SamplingConfig, sampling_config
from mindvl.errors import ConfigError, InputError, shown
from mindvl.package_reader import graph_caller, load_graph

LOG = logging.getLogger("mindvl.serving")
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)  # what the graphs compile for (DecodeBatch.sizes); more rows pad up
# Prompt tokens (bucket x rows) prefilled between two decode steps, in one call; a longer prompt goes alone. A
# burst of short prompts joins a few at a time (vlm-s-native's 64-token bucket: 1 / 2 / 4 rows 200 / 372 / 609 ms),
# and a step never waits for more than one such call. A larger batch buys little more on a CPU (the older vlm-s's
# 192-token bucket: 2.0 s alone, 2.9 s for 2, 9.3 s for 8) and each batch size keeps its own working memory (+4.6
# GB at 8 x 192 tokens: 16 streams joining at once were OOM-killed).
PREFILL_TOKENS = 256


REQUEST_NAMES = {"max_new_tokens": "max_tokens", "stop_strings": "stop"}  # SamplingConfig's name -> a request's
MB = 2 ** 20


@dataclass(frozen=True)
class GenerationOptions:
    """The server's generation settings (ServeConfig's flags of the same names): prefix_cache_mb, the cache rows
    of earlier prompts kept for the next prompts that start the same way (a system prompt, an earlier turn, an
    image); speculative_tokens, the prompt-lookup drafts verified per step (both off by default; either loads the
    package's several-token step graph: one more copy of the decoder's weights); max_wait_ms, how long a request
    reaching an idle engine waits for others to prefill with it (a burst's first request otherwise went alone)."""

    prefix_cache_mb: float = 0.0
    speculative_tokens: int = 0
    max_wait_ms: float = 0.0

    @property
    def extend(self) -> bool:
        return self.prefix_cache_mb > 0 or self.speculative_tokens > 0


def request_settings(fields: dict) -> SamplingConfig:
    """A request's generation fields (OpenAI's names: max_tokens, stop, ...) as a validated SamplingConfig; a
    ConfigError names the request's field (`max_tokens: expected an integer, got inf`). Values arrive as JSON
    gives them, or as MindSpore Serving's protocol hands scalars over (0-d arrays, float32); an integral float
    (16.0) is the integer, 1.5 is refused."""
    def number(name, integral):
        value = fields.get(name)
        if value is None:
            return None
        if isinstance(value, np.ndarray) and value.ndim == 0 or isinstance(value, np.generic):
            value = value.item()
        if integral and isinstance(value, float) and value.is_integer():
            value = int(value)
        return value

    stop = fields.get("stop")
    stop = stop.tolist() if isinstance(stop, np.ndarray) else stop
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop)):
        raise ConfigError(f"stop: expected a string or a list of strings, got {shown(stop)}")
    settings = {"max_new_tokens": number("max_tokens", True), "temperature": number("temperature", False),
                "top_p": number("top_p", False), "top_k": number("top_k", True),
                "repetition_penalty": number("repetition_penalty", False), "seed": number("seed", True),
                "stop_strings": list(stop) if stop else None, "ignore_eos": _flag(fields.get("ignore_eos"), "ignore_eos"),
                "presence_penalty": number("presence_penalty", False),
                "frequency_penalty": number("frequency_penalty", False), "top_logprobs": number("top_logprobs", True),
                "grammar": request_grammar(fields.get("grammar"))}
    try:
        return sampling_config(**settings)
    except ConfigError as error:
        name, _, rest = str(error).partition(":")
        raise ConfigError(f"{REQUEST_NAMES.get(name, name)}:{rest}") from None


def request_grammar(value) -> Optional[Grammar]:
    """A generate instance's `grammar`: {"type": "json_schema" | "json_object" | "regex" | "choice", "value": the
    schema, nothing, the expression or the strings} as JSON text (REST, gRPC) or, from the OpenAI route
    (response_format, guided_*), the object itself; absent: none."""
    if value is None:
        return None
    value = _json_text(value, "grammar", '{"type": "json_schema", "value": {...}}')
    if not isinstance(value, dict) or set(value) - {"type", "value"} or "type" not in value:
        raise InputError(f"grammar: expected {{\"type\": one of {', '.join(KINDS)}, \"value\": ...}}, got "
                         f"{shown(value)}")
    grammar = Grammar(value["type"], value.get("value"))
    grammar.validate()
    return grammar


def _json_text(value, name: str, example: str):
    """A JSON field that REST and gRPC carry as text (a 0-d array from MindSpore Serving's protocol), parsed."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise InputError(f"{name}: not valid JSON ({str(error)[:80]}); send {example}") from None
    return value


def request_history(value) -> List[Turn]:
    """A generate instance's `history`: the conversation's earlier messages as JSON text (chat.history_turns'
    form; REST and gRPC carry it as a string) or, from the OpenAI route, the list itself; absent: none."""
    if value is None:
        return []
    return history_turns(_json_text(value, "history", 'the earlier messages as a JSON list of {"role": ..., '
                                                      '"content": ...}'))


def _flag(value, name: str):
    """A JSON boolean: MindSpore Serving's protocol hands scalars over as 0-d arrays."""
    if value is None:
        return None
    if np.ndim(value) == 0 and np.asarray(value).dtype == np.bool_:
        return bool(value)
    raise ConfigError(f"{name}: expected true or false, got {shown(value)}")


@dataclass
class GenerationRequest:
    """One prompt being generated for a caller; `cancel()` from any thread stops it at the next step."""

    prompt: MultimodalPrompt
    settings: SamplingConfig
    loop: asyncio.AbstractEventLoop
    deltas: asyncio.Queue = field(default_factory=asyncio.Queue)
    prompt_tokens: int = 0
    cancelled: bool = False
    dropped_turns: int = 0

    def cancel(self) -> None:
        self.cancelled = True

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.deltas.put_nowait, item)

    async def stream(self):
        """The deltas as they are generated; raises what failed the request."""
        while True:
            item = await self.deltas.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def result(self) -> Generation:
        result = Generation("", prompt_tokens=self.prompt_tokens, dropped_turns=self.dropped_turns)
        async for delta in self.stream():
            result.add(delta)
        return result


class Choices:
    """The generations of one prompt that a request asked several of (OpenAI's n), streamed together: (choice
    index, Delta) as each comes; cancelling it cancels them all."""

    def __init__(self, requests: Sequence[GenerationRequest]) -> None:
        self.requests = list(requests)
        self.prompt_tokens, self.dropped_turns = requests[0].prompt_tokens, requests[0].dropped_turns

    @property
    def cancelled(self) -> bool:
        return all(request.cancelled for request in self.requests)

    def cancel(self) -> None:
        for request in self.requests:
            request.cancel()

    async def stream(self):
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, request: GenerationRequest) -> None:
            try:
                async for delta in request.stream():
                    merged.put_nowait((index, delta))
                merged.put_nowait((index, None))
            except Exception as error:  # noqa: BLE001 - raised to the reader below
                merged.put_nowait((index, error))

        pumps = [asyncio.create_task(pump(i, request)) for i, request in enumerate(self.requests)]
        try:
            running = len(pumps)
            while running:
                index, item = await merged.get()
                if item is None:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield index, item
        finally:
            for task in pumps:
                task.cancel()

    async def results(self) -> List[Generation]:
        return list(await asyncio.gather(*(request.result() for request in self.requests)))


class ContinuousBatcher:
    """The generation graphs of a package version and the thread that runs them (see the module docstring).
    `lock`: held around every graph call (MindSpore runs one GraphCell at a time in a process)."""

    def __init__(self, folder: Path, manifest: dict, key: Optional[bytes], lock: threading.Lock,
                 max_streams: int = 16, options: GenerationOptions = GenerationOptions()) -> None:
        self.spec = GenerationSpec.from_manifest(manifest)
        # the images' and clips' front end (a native package has one only where it hears)
        self.pre = P.preprocess_config(manifest["preprocess"]) if "preprocess" in manifest else None
        native = self.spec.native  # a native VLM's image and video processing
        self.requests = NativeRequests(native, self.pre) if native else None
        self.layout = package_layout(folder, manifest)
        if options.extend and not self.spec.extend_steps:
            raise ConfigError(f"prefix_cache_mb / speculative_tokens: package {manifest.get('name')} ({folder}) has no "
                              f"several-token decoder step (exported before it); export it again with this mindvl, "
                              f"or serve it with --prefix-cache-mb 0 --speculative-tokens 0")
        self.max_streams = max(1, int(max_streams))
        self.options = options
        wide = self.spec.runs_wide(self.max_streams)  # else never run: not loaded
        self.graphs = {name: load_graph(folder, manifest, name, key)
                       for name in self.spec.graph_names(extend=options.extend, wide=wide)}
        self.run = graph_caller(self.graphs, lock)
        self.batch = DecodeBatch(self.layout, PackageGraphs(self.spec, self.run, extend=options.extend, wide=wide),
                                 sizes=[size for size in BATCH_SIZES if size < self.max_streams] + [self.max_streams],
                                 prefixes=PrefixCache(int(options.prefix_cache_mb * MB)) if options.prefix_cache_mb
                                 else None, speculative_tokens=options.speculative_tokens)
        self.waiting: "queue.Queue[Optional[GenerationRequest]]" = queue.Queue()
        self.taken: List[GenerationRequest] = []  # taken from the queue, not yet joined (first in line)
        self.steps = 0  # decode calls made (metrics, tests)
        self.cancelled = 0  # sequences stopped because their caller went away
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="generation", daemon=True)
        self.thread.start()

    def warm_up(self) -> None:
        """Compile the decode steps at every batch size the batch can reach, and the prefills at the rows that join
        together (PREFILL_TOKENS), before a request comes (a first burst of 16 requests otherwise waited for five
        compilations: its TTFT p90 7.0 -> 4.9 s once warmed)."""
        start = time.perf_counter()
        self.batch.graphs.warm_up(self.batch.sizes)
        settings = sampling_config(max_new_tokens=1)
        prompt = self.prepare("warm up", None, None, settings)
        length = self.layout.prompt_length(prompt)
        for bucket in (b for b in self.layout.limits.buckets if b >= length):
            layout = self.layout.with_buckets([bucket])
            for rows in self.batch.sizes:
                if 1 < rows and rows * bucket <= PREFILL_TOKENS:
                    self.batch.graphs.prefill(layout.batch([prompt] * rows, 1))
        LOG.info("decode and prefill steps compiled for batch sizes %s in %.1f s", list(self.batch.sizes),
                 time.perf_counter() - start)

    # ---- requests (any thread) ------------------------------------------------------------------------

    def prepare(self, text: str, image: Optional[bytes], audio: Optional[bytes], settings: SamplingConfig,
                images: Sequence[bytes] = (), video=None,
                history: Sequence[Turn] = ()) -> Union[MultimodalPrompt, NativePrompt]:
        """A request's prompt as the engine takes it: the image and the clip preprocessed as in training (a native
        package's images and video cut at their own resolution), the conversation (`history`, then the question)
        rendered and tokenised, its oldest turns left out where it would not fit with the new tokens, checked
        against the graphs' limits (ConfigError or InputError naming the field). CPU work: call it from a worker
        thread, never the event loop (a long text, a large image)."""
        self.layout.limits.check_new_tokens(settings.max_new_tokens, "max_tokens")  # before anything is decoded
        self.layout.check_text(text or "")
        if self.spec.native:
            prompt = self.requests.prompt(text or "", [image] * (image is not None) + list(images), audio, video,
                                          history)
        elif images or video is not None:
            raise InputError("images, video: this model takes one image per conversation (`image`) and no video")
        else:
            prompt = dataclasses.replace(preprocessed_prompt(text or "", self.pre, image, audio), history=tuple(history))
        prompt = self.layout.fit(prompt, settings.max_new_tokens)
        self.batch.admit([prompt], [settings], "max_tokens")  # the bucket and the cache's room
        return prompt

    def submit(self, prompt: MultimodalPrompt, settings: SamplingConfig,
               loop: asyncio.AbstractEventLoop) -> GenerationRequest:
        """Queue a prepared prompt (`prepare`, which a request's several choices share); ConfigError when the
        version is being unloaded."""
        if self.closed:
            raise ConfigError("the servable version is being unloaded; retry")
        request = GenerationRequest(prompt, settings, loop, prompt_tokens=len(prompt.rendered),
                                    dropped_turns=prompt.dropped)
        self.waiting.put(request)
        return request

    def counts(self) -> dict:
        """What /metrics reports of this engine (counters since the version loaded)."""
        prefixes = self.batch.prefixes
        return {"decode_steps": self.steps, "cancelled": self.cancelled,
                "prefix_cache_hits": prefixes.hits if prefixes else 0,
                "prefix_cache_misses": prefixes.misses if prefixes else 0,
                "prefix_reused_tokens": prefixes.reused_tokens if prefixes else 0,
                "speculative_drafted_tokens": self.batch.drafted,
                "speculative_accepted_tokens": self.batch.accepted}

    def close(self) -> None:
        self.closed = True
        self.waiting.put(None)
        self.thread.join(timeout=30)

    # ---- the batcher's thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            joining = self._take(block=not self.batch.rows)
            if joining is None:
                break
            if joining:
                self._join(joining)
            for row in self.batch.rows:
                if row.owner.cancelled and not row.cancelled:
                    row.cancelled = True
                    self.cancelled += 1
                    row.owner.put(None)  # its caller's stream ends
            try:
                for row, outcome in self.batch.sample():
                    row.owner.put(outcome)  # a Delta, or what failed this row alone (its stream raises it)
                    if isinstance(outcome, Exception):
                        LOG.warning("a generation failed at its step (its neighbours go on): %s", outcome)
                    elif outcome.finish:
                        row.owner.put(None)
                self.batch.decode()
                self.steps += 1
            except Exception as error:  # a broken graph call fails the running requests, not the server
                LOG.exception("generation step failed")
                for row in self.batch.rows:
                    row.owner.put(error)
                    row.cancelled = True
                self.batch.drop_done()
        for row in self.batch.rows:
            row.owner.put(ConfigError("the servable version was unloaded while generating; retry"))
        for request in self.taken:
            request.put(ConfigError("the servable version was unloaded; retry"))
        while not self.waiting.empty():
            request = self.waiting.get_nowait()
            if request is not None:
                request.put(ConfigError("the servable version was unloaded; retry"))

    def _take(self, block: bool) -> Optional[List[GenerationRequest]]:
        """Requests to prefill together now, the first in line and those after it that join it
        (DecodeBatch.together, PREFILL_TOKENS); None: closing. Waits for one when nothing runs."""
        room = self.max_streams - len(self.batch.rows)
        line = [request for request in self.taken if not self._dropped(request)]
        until = None  # idle: once one request is in line, the others arriving within max_wait_ms join it
        while len(line) < room:
            try:
                if until is None:
                    request = self.waiting.get(block=block and not line)
                else:
                    request = self.waiting.get(timeout=max(until - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if request is None:
                self.taken = line
                return None
            if not self._dropped(request):
                line.append(request)
            if block and until is None and self.options.max_wait_ms > 0:
                until = time.monotonic() + self.options.max_wait_ms / 1000
        joinable = line[:max(room, 0)]
        count = self.batch.together([r.prompt for r in joinable], [r.settings for r in joinable], PREFILL_TOKENS) \
            if joinable else 0
        self.taken = line[count:]
        return line[:count]

    def _dropped(self, request: GenerationRequest) -> bool:
        """Whether a waiting request's caller went away (then it is counted and ended)."""
        if request.cancelled:
            self.cancelled += 1
            request.put(None)
        return request.cancelled

    def _join(self, joining: List[GenerationRequest]) -> None:
        try:
            self.batch.prefill([r.prompt for r in joining], [r.settings for r in joining], owners=joining)
        except Exception as error:  # this prefill's requests fail; the running ones go on
            if len(joining) > 1:  # one request's failure is its own: the others prefill alone
                LOG.warning("a prefill of %d requests failed (%s); prefilling each alone", len(joining), error)
                for request in joining:
                    self._join([request])
                return
            LOG.exception("prefill failed")
            joining[0].put(error)
