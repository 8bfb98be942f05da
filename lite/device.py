"""`DevicePipeline`: a model package answering questions on the device, request bytes in, answer out.

It computes what the server's `predict` computes: the same stages (mindvl.preprocess.RequestInputs, which
the generated servable_config.py runs too) with the manifest's preprocessing parameters, then the vqa graph
on a `LiteModel`. The three modalities are preprocessed at the same time: each has
its own lane (a ThreadPoolExecutor of `threads` workers named mindvl-image / -question / -audio), and one
question is one task per lane (image decode and resize, tokenisation, log-mel of the spoken question), so
the slow log-mel never waits for the image and no two modalities share a thread. The model call follows,
on the caller's thread.

Inputs follow the server's rules: image PNG/JPEG bytes; question a str ('' or None when only spoken);
audio WAV/FLAC/OGG bytes (b'' or None when only typed); not both question and audio empty. A bad input
raises `mindvl.preprocess.InputError` naming it (`answer`), or takes that item's place in the result list
(`answer_batch`), so one corrupt JPEG never stops a batch.

A generative package (vlm-tiny's: attachments, prefill per bucket, decode) answers in words instead:
`generate` and `stream` run mindvl.engine.decode_loop's DecodeBatch, the loop the server and `export
verify` run, over the package's graphs on the device runtime (lite.model.GenerationGraphs); the image and
the spoken question are preprocessed on their lanes as above, and one prompt is generated at a time (the
lite2 graphs have batch 1).
"""
import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.engine.sampling import Delta, Generation, sampling_config
from mindvl.lite.lite_model import Context, GenerationGraphs, LiteError, LiteModel

MODALITIES = ("image", "question", "audio")
PathLike = Union[str, Path]


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) over the last axis, in float64 (the server's vqa_answer uses float64
    too, so confidences agree to float32 rounding)."""
    scaled = np.asarray(logits, np.float64) / float(temperature)
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    weights = np.exp(scaled)
    return weights / weights.sum(axis=-1, keepdims=True)


@dataclasses.dataclass
class DeviceAnswer:
    """One question answered on the device.

    answer: the most probable label; confidence: its softmax probability (temperature 1, as the server
    reports it); answer_text: the generated answer; logits: float32 (num_answers,), the vqa graph's
    answer_logits row. timings in seconds: image, question, audio (each modality's own task), preprocess
    (wall time of the three tasks together), model (the LiteModel call), total. In `answer_batch` the
    preprocess, model and total entries are the whole batch's. threads: the thread each modality ran on.
    """
    answer: str
    confidence: float
    answer_text: str
    logits: np.ndarray
    timings: Dict[str, float]
    threads: Dict[str, str]


@dataclasses.dataclass
class DeviceGeneration(Generation):
    """A generated answer on the device (mindvl.engine.sampling.Generation: text, tokens, finish, prompt_tokens,
    logprobs, mean_logprob) with timings in seconds: image, audio (each modality's own task), preprocess,
    first_token (from the call to the first token: preprocessing, attachments, prefill and the first
    sample), decode (the decode steps after it), total."""
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)


def _timed(function, *args) -> Tuple[object, float, str]:
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start, threading.current_thread().name


def find_package(model_path: PathLike) -> Path:
    """The model package a LiteModel was built from: the nearest folder above its file holding a manifest."""
    from mindvl.package_reader import MANIFEST

    for folder in Path(model_path).resolve().parents:
        if (folder / MANIFEST).is_file():
            return folder
    raise LiteError(f"{model_path}: not inside a model package (no {MANIFEST} above it); build the LiteModel "
                    f"with LiteModel.from_package, or pass the package folder")


class DevicePipeline:
    """Answers questions with the vqa graph of a model package on the device runtime, or generates answers
    with a generative package's graphs (`generate`, `stream`).

    package: the model package folder. backend: LiteModel's ("auto", "lite2", "graphcell", ...).
    threads: workers per modality lane (1 is enough for single questions; more help `answer_batch`).
    context: the runtime's Context (CPU threads of the model). model: an already built LiteModel of this
    package's vqa graph to use instead of building one (the pipeline closes it). Not for concurrent use
    with an in-process `mindvl serve` on the graphcell backend (MindSpore runs one GraphCell at a time
    per process).
    """

    def __init__(self, package: PathLike, backend: str = "auto", threads: int = 1,
                 context: Optional[Context] = None, model: Optional[LiteModel] = None) -> None:
        from mindvl.package_reader import check_files, read_manifest

        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise LiteError(f"threads={threads!r}: expected 1 or more workers per modality")
        self.package = Path(package)
        self.manifest = read_manifest(self.package)
        self.generative = self.manifest.get("kind") == "generative"
        native = self.generative and bool(self.manifest["generation"].get("native"))  # a VLM's own processing
        recorded = self.manifest["generation" if native else "preprocess"]
        # the images' and clips' front end; a native package cuts images itself and has one only where it hears
        front = self.manifest.get("preprocess") if native else recorded
        self.pre = P.preprocess_config(front) if front else None
        check_files(self.package, self.manifest, [recorded["tokenizer"]])
        self.model = self.graphs = None
        if self.generative:
            self._init_generation(backend, context)
        else:
            self._init_vqa(backend, context, model)
        self.threads = threads
        self._lanes = {m: ThreadPoolExecutor(threads, thread_name_prefix=f"mindvl-{m}") for m in MODALITIES}
        self._model_lock = threading.Lock()  # a LiteModel is one runtime session: one call at a time

    def _init_vqa(self, backend: str, context: Optional[Context], model: Optional[LiteModel]) -> None:
        if "vqa" not in self.manifest["graphs"]:
            raise LiteError(f"{self.package}: has no vqa graph (it has {', '.join(self.manifest['graphs'])}); "
                            f"export the package with the vqa graph to answer questions")
        self.labels: List[str] = list(self.manifest["labels"])
        self.tokenizer = P.TextTokenizer.load(self.package / self.manifest["preprocess"]["tokenizer"])
        self.inputs = P.RequestInputs(self.pre, self.tokenizer)
        self.input_names = [t["name"] for t in self.manifest["graphs"]["vqa"]["inputs"]]
        self.model = model or LiteModel.from_package(self.package, "vqa", context, backend)
        self.backend = self.model.backend_name

    def _init_generation(self, backend: str, context: Optional[Context]) -> None:
        from mindvl.engine.package_graphs import package_layout

        self.graphs = GenerationGraphs(self.package, backend, context)
        self.spec, self.backend = self.graphs.spec, self.graphs.backend_name
        self.layout = package_layout(self.package, self.manifest)
        if self.spec.native:  # images and video at their own resolution (NativeRequests cuts them)
            from mindvl.engine.native_prompts import NativeRequests

            self.requests = NativeRequests(self.spec.native, self.pre)
            return
        # the image and audio stages (RequestInputs.pixels / speech); the vqa tokenizer is never asked for
        self.inputs = P.RequestInputs(self.pre, lambda: P.TextTokenizer(self.layout.chat.tokenizer))

    def _require(self, generative: bool, what: str) -> None:
        if generative and not self.generative:
            raise LiteError(f"{self.package}: a vqa package answers with answer(); {what} needs a generative "
                            f"package (export a generative run such as vlm-tiny, with --target lite2 for Lite 2.0)")
        if not generative and self.generative:
            raise LiteError(f"{self.package}: a generative package answers in words: use generate() or stream() "
                            f"instead of {what}")

    @classmethod
    def from_model(cls, model: LiteModel, threads: int = 1) -> "DevicePipeline":
        """The pipeline around a LiteModel built with `LiteModel.from_package(package, "vqa")`."""
        if getattr(model, "path", None) is None:
            raise LiteError("the LiteModel is not built: build it with LiteModel.from_package(package, 'vqa')")
        return cls(find_package(model.path), threads=threads, model=model)

    # -- preprocessing in parallel: the server's stages (RequestInputs), one lane per modality
    def _submit(self, image, question, audio, prefix: str) -> Dict[str, Future]:
        """Check the request's shape, then start one task per modality on its lane."""
        self._require(False, "answer()")
        question = "" if question is None else question
        audio = b"" if audio is None else audio
        P.expect(image, bytes, f"{prefix}image")
        self.inputs.check_asked(question, audio, prefix)
        return {"audio": self._lanes["audio"].submit(_timed, self.inputs.audio_input, audio, f"{prefix}audio"),
                "image": self._lanes["image"].submit(_timed, self.inputs.pixels, image, f"{prefix}image"),
                "question": self._lanes["question"].submit(_timed, self.inputs.question_input, question,
                                                           f"{prefix}question")}

    @staticmethod
    def _collect(futures: Dict[str, Future]) -> Tuple[Dict[str, np.ndarray], Dict[str, float], Dict[str, str]]:
        """The tasks' results as one row of vqa inputs (no batch axis); raises the first InputError."""
        wait(futures.values())  # all three, even when one fails: no task outlives the call
        results = {m: futures[m].result() for m in MODALITIES}
        pixels, _, _ = results["image"]
        (ids, mask, use_text), _, _ = results["question"]
        (mel, frames, use_audio), _, _ = results["audio"]
        row = {"image": pixels, "question_ids": ids, "question_mask": mask, "audio_mel": mel,
               "audio_mask": frames, "use_text": use_text, "use_audio": use_audio}
        return row, {m: r[1] for m, r in results.items()}, {m: r[2] for m, r in results.items()}

    def prepare(self, image: bytes, question: Optional[str] = None, audio: Optional[bytes] = None,
                name: str = "") -> Tuple[Dict[str, np.ndarray], Dict[str, float], Dict[str, str]]:
        """(one row of vqa inputs without the batch axis, seconds per modality, thread per modality); the
        three modalities are preprocessed in parallel. `name` prefixes error messages ("item 3: ")."""
        return self._collect(self._submit(image, question, audio, name))

    # -- the model
    def predict(self, rows: Sequence[Mapping[str, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
        """Rows of vqa inputs -> (answer_logits float32 (N, num_answers), answer_ids int32 (N, steps))."""
        self._require(False, "predict()")
        if not rows:
            raise LiteError("predict: no rows to run")
        batch = {name: np.stack([np.asarray(row[name]) for row in rows]) for name in self.input_names}
        with self._model_lock:  # LiteModel.run feeds a static lite2 graph in chunks of its batch
            outputs = self.model.run(batch)
        return outputs["answer_logits"], outputs["answer_ids"]

    def _answer(self, logits: np.ndarray, answer_ids: np.ndarray, timings: Dict[str, float],
                threads: Dict[str, str]) -> DeviceAnswer:
        """The servable's vqa_answer for one row."""
        answer, confidence, text = self.inputs.vqa_answer(logits, answer_ids, self.labels)
        return DeviceAnswer(answer, float(confidence), text, np.asarray(logits, np.float32), timings, threads)

    def answer(self, image: bytes, question: Optional[str] = None, audio: Optional[bytes] = None) -> DeviceAnswer:
        """Answer one question (typed, spoken or both) about one image; InputError names a bad input."""
        start = time.perf_counter()
        row, timings, threads = self.prepare(image, question, audio)
        timings["preprocess"] = time.perf_counter() - start
        model_start = time.perf_counter()
        logits, answer_ids = self.predict([row])
        timings["model"] = time.perf_counter() - model_start
        timings["total"] = time.perf_counter() - start
        return self._answer(logits[0], answer_ids[0], timings, threads)

    def answer_batch(self, items: Sequence[Mapping[str, object]]) -> List[Union[DeviceAnswer, P.InputError]]:
        """Answer many questions: items are {"image", "question", "audio"} as the server takes them. Every
        item's three tasks are queued at once on the lanes, then one model call runs the good rows. A bad
        item's place holds its InputError ("item 3: image: cannot decode ..."); the others are answered."""
        start = time.perf_counter()
        pending: List[Union[Dict[str, Future], P.InputError]] = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, Mapping):
                    raise P.InputError(f"item {index}: expected a dict with image, question and audio, got "
                                       f"{type(item).__name__}")
                pending.append(self._submit(item.get("image"), item.get("question"), item.get("audio"),
                                            f"item {index}: "))
            except P.InputError as error:
                pending.append(error)
        prepared: List[Union[tuple, P.InputError]] = []
        for futures in pending:
            try:
                prepared.append(futures if isinstance(futures, P.InputError) else self._collect(futures))
            except P.InputError as error:
                prepared.append(error)
        preprocess = time.perf_counter() - start
        good = [p for p in prepared if not isinstance(p, P.InputError)]
        model_start = time.perf_counter()
        logits, answer_ids = self.predict([row for row, _, _ in good]) if good else (None, None)
        model = time.perf_counter() - model_start
        total = time.perf_counter() - start
        results: List[Union[DeviceAnswer, P.InputError]] = []
        done = 0
        for item in prepared:
            if isinstance(item, P.InputError):
                results.append(item)
                continue
            _, timings, threads = item
            timings.update(preprocess=preprocess, model=model, total=total)
            results.append(self._answer(logits[done], answer_ids[done], timings, threads))
            done += 1
        return results

    # -- generation (a generative package)
    def _prompt(self, image: Optional[bytes], question: Optional[str], audio: Optional[bytes],
                images: Sequence[bytes] = (), video=None):
        """The request as a MultimodalPrompt, its image and audio preprocessed on their lanes at once (a native
        package's: a NativePrompt, its images and video cut at their own resolution) -> (prompt, timings of the
        image and audio tasks). None or empty: no image, no typed or spoken question."""
        from mindvl.engine.prompts import MultimodalPrompt

        question = "" if question is None else P.expect(question, str, "question")
        audio = b"" if audio is None else P.expect(audio, bytes, "audio")
        image = b"" if image is None else P.expect(image, bytes, "image")
        if not question.strip() and not audio:
            raise P.InputError("generate: question and audio are both empty; ask as text, as audio or both")
        if self.spec.native:
            images = [image] * bool(image) + [P.expect(data, bytes, f"images[{i}]") for i, data in enumerate(images)]
            prompt, seconds, _ = self._lanes["image"].submit(_timed, self.requests.prompt, question, images,
                                                             audio or None, video).result()
            return prompt, {"image": seconds, "audio": 0.0}
        if images or video is not None:
            raise P.InputError("images, video: this package's model takes one image (`image`) per question and no "
                               "video")
        image_task = None if not image else self._lanes["image"].submit(_timed, self.inputs.pixels, image)
        audio_task = None if not audio else self._lanes["audio"].submit(_timed, self.inputs.speech, audio, "audio")
        wait([t for t in (image_task, audio_task) if t is not None])  # both, even when one fails
        pixels, image_seconds, _ = image_task.result() if image_task else (None, 0.0, "")
        (mel, frames), audio_seconds, _ = audio_task.result() if audio_task else ((None, None), 0.0, "")
        return MultimodalPrompt(question, pixels, mel, frames), {"image": image_seconds, "audio": audio_seconds}

    def stream(self, image: Optional[bytes] = None, question: Optional[str] = None, audio: Optional[bytes] = None,
               images: Sequence[bytes] = (), video=None, **settings) -> Iterator[Delta]:
        """Generate an answer to a question (typed, spoken or both) about an optional image, yielding each
        token's Delta (token, text, logprob, finish on the last) as it is chosen. A native VLM's package (Qwen2-VL,
        Qwen2.5-VL) also takes several `images` (files' bytes) and a `video` (a file's bytes, or its frames' files).
        settings: SamplingConfig's (max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop_strings,
        seed, ...); greedy by default. InputError names a bad input; ConfigError a bad setting or a prompt too long."""
        yield from self._generate((image, question, audio, images, video), settings, DeviceGeneration(""))

    def generate(self, image: Optional[bytes] = None, question: Optional[str] = None,
                 audio: Optional[bytes] = None, images: Sequence[bytes] = (), video=None,
                 **settings) -> DeviceGeneration:
        """`stream`'s answer whole, with its timings (DeviceGeneration)."""
        result = DeviceGeneration("")
        for delta in self._generate((image, question, audio, images, video), settings, result):
            result.add(delta)
        return result

    def _generate(self, request: tuple, settings: dict, record: DeviceGeneration) -> Iterator[Delta]:
        """The deltas of one answer; `record` gets its prompt length and timings."""
        from mindvl.engine.decode_loop import DecodeBatch
        from mindvl.engine.package_graphs import PackageGraphs

        self._require(True, "generate()")
        start = time.perf_counter()
        config = sampling_config(**settings)
        self.layout.limits.check_new_tokens(config.max_new_tokens)  # before the image and the clip are decoded
        prompt, modality_seconds = self._prompt(*request)
        timings = record.timings
        timings.update(modality_seconds, preprocess=time.perf_counter() - start)
        with self._model_lock:  # one generation at a time on the graphs
            batch = DecodeBatch(self.layout, PackageGraphs(self.spec, self.graphs))
            (row,) = batch.prefill([prompt], [config])
            record.prompt_tokens = row.prompt_tokens
            first = None
            while batch.rows:
                for _, delta in batch.sample_or_raise():
                    if first is None:
                        first = time.perf_counter()
                        timings["first_token"] = first - start
                    yield delta
                batch.decode()
        end = time.perf_counter()
        timings.update(decode=end - first, total=end - start)

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.shutdown(wait=True)
        for runtime in (self.model, self.graphs):
            if runtime is not None:
                runtime.close()

    def __enter__(self) -> "DevicePipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
