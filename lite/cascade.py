"""`Cascade`: answer on the device when the edge model is confident enough, ask the cloud endpoint otherwise.

The edge's confidence is calibrated: max softmax(answer_logits / temperature), the temperature fitted on
validation data by `mindvl lite calibrate` (mindvl/deploy/calibrate.py), which also picks the threshold for a
target cloud-call rate or accuracy. A question whose calibrated confidence is >= threshold is answered on
the device (source "edge"): threshold 0 never calls the cloud, a threshold above 1 always does. Otherwise
the question goes to the cloud's predict method (`mindvl serve` or MindSpore Serving, through
`mindvl.serving.Client`) and its answer comes back (source "cloud"). When the cloud cannot be reached,
refuses the request, fails the instance or has not answered within `timeout_s`, the edge answer comes
back instead (source "edge_fallback") with `cloud_error` saying what happened: the device always answers.

With a generative package at the edge (`generate`, `stream`), the device generates the whole answer first; its
confidence is exp(mean token log-probability) (`mindvl.engine.sampling.Generation.mean_logprob`: the geometric mean
of the answer's token probabilities, in (0, 1], so the threshold reads as today's). A confident answer comes
from the edge; otherwise the cloud's `generate` is asked with Server-Sent Events (`mindvl serve`) and its
tokens stream through as they arrive. A cloud that fails before its first token gives the edge's answer back
(source "edge_fallback"); one that fails after it ends the stream with LiteError (its tokens are out).
"""
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from mindvl.engine.sampling import Generation
from mindvl.errors import InputError
from mindvl.lite.device import DeviceAnswer, DeviceGeneration, DevicePipeline, softmax
from mindvl.lite.lite_model import LiteError, LiteModel

SOURCES = ("edge", "cloud", "edge_fallback")
CLOUD_THREADS = 4  # cloud requests in flight at once; a hung one holds a thread until the Client's own timeout
CLIENT_GRACE_S = 1.0  # a Client made here outwaits timeout_s by this, so the two deadlines never race


@dataclasses.dataclass
class CascadeAnswer:
    """One question through the cascade.

    answer / confidence: what the caller should use: the cloud's answer and the confidence the cloud
    reported when source is "cloud", else the edge's answer and its calibrated confidence.
    edge_answer / edge_confidence: the device's answer and calibrated confidence (always computed).
    cloud_error: why the cloud's answer is missing (source "edge_fallback"), else None.
    timings (seconds): edge (the device pipeline, total), cloud (the request, when made), total.
    """
    answer: str
    confidence: float
    source: str
    edge_answer: str
    edge_confidence: float
    cloud_error: Optional[str] = None
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class CascadeDelta:
    """One token of a cascade's streamed answer: the edge's (source "edge" or "edge_fallback", all of them once
    the edge has decided) or the cloud's as it arrives (source "cloud"). finish: "stop" or "length" on the
    last token; cloud_error: why the cloud's answer is missing (source "edge_fallback")."""
    text: str
    token: int
    logprob: float
    source: str
    finish: Optional[str] = None
    cloud_error: Optional[str] = None
    top: tuple = ()  # a Delta's most likely alternatives: the cascade asks for none


@dataclasses.dataclass
class CascadeGeneration(Generation):
    """A generated answer through the cascade (Generation: text, tokens, finish, logprobs of the source's
    tokens) with source, confidence (the edge answer's: exp(mean token log-probability)), edge_text,
    cloud_error and timings (seconds: edge, total)."""
    source: str = "edge"
    confidence: float = 0.0
    edge_text: str = ""
    cloud_error: Optional[str] = None
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)


# a SamplingConfig setting -> the name `generate` takes it by on the server (OpenAI's where they differ)
CLOUD_SETTINGS = {"max_new_tokens": "max_tokens", "stop_strings": "stop", "temperature": "temperature",
                  "top_p": "top_p", "top_k": "top_k", "repetition_penalty": "repetition_penalty", "seed": "seed",
                  "ignore_eos": "ignore_eos"}


def _edge_pipeline(edge: Union[DevicePipeline, LiteModel, str, Path]) -> DevicePipeline:
    if isinstance(edge, DevicePipeline):
        return edge
    if isinstance(edge, LiteModel):
        return DevicePipeline.from_model(edge)
    if isinstance(edge, (str, Path)):
        return DevicePipeline(edge)
    raise LiteError(f"edge: expected a DevicePipeline, a LiteModel of a package's vqa graph or a package folder, "
                    f"got {type(edge).__name__}")


class Cascade:
    """Edge first, cloud when unsure: `Cascade(edge, cloud, threshold, temperature, timeout_s).answer(...)`.

    edge: a DevicePipeline, a LiteModel built with LiteModel.from_package(package, "vqa"), or a package
    folder. cloud: a `mindvl.serving.Client` of the predict method (of generate, for a generative edge), or
    an address ("http://host:port" for REST, "host:port" for gRPC) for servable `servable`. threshold: the
    calibrated confidence at or above which the device answers (0: always; > 1: never). temperature:
    divides the edge's vqa logits before the softmax (> 0; 1: uncalibrated; a generated answer's confidence
    is its mean token probability, unscaled). timeout_s: how long to wait for the cloud before answering
    from the edge (a Client made here gives up CLIENT_GRACE_S later, so the cascade's own deadline is the one
    that answers; a given Client keeps its own timeout for the request; a stream waits as long as the
    Client's timeout for each token).
    """

    def __init__(self, edge: Union[DevicePipeline, LiteModel, str, Path], cloud: Any, threshold: float = 0.5,
                 temperature: float = 1.0, timeout_s: float = 5.0, servable: str = "vqa") -> None:
        from mindvl.serving.client import Client

        for name, value, low in (("threshold", threshold, 0.0), ("temperature", temperature, None),
                                 ("timeout_s", timeout_s, None)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or \
                    (value < low if low is not None else value <= 0):
                expected = "a number >= 0 (0: always the edge, > 1: always the cloud)" if low is not None \
                    else "a number > 0"
                raise LiteError(f"Cascade {name}={value!r}: expected {expected}")
        if not isinstance(cloud, str) and not hasattr(cloud, "infer"):
            raise LiteError(f"cloud: expected a mindvl.serving.Client or an address, got {type(cloud).__name__}")
        self._owns_edge = not isinstance(edge, DevicePipeline)  # made here: closed here
        self.edge = _edge_pipeline(edge)
        method = "generate" if self.edge.generative else "predict"
        self.cloud = Client(cloud, servable, method, timeout=float(timeout_s) + CLIENT_GRACE_S) \
            if isinstance(cloud, str) else cloud
        self.threshold, self.temperature, self.timeout_s = float(threshold), float(temperature), float(timeout_s)
        self.counts = {source: 0 for source in SOURCES}  # answers given per source since the cascade was made
        self._cloud_pool = ThreadPoolExecutor(CLOUD_THREADS, thread_name_prefix="mindvl-cloud")

    @classmethod
    def from_calibration(cls, calibration: Union[str, Path], edge: Union[DevicePipeline, LiteModel, str, Path],
                         cloud: Any, timeout_s: float = 5.0, servable: str = "vqa",
                         threshold: Optional[float] = None) -> "Cascade":
        """A cascade with the temperature and threshold of `mindvl lite calibrate`'s file (or of the
        calibration.json in a package folder); `threshold` overrides the calibrated one. The file must
        belong to the edge's package (its vqa graph's sha256), else CalibrationError."""
        from mindvl.lite.calibration import load_calibration

        fitted = load_calibration(calibration)
        pipeline = _edge_pipeline(edge)
        try:
            fitted.check_package(pipeline.manifest, pipeline.package)
            cascade = cls(pipeline, cloud, fitted.threshold if threshold is None else threshold, fitted.temperature,
                          timeout_s, servable)
        except BaseException:
            if pipeline is not edge:
                pipeline.close()
            raise
        cascade._owns_edge = pipeline is not edge
        return cascade

    # -- answering
    def calibrated(self, logits: np.ndarray) -> float:
        """The edge's calibrated confidence: max softmax(logits / temperature)."""
        return float(softmax(logits, self.temperature).max())

    def answer(self, image: bytes, question: Optional[str] = None, audio: Optional[bytes] = None) -> CascadeAnswer:
        """One question; InputError (from the device's preprocessing) names a bad input: the cloud would
        refuse it too."""
        start = time.perf_counter()
        edge = self.edge.answer(image, question, audio)
        return self._route([{"image": image, "question": question, "audio": audio}], [edge], start)[0]

    def answer_batch(self, items: Sequence[Mapping[str, Any]]) -> List[Union[CascadeAnswer, InputError]]:
        """Many questions ({"image", "question", "audio"} each): the device answers all of them, then the
        unsure ones go to the cloud in one request. A bad item's place holds its InputError."""
        start = time.perf_counter()
        return self._route(items, self.edge.answer_batch(items), start)

    def _route(self, items: Sequence[Mapping[str, Any]], edge: Sequence[Union[DeviceAnswer, InputError]],
               start: float) -> List[Union[CascadeAnswer, InputError]]:
        """Keep the confident edge answers, replace the others with the cloud's (or flag the fallback)."""
        results: List[Union[CascadeAnswer, InputError]] = []
        unsure = []
        for index, answer in enumerate(edge):
            if isinstance(answer, InputError):
                results.append(answer)
                continue
            confidence = self.calibrated(answer.logits)
            results.append(CascadeAnswer(answer.answer, confidence, "edge", answer.answer, confidence,
                                         timings={"edge": answer.timings["total"]}))
            if confidence < self.threshold:
                unsure.append(index)
        if unsure:
            cloud_start = time.perf_counter()
            replies = self._ask_cloud([self._instance(items[i]) for i in unsure])
            cloud_seconds = time.perf_counter() - cloud_start
            for index, reply in zip(unsure, replies):
                result = results[index]
                result.timings["cloud"] = cloud_seconds
                if isinstance(reply, str):
                    result.source, result.cloud_error = "edge_fallback", reply
                else:
                    result.source, result.answer, result.confidence = "cloud", reply[0], reply[1]
        total = time.perf_counter() - start
        for result in results:
            if isinstance(result, CascadeAnswer):
                result.timings["total"] = total
                self.counts[result.source] += 1
        return results

    @staticmethod
    def _instance(item: Mapping[str, Any]) -> Dict[str, Any]:
        """The server's predict inputs: all three, '' and b'' for the modality not given."""
        question, audio = item.get("question"), item.get("audio")
        return {"image": item["image"], "question": "" if question is None else question,
                "audio": b"" if audio is None else audio}

    def _ask_cloud(self, instances: List[Dict[str, Any]]) -> List[Union[tuple, str]]:
        """(answer, confidence) per instance, or the error message of an instance (or of the whole request)
        the cloud did not answer within timeout_s."""
        future = self._cloud_pool.submit(self.cloud.infer, instances)
        try:
            replies = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            return [f"the cloud did not answer within {self.timeout_s:g} s (timeout_s)"] * len(instances)
        except Exception as exc:  # ServingError, an encoding error: whatever it is, the edge answers
            return [f"{type(exc).__name__}: {exc}"] * len(instances)
        results: List[Union[tuple, str]] = []
        for reply in replies:
            if "error" in reply:
                results.append(f"the cloud failed this question: {reply['error']}")
            elif "answer" not in reply:
                results.append(f"the cloud's reply has no 'answer' (it has {', '.join(sorted(reply))}); is "
                               f"the cloud's servable a mindvl vqa package?")
            else:
                confidence = reply.get("confidence")
                results.append((str(reply["answer"]), float(confidence) if confidence is not None else float("nan")))
        return results

    # -- one instance as a REST client sends it (the demo page's `POST /cascade`, mindvl.serving.demo)
    def describe(self) -> Dict[str, Any]:
        """The edge package's name, the cloud method and servable, and the threshold."""
        return {"edge": self.edge.package.name, "method": "generate" if self.edge.generative else "predict",
                "servable": getattr(self.cloud, "servable_name", ""), "threshold": self.threshold}

    def ask(self, instance: Mapping[str, Any]) -> Dict[str, Any]:
        """One instance with the cloud method's inputs (predict: image, question, audio; generate: image, text,
        audio, max_tokens) -> CascadeAnswer's fields, or a generated answer's (text, confidence, source,
        edge_text, cloud_error, finish_reason, timings). ValueError names an input the method does not take."""
        inputs = ("image", "text", "audio", "max_tokens") if self.edge.generative else ("image", "question", "audio")
        unknown = sorted(set(instance) - set(inputs))
        if unknown:
            raise ValueError(f"input {unknown[0]!r}: the cascade's {self.describe()['method']} takes "
                             f"{', '.join(inputs)}")
        image, audio = instance.get("image") or None, instance.get("audio") or None
        if not self.edge.generative:
            return self.answer(image, instance.get("question") or "", audio).to_dict()
        limit = instance.get("max_tokens")
        answer = self.generate(image, instance.get("text") or None, audio,
                               **({"max_new_tokens": int(limit)} if limit is not None else {}))
        return {"text": answer.text, "confidence": answer.confidence, "source": answer.source,
                "edge_text": answer.edge_text, "cloud_error": answer.cloud_error, "finish_reason": answer.finish,
                "timings": answer.timings}

    # -- generating (a generative package at the edge)
    @staticmethod
    def generation_confidence(generation: Generation) -> float:
        """A generated answer's confidence: exp(mean token log-probability), the geometric mean of its token
        probabilities under the model."""
        return float(np.exp(generation.mean_logprob))

    def stream(self, image: Optional[bytes] = None, question: Optional[str] = None, audio: Optional[bytes] = None,
               **settings) -> Iterator[CascadeDelta]:
        """One question answered in words: the edge's answer when its confidence is >= threshold, else the
        cloud's, streamed as it comes (see the module docstring). settings: SamplingConfig's, sent to the
        cloud under generate's names. InputError / ConfigError (from the device) name a bad input or setting."""
        record = CascadeGeneration("")
        yield from self._stream(image, question, audio, settings, record)

    def generate(self, image: Optional[bytes] = None, question: Optional[str] = None, audio: Optional[bytes] = None,
                 **settings) -> CascadeGeneration:
        """`stream`'s answer whole (CascadeGeneration)."""
        record = CascadeGeneration("")
        for delta in self._stream(image, question, audio, settings, record):
            record.add(delta)
            record.source, record.cloud_error = delta.source, delta.cloud_error
        return record

    def _stream(self, image, question, audio, settings: dict, record: CascadeGeneration) -> Iterator[CascadeDelta]:
        unknown = sorted(set(settings) - set(CLOUD_SETTINGS))
        if unknown:
            raise LiteError(f"{', '.join(unknown)}: the cloud's generate takes no such setting; the cascade passes "
                            f"{', '.join(CLOUD_SETTINGS)}")
        start = time.perf_counter()
        edge = self.edge.generate(image, question, audio, **settings)
        record.confidence, record.edge_text = self.generation_confidence(edge), edge.text
        record.prompt_tokens = edge.prompt_tokens
        record.timings["edge"] = time.perf_counter() - start
        source, error = "edge", None
        if record.confidence < self.threshold:
            instance = {name: value for name, value in (("image", image), ("text", question), ("audio", audio))
                        if value}
            instance.update({CLOUD_SETTINGS[name]: v for name, v in settings.items() if v is not None})
            streamed = 0
            try:
                for delta in self.cloud.stream(instance):
                    streamed += 1
                    yield CascadeDelta(delta["text"], delta["token"], delta["logprob"], "cloud",
                                       delta["finish_reason"] or None)
            except Exception as exc:  # ServingError, a timeout: whatever it is, the edge answers if it still can
                if streamed:
                    raise LiteError(f"the cloud's answer broke off after {streamed} tokens: {exc}") from exc
                source, error = "edge_fallback", f"{type(exc).__name__}: {exc}"
            else:
                source = "cloud"
        if source != "cloud":
            yield from self._edge_deltas(edge, source, error)
        self.counts[source] += 1
        record.timings["total"] = time.perf_counter() - start

    @staticmethod
    def _edge_deltas(edge: DeviceGeneration, source: str, error: Optional[str]) -> Iterator[CascadeDelta]:
        """The edge's answer as deltas: its text on the first token (the answer is whole already)."""
        for index, (token, logprob) in enumerate(zip(edge.tokens, edge.logprobs)):
            last = index == len(edge.tokens) - 1
            yield CascadeDelta(edge.text if index == 0 else "", token, logprob, source, edge.finish if last else None,
                               error)

    def close(self) -> None:
        """Stop the cloud threads (a request still in flight ends at the Client's own timeout) and the
        edge pipeline when the cascade made it."""
        self._cloud_pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_edge:
            self.edge.close()

    def __enter__(self) -> "Cascade":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
