"""`mindvl lite calibrate`: the temperature and threshold of an edge-cloud cascade, fitted on labelled data.

1. The device pipeline answers every question of a split (validation by default: the training images the
   run held out) and keeps the answer logits.
2. The temperature T minimises the negative log-likelihood of the true answers under softmax(logits / T)
   (a golden-section search on log T over [0.05, 20]; NLL is convex in 1/T, so the search finds the
   minimum; T = 1 is kept if it is as good).
3. Every threshold that changes which questions go to the cloud gives a row of the curve: threshold,
   cloud rate (questions whose calibrated confidence is below it), edge accuracy on the questions the device
   answers, and overall accuracy with the cloud's answers for the others: measured by asking the cloud
   (`cloud=`), else assuming the cloud is right with probability `cloud_accuracy` (1: always right).
4. The threshold is the one for the target cloud-call rate (the round(rate * n) least confident questions go
   to the cloud; the threshold sits halfway between two neighbouring confidences), or the lowest cloud rate
   whose overall accuracy reaches the target accuracy.
5. The latency the curve costs: the device's and the cloud's (when `cloud=` is asked) median time to answer one
   question alone, over the first LATENCY_QUESTIONS questions (a classifier's questions are answered again one
   at a time for it; a generated answer is timed as it is generated), so that the expected per-question latency
   at a cloud rate r is edge + r x cloud (the cascade asks the cloud after the device).
The result is a JSON file (`calibration.json` beside the package's manifest, like evaluation.json, or
anywhere; lite/calibration.py) that `Cascade.from_calibration` reads; it records the package's vqa graph hash so it is never
applied to another model.
"""
import datetime
import json
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from mindvl.config import config_from_dict
from mindvl.data.reading.examples import QueryExample, query_examples, wav_bytes
from mindvl.data.reading.splits import LOADER_SPLITS, split_rows
from mindvl.data.records import SPEECH_TABLE, read_split, read_table
from mindvl.data.root import load_meta
from mindvl.engine.package_graphs import SECTION
from mindvl.errors import InputError
from mindvl.lite.calibration import MODALITIES, Calibration, CalibrationError, PathLike, example_item, package_identity
from mindvl.lite.device import DevicePipeline, softmax
from mindvl.package_reader import read_manifest
from mindvl.serving.client import Client
from mindvl.serving.register import GENERATE

TEMPERATURE_BOUNDS = (0.05, 20.0)
CLOUD_BATCH = 16  # questions per request when the curve asks a real cloud
LATENCY_QUESTIONS = 16  # questions timed one at a time on the device and on the cloud


# ----------------------------------------------------------------------------- temperature

def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of `labels` (int (N,)) under softmax(logits / T), logits (N, classes)."""
    scaled = np.asarray(logits, np.float64) / float(temperature)
    top = scaled.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(scaled - top).sum(axis=1))
    return float(np.mean(log_norm - scaled[np.arange(len(labels)), labels]))


def fit_temperature(logits: np.ndarray, labels: np.ndarray, bounds=TEMPERATURE_BOUNDS,
                    tolerance: float = 1e-5) -> float:
    """The temperature minimising `nll` (golden-section search on log T within `bounds`), or 1.0 when no
    temperature does better than leaving the logits as they are."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels, np.int64)
    if logits.ndim != 2 or len(logits) == 0 or labels.shape != (len(logits),):
        raise CalibrationError(f"fit_temperature: expected logits (N, classes) and N labels with N > 0, got "
                               f"{list(logits.shape)} and {list(labels.shape)}")
    golden = (math.sqrt(5) - 1) / 2
    low, high = math.log(bounds[0]), math.log(bounds[1])
    a, b = high - golden * (high - low), low + golden * (high - low)
    fa, fb = nll(logits, labels, math.exp(a)), nll(logits, labels, math.exp(b))
    while high - low > tolerance:
        if fa <= fb:  # the minimum lies in [low, b]
            high, b, fb = b, a, fa
            a = high - golden * (high - low)
            fa = nll(logits, labels, math.exp(a))
        else:
            low, a, fa = a, b, fb
            b = low + golden * (high - low)
            fb = nll(logits, labels, math.exp(b))
    best = math.exp((low + high) / 2)
    return best if nll(logits, labels, best) < nll(logits, labels, 1.0) else 1.0


# ----------------------------------------------------------------------------- thresholds

def candidate_thresholds(confidences: np.ndarray) -> List[float]:
    """Every threshold that sends a different set of questions to the cloud, ascending: 0 (none), the
    midpoints between neighbouring distinct confidences, and just above the largest (all). Questions of
    equal confidence go together."""
    distinct = np.unique(np.asarray(confidences, np.float64))  # sorted
    if distinct.size == 0:
        return []
    return [0.0, *((distinct[:-1] + distinct[1:]) / 2).tolist(), float(np.nextafter(distinct[-1], np.inf))]


def threshold_for_cloud_rate(confidences: np.ndarray, rate: float) -> float:
    """The threshold that sends the round(rate * n) least confident questions to the cloud (ties may keep
    some of them on the edge)."""
    _check_fraction("target cloud rate", rate)
    ordered = np.sort(np.asarray(confidences, np.float64))
    if ordered.size == 0:
        raise CalibrationError("target cloud rate: no confidences to place a threshold between")
    k = int(round(rate * ordered.size))
    if k == 0:
        return 0.0
    if k == ordered.size:
        return float(np.nextafter(ordered[-1], np.inf))
    return float((ordered[k - 1] + ordered[k]) / 2)


def curve_row(threshold: float, confidences: np.ndarray, edge_correct: np.ndarray,
              cloud_correct: np.ndarray) -> Dict[str, Optional[float]]:
    """What the cascade does at `threshold` on these questions: cloud_rate, edge_accuracy (on the questions
    the device answers; None when it answers none) and accuracy (overall). cloud_correct: per question,
    1/0 when measured, or the assumed cloud accuracy."""
    to_cloud = confidences < threshold
    answered = ~to_cloud
    n = len(confidences)
    edge_accuracy = float(edge_correct[answered].mean()) if answered.any() else None
    accuracy = float((edge_correct[answered].sum() + cloud_correct[to_cloud].sum()) / n)
    return {"threshold": float(threshold), "cloud_rate": float(to_cloud.sum() / n), "edge_accuracy": edge_accuracy,
            "accuracy": accuracy}


def accuracy_curve(confidences: np.ndarray, edge_correct: np.ndarray,
                   cloud_correct: Union[float, np.ndarray]) -> List[Dict[str, Optional[float]]]:
    """curve_row at every candidate threshold, by increasing threshold (so by increasing cloud rate)."""
    confidences = np.asarray(confidences, np.float64)
    edge_correct = np.asarray(edge_correct, np.float64)
    cloud = np.broadcast_to(np.asarray(cloud_correct, np.float64), confidences.shape)
    return [curve_row(t, confidences, edge_correct, cloud) for t in candidate_thresholds(confidences)]


def threshold_for_accuracy(curve: Sequence[Dict[str, Optional[float]]], accuracy: float) -> Dict[str, Optional[float]]:
    """The curve row with the lowest cloud rate whose overall accuracy reaches `accuracy`."""
    _check_fraction("target accuracy", accuracy)
    reaching = [row for row in curve if row["accuracy"] >= accuracy - 1e-12]
    if not reaching:
        best = max(curve, key=lambda row: row["accuracy"])
        raise CalibrationError(f"target accuracy {accuracy:g}: no threshold reaches it on this data (the best is "
                               f"{best['accuracy']:.4f} at cloud rate {best['cloud_rate']:.4f}); lower the target "
                               f"or use --target-cloud-rate")
    return min(reaching, key=lambda row: (row["cloud_rate"], row["threshold"]))


def _check_fraction(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise CalibrationError(f"{what} {value!r}: expected a number in [0, 1]")
    return float(value)


# ----------------------------------------------------------------------------- labelled questions

def split_examples(package: PathLike, root: PathLike, split: str = "validation", limit: int = 0) -> list:
    """Questions of a built data set as a client sends them (mindvl.data.reading.examples.QueryExample): "test" the
    test split with the test voice; "validation" / "train" the rows of the train table the package's training
    config held out / kept, with the first training voice's clip (validation questions are training
    questions, as the loader has it). limit: the first `limit` (0: all)."""
    if split not in LOADER_SPLITS:
        raise CalibrationError(f"split {split!r}: expected one of {', '.join(LOADER_SPLITS)}")
    if split == "test":
        return query_examples(root, limit)
    cfg = config_from_dict(json.loads((Path(package) / "config.json").read_text()))
    cfg.data.root = str(root)
    rows = split_rows(cfg, split)[:limit or None]
    meta = load_meta(root)
    clips: Dict[int, bytes] = {}
    for row in read_table(Path(root) / SPEECH_TABLE, ["question_id", "split", "pcm"]):
        if row["split"] == "train":
            clips.setdefault(int(row["question_id"]), bytes(row["pcm"]))
    table = read_split(root, "train", ["image", "question_id", "answer_id"])
    rate = meta["preprocess"]["sample_rate"]
    return [QueryExample(bytes(table[i]["image"]), meta["questions"][int(table[i]["question_id"])],
                         wav_bytes(clips.get(int(table[i]["question_id"]), b""), rate),
                         meta["answers"][int(table[i]["answer_id"])]) for i in rows]


def edge_logits(pipeline, examples: Sequence, modality: str):
    """(logits float32 (n, classes), label index per answered example, the skipped items' errors) of the
    device pipeline on `examples`; bad items are skipped and reported, never fatal."""
    index = {label: i for i, label in enumerate(pipeline.labels)}
    unknown = sorted({e.answer for e in examples} - set(index))
    if unknown:
        raise CalibrationError(f"answers {unknown[:5]} are not among the package's labels: the data set is not the "
                               f"one the package was trained on")
    results = pipeline.answer_batch([example_item(e, modality) for e in examples])
    kept = [(r, e) for r, e in zip(results, examples) if not isinstance(r, InputError)]
    skipped = [str(r) for r in results if isinstance(r, InputError)]
    if not kept:
        raise CalibrationError(f"no usable questions: {len(examples)} given, {len(skipped)} failed"
                               + (f" (first: {skipped[0]})" if skipped else "") + "; check --data and --split")
    logits = np.stack([r.logits for r, _ in kept]).astype(np.float32)
    labels = np.asarray([index[e.answer] for _, e in kept], np.int64)
    return logits, labels, skipped, [e for _, e in kept]


def edge_generations(pipeline, examples: Sequence, modality: str, seconds: Optional[List[float]] = None):
    """(confidence: exp(mean token log-probability) per answered example, 1/0 the answer is right, the skipped
    items' errors, the answered examples) of a generative package's device pipeline, answers generated greedily
    as the evaluation generates them and compared after the same normalisation; bad items are skipped, never
    fatal. `seconds` (a list) gets each answer's whole time (timings["total"])."""
    from mindvl.eval.generated_answers import ANSWER_TOKENS, normalise_answer

    confidences, correct, skipped, kept = [], [], [], []
    seconds = [] if seconds is None else seconds
    for example in examples:
        try:
            answer = pipeline.generate(**example_item(example, modality), max_new_tokens=ANSWER_TOKENS)
        except InputError as error:
            skipped.append(str(error))
            continue
        confidences.append(math.exp(answer.mean_logprob))
        seconds.append(answer.timings["total"])
        correct.append(float(normalise_answer(answer.text) == normalise_answer(example.answer)))
        kept.append(example)
    if not kept:
        raise CalibrationError(f"no usable questions: {len(examples)} given, {len(skipped)} failed"
                               + (f" (first: {skipped[0]})" if skipped else "") + "; check --data and --split")
    return np.asarray(confidences), np.asarray(correct), skipped, kept


def _cloud_answer(reply: Dict[str, Any]) -> Optional[str]:
    """The answer of a cloud reply (predict's `answer`, generate's `text`), normalised; None when it failed."""
    from mindvl.eval.generated_answers import normalise_answer

    if "error" in reply:
        return None
    return normalise_answer(str(reply["text"])) if "text" in reply else reply.get("answer")


def _generative_cloud(cloud) -> bool:
    return getattr(cloud, "method_name", "predict") == GENERATE


def _cloud_instance(cloud, example, modality: str) -> Dict[str, Any]:
    """One question as the cloud's method takes it: predict's item, or generate's names (the question is its
    `text`; empty fields are no attachment)."""
    item = example_item(example, modality)
    if not _generative_cloud(cloud):
        return item
    return {"text": item["question"], **{k: item[k] for k in ("image", "audio") if item[k]}}


def cloud_correctness(cloud, examples: Sequence, modality: str, edge_correct: np.ndarray) -> Dict[str, Any]:
    """Ask the cloud (a Client) every question; -> {"correct": per question 1/0, "failed": count}. A
    question the cloud fails counts as the cascade would answer it: with the edge's answer."""
    from mindvl.eval.generated_answers import normalise_answer

    answers: List[Optional[str]] = []
    for start in range(0, len(examples), CLOUD_BATCH):
        chunk = [_cloud_instance(cloud, e, modality) for e in examples[start:start + CLOUD_BATCH]]
        answers.extend(_cloud_answer(reply) for reply in cloud.infer(chunk))
    expected = [normalise_answer(e.answer) if _generative_cloud(cloud) else e.answer for e in examples]
    correct = np.asarray([edge if answer is None else float(answer == want)
                          for answer, want, edge in zip(answers, expected, edge_correct)], np.float64)
    return {"correct": correct, "failed": sum(a is None for a in answers)}


def _median_ms(seconds: Sequence[float]) -> Optional[float]:
    return float(np.median(seconds) * 1000) if len(seconds) else None


def edge_latency_ms(pipeline, examples: Sequence, modality: str) -> Optional[float]:
    """The device's median time (ms) to answer one question alone (its own timings["total"]: preprocessing and
    the graph), over the first LATENCY_QUESTIONS `examples`; a question it refuses is left out."""
    seconds = []
    for example in examples[:LATENCY_QUESTIONS]:
        try:
            seconds.append(pipeline.answer(**example_item(example, modality)).timings["total"])
        except InputError:
            continue
    return _median_ms(seconds)


def cloud_latency_ms(cloud, examples: Sequence, modality: str) -> Optional[float]:
    """The cloud's median time (ms) to answer one question alone: a request per question, as the cascade sends
    it, over the first LATENCY_QUESTIONS `examples` (a failed request is left out)."""
    seconds = []
    for example in examples[:LATENCY_QUESTIONS]:
        item = _cloud_instance(cloud, example, modality)
        start = time.perf_counter()
        reply = cloud.infer([item])[0]
        if "error" not in reply:
            seconds.append(time.perf_counter() - start)
    return _median_ms(seconds)


def calibrate(package: PathLike, root: PathLike, split: str = "validation", modality: str = "typed",
              target_cloud_rate: Optional[float] = None, target_accuracy: Optional[float] = None,
              cloud_accuracy: Optional[float] = None, cloud: Any = None, backend: str = "auto", limit: int = 0,
              pipeline=None, servable: str = "vqa", timeout_s: float = 60.0,
              examples: Optional[Sequence] = None) -> Calibration:
    """Fit the temperature and pick the threshold (module docstring) for one target: `target_cloud_rate`
    (default 0.3 when neither is given) or `target_accuracy`. The cloud's accuracy: asked of `cloud` (a
    Client or an address) on every question, else `cloud_accuracy` (default 1.0). `pipeline`: a
    DevicePipeline of `package` to use (else one is built on `backend`). `examples`: labelled questions
    (QueryExample) to use instead of the split's (`split` then only names them). Nothing is written (`.save`)."""
    if target_cloud_rate is not None and target_accuracy is not None:
        raise CalibrationError("give one target: --target-cloud-rate or --target-accuracy, not both")
    if cloud is not None and cloud_accuracy is not None:
        raise CalibrationError("give the cloud's accuracy one way: --cloud URL (measured) or --cloud-accuracy A")
    if target_accuracy is None:
        target_cloud_rate = 0.3 if target_cloud_rate is None else target_cloud_rate
        _check_fraction("target cloud rate", target_cloud_rate)
    else:
        _check_fraction("target accuracy", target_accuracy)
    cloud_accuracy = _check_fraction("cloud accuracy", 1.0 if cloud_accuracy is None else cloud_accuracy)
    if modality not in MODALITIES:
        raise CalibrationError(f"modality {modality!r}: expected one of {', '.join(MODALITIES)}")

    manifest = read_manifest(Path(package))
    examples = split_examples(package, root, split, limit) if examples is None else list(examples)
    if not examples:
        raise CalibrationError(f"split {split} of {root}: no questions; build the data set or choose another split")
    own = pipeline is None
    pipeline = pipeline or DevicePipeline(package, backend)
    generative = SECTION in manifest
    try:
        if generative:  # a generated answer's confidence is already a probability: no temperature to fit
            seconds: List[float] = []
            confidences, edge_correct, skipped, kept = edge_generations(pipeline, examples, modality, seconds)
            temperature, fitted_nll = 1.0, {}
            edge_ms = _median_ms(seconds[:LATENCY_QUESTIONS])
        else:
            logits, labels, skipped, kept = edge_logits(pipeline, examples, modality)
            edge_ms = edge_latency_ms(pipeline, kept, modality)  # after the batch: the graph is warm
    finally:
        if own:
            pipeline.close()
    if not generative:
        temperature = fit_temperature(logits, labels)
        probabilities = softmax(logits, temperature)
        confidences = probabilities.max(axis=1)
        edge_correct = (probabilities.argmax(axis=1) == labels).astype(np.float64)
        fitted_nll = {"temperature_1": nll(logits, labels, 1.0), "fitted": nll(logits, labels, temperature)}

    if cloud is not None:
        client = Client(cloud, servable, GENERATE if generative else "predict", timeout=timeout_s) \
            if isinstance(cloud, str) else cloud
        measured = cloud_correctness(client, kept, modality, edge_correct)
        cloud_correct = measured["correct"]
        cloud_info = {"address": getattr(client, "address", str(cloud)), "accuracy": float(cloud_correct.mean()),
                      "failed": measured["failed"], "measured": True}
        cloud_ms = cloud_latency_ms(client, kept, modality)  # after the curve's requests: the server is warm
    else:
        cloud_ms = None
        cloud_correct = np.full(len(kept), cloud_accuracy)
        cloud_info = {"accuracy": cloud_accuracy, "measured": False}
    curve = accuracy_curve(confidences, edge_correct, cloud_correct)
    if target_accuracy is None:
        threshold = threshold_for_cloud_rate(confidences, target_cloud_rate)
        chosen = curve_row(threshold, confidences, edge_correct, cloud_correct)
        target = {"cloud_rate": float(target_cloud_rate)}
    else:
        chosen = threshold_for_accuracy(curve, target_accuracy)
        threshold = chosen["threshold"]
        target = {"accuracy": float(target_accuracy)}
    return Calibration(temperature=float(temperature), threshold=float(threshold), package=package_identity(manifest),
                       target=target, split=split, modality=modality, examples=len(kept), skipped=skipped,
                       nll=fitted_nll,
                       cloud=cloud_info, chosen=chosen, curve=curve,
                       latency={"edge_ms": edge_ms, "cloud_ms": cloud_ms,
                                "questions": min(len(kept), LATENCY_QUESTIONS)},
                       created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


# ----------------------------------------------------------------------------- the report

def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"


def _latency_lines(c: Calibration) -> List[str]:
    edge, cloud = c.latency.get("edge_ms"), c.latency.get("cloud_ms")
    if edge is None:
        return []
    line = f"one question alone, median of {c.latency['questions']}: edge {edge:.1f} ms"
    if cloud is None:
        return [line + "; cloud not timed (--cloud URL measures it)"]
    return [line + f", cloud {cloud:.1f} ms: expected {edge + c.chosen['cloud_rate'] * cloud:.1f} ms a question at "
                   f"the chosen cloud rate"]


def format_report(calibration: Calibration, rows: int = 11) -> str:
    """The fit and the accuracy vs cloud-rate curve as text: about `rows` rows spread over the cloud rates
    (the full curve is in the file), the chosen threshold marked with *."""
    c = calibration
    cloud = (f"measured by asking {c.cloud.get('address')}: {c.cloud['accuracy']:.1%}"
             + (f", {c.cloud['failed']} failed" if c.cloud.get("failed") else "")
             if c.cloud.get("measured") else f"assumed {c.cloud['accuracy']:.1%}")
    target = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in c.target.items())
    lines = [f"calibrated on {c.examples} {c.split} questions ({c.modality})"
             + (f", {len(c.skipped)} skipped (bad input; first: {c.skipped[0]})" if c.skipped else ""),
             (f"temperature {c.temperature:.4f}: NLL {c.nll['temperature_1']:.4f} at T=1 -> {c.nll['fitted']:.4f}"
              if c.nll else "confidence: exp(mean token log-probability) of the generated answer (no temperature)"),
             f"threshold {c.threshold:.6f} for target {target}: cloud rate {c.chosen['cloud_rate']:.1%}, edge "
             f"accuracy {_percent(c.chosen['edge_accuracy'])}, overall {c.chosen['accuracy']:.1%}",
             f"cloud accuracy {cloud}", *_latency_lines(c), ""]
    wanted = np.linspace(0, 1, rows) if rows > 1 else [0.0]
    picked = {min(range(len(c.curve)), key=lambda i: abs(c.curve[i]["cloud_rate"] - rate)) for rate in wanted}
    header = f"  {'threshold':>10}  {'cloud rate':>10}  {'edge acc. (answered)':>20}  {'overall acc.':>12}"
    lines += [header, "  " + "-" * (len(header) - 2)]
    shown = [c.curve[i] for i in sorted(picked)]
    if not any(abs(row["threshold"] - c.threshold) < 1e-15 for row in shown):
        shown = sorted([*shown, c.chosen], key=lambda row: row["threshold"])
    for row in shown:
        mark = "*" if abs(row["threshold"] - c.threshold) < 1e-15 else " "
        lines.append(f"{mark} {row['threshold']:>10.6f}  {row['cloud_rate']:>10.1%}  "
                     f"{_percent(row['edge_accuracy']):>20}  {row['accuracy']:>12.1%}")
    return "\n".join(lines)
