"""The classifier's quickstart (the tiny recipe): build data, train, evaluate, write and verify the model
package (with its Lite 2.0 graphs), serve it and query it over REST and gRPC, answer on the device runtime and
through the edge-cloud cascade, then summarise."""
import json
import shutil
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Sequence

from mindvl.config import Config
from mindvl.quickstart.plots import plots_row, write_plots
from mindvl.quickstart.report import nonzero, pct, stage, table

QUESTIONS = 8  # asked of the server, the device and the cascade: half typed, half spoken
CALIBRATION_QUESTIONS = 300  # the cascade's calibration: the test questions after the asked ones


def run_classifier_quickstart(work: Path, cfg: Config, progress: bool = True) -> Dict[str, Any]:
    """The whole path of a classifier recipe in `work` (cfg's data.root and train.output_dir lie inside it)."""
    from mindvl.data.build.builder import build_dataset
    from mindvl.data.reading.examples import query_examples
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.eval import evaluate
    from mindvl.lite.calibration import load_calibration
    from mindvl.model_factory import load_model
    from mindvl.train import train

    start = time.perf_counter()
    stage("1/6 build data")
    report = build_dataset(cfg, progress=progress)
    stage("2/6 train")
    result = train(cfg, progress=progress)
    stage("3/6 evaluate")
    cfg, model, _ = load_model(result.output_dir)
    metrics = evaluate(cfg, model, progress=progress)
    stage("4/6 export the model package (+ its Lite 2.0 graphs) and verify it")
    cfg, model, source = load_model(result.output_dir)
    check = package_and_check(cfg, model, source, work / "package",
                              PackageOptions(force=True, progress=progress, lite2_batch=1))
    examples = query_examples(cfg.data.root, QUESTIONS + CALIBRATION_QUESTIONS)
    asked = [{"image": e.image, "question": e.question if i % 2 == 0 else "", "audio": b"" if i % 2 == 0 else e.audio}
             for i, e in enumerate(examples[:QUESTIONS])]
    with _served(work / "package", work / "servables") as (server, version):
        stage("5/6 serve the package (mindvl serve) and query it over REST and gRPC")
        served = query_server(server, version, asked, examples[:QUESTIONS])
        stage("6/6 answer on the device (MindSpore Lite 2.0, C++ runner) and through the edge-cloud cascade")
        device = run_on_device(work / "package", cfg.data.root, server.rest_url, asked, examples,
                               served["answers"]["rest"])
    plots = write_plots(work, cfg, report.to_dict(), [("training", result.output_dir)],
                        load_calibration(work / "package").to_dict())
    summary = {"data": report.to_dict(), "train": asdict(result), "eval": metrics, "export": check,
               "serve": served, "device": device, "plots": plots, "wall_seconds": round(time.perf_counter() - start, 1),
               "try_it": f"mindvl serve --servable-dir {work / 'servables'} --cascade-edge {work / 'package'}, "
                         f"then open http://127.0.0.1:1500/ (the demo page)"}
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(format_summary(summary))
    return summary


@contextmanager
def _served(package: Path, servables: Path):
    """Deploy the package as servable `vqa` and serve it on free local ports -> (server, version)."""
    from mindvl.serving.servable import deploy
    from mindvl.serving.serve_config import ServeConfig
    from mindvl.serving.server import BackgroundServer

    shutil.rmtree(servables, ignore_errors=True)  # the workdir's own: a previous run's package is replaced
    version, _ = deploy(package, servables, "vqa")
    with BackgroundServer(ServeConfig(servable_dir=str(servables), port=0, grpc_port=0, poll_s=0)) as server:
        yield server, version


def query_server(server, version: int, instances: Sequence[dict], examples: Sequence) -> Dict[str, Any]:
    """Ask every instance over REST and over gRPC -> the answers, their accuracy and latencies."""
    from mindvl.serving import Client

    answers, latencies = {}, {}
    for protocol, address in (("rest", server.rest_url), ("grpc", server.grpc_target)):
        client = Client(address, "vqa", "predict")
        answers[protocol], latencies[protocol] = [], []
        for instance in instances:
            begin = time.perf_counter()
            reply = client.infer(instance)[0]
            latencies[protocol].append(1000 * (time.perf_counter() - begin))
            answers[protocol].append(reply.get("answer", f"error: {reply.get('error')}"))
    correct = sum(a == e.answer for a, e in zip(answers["rest"], examples))
    return {"servable": f"vqa version {version}", "questions": len(instances), "correct": correct,
            "protocols_agree": answers["rest"] == answers["grpc"], "answers": answers,
            "median_ms": {p: round(statistics.median(v), 1) for p, v in latencies.items()}}


def run_on_device(package: Path, data_root: str, cloud: str, instances: Sequence[dict], examples: Sequence,
                  server_answers: Sequence[str]) -> Dict[str, Any]:
    """The same questions on the device: the Python device pipeline on the first available runtime (Lite
    2.0 where it can be prepared), the C++ runner on the typed ones, and the cascade with the server as
    its cloud, calibrated on the test questions after the asked ones."""
    from mindvl.deploy.calibrate import calibrate
    from mindvl.lite.calibration import CALIBRATION_FILE
    from mindvl.lite.cascade import Cascade
    from mindvl.lite.device import DevicePipeline

    asked = examples[:len(instances)]
    with DevicePipeline(package) as pipeline:
        answers, latencies = [], []
        for instance in instances:
            begin = time.perf_counter()
            answers.append(pipeline.answer(**instance).answer)
            latencies.append(1000 * (time.perf_counter() - begin))
        held_out = examples[len(instances):] or asked  # a tiny data set has no others: then in-sample
        fitted = calibrate(package, data_root, split="test", target_cloud_rate=0.3, pipeline=pipeline,
                           examples=held_out)
        fitted.save(Path(package) / CALIBRATION_FILE)  # where `mindvl lite calibrate` puts it: cascade.png draws it
        with Cascade(pipeline, cloud, fitted.threshold, fitted.temperature) as cascade:
            routed = [cascade.answer(**instance) for instance in instances]
        backend = pipeline.backend
    device = {"backend": backend, "questions": len(instances), "answers": answers,
              "correct": sum(a == e.answer for a, e in zip(answers, asked)),
              "same_as_server": sum(a == s for a, s in zip(answers, server_answers)),
              "median_ms": round(statistics.median(latencies), 1),
              "cascade": {"calibrated_on": fitted.examples, "temperature": round(fitted.temperature, 4),
                          "threshold": round(fitted.threshold, 4),
                          "sources": {source: sum(r.source == source for r in routed)
                                      for source in ("edge", "cloud", "edge_fallback")},
                          "correct": sum(r.answer == e.answer for r, e in zip(routed, asked))}}
    device["runner"] = _runner_answers(package, instances, answers)
    return device


def _runner_answers(package: Path, instances: Sequence[dict], device_answers: Sequence[str]) -> Dict[str, Any]:
    """The C++ runner on the typed questions, or why it could not run."""
    import tempfile

    from mindvl.lite import lite2_runtime
    from mindvl.lite.cpp_runner import RunnerFailed, run_runner

    typed = [(i, instance) for i, instance in enumerate(instances) if instance["question"]]
    results = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for i, instance in typed:
                image = Path(scratch) / f"question{i}.png"
                image.write_bytes(instance["image"])
                results.append(run_runner(package, image, instance["question"]))
    except (lite2_runtime.Lite2Unavailable, RunnerFailed) as exc:
        return {"ran": False, "reason": str(exc)}
    return {"ran": True, "questions": len(typed),
            "same_as_device": sum(r["answer"] == device_answers[i] for r, (i, _) in zip(results, typed)),
            "median_predict_ms": round(statistics.median(r["predict_ms"] for r in results), 2)}


def format_summary(summary: Dict[str, Any]) -> str:
    data, train, metrics, export, serve, device = (summary[k] for k in ("data", "train", "eval", "export", "serve",
                                                                       "device"))
    checks = export["verify"]["checks"]
    lite2 = len({c["graph"] for c in checks if c["graph"].startswith("lite2/")})
    cascade, runner = device["cascade"], device["runner"]
    baseline = metrics["baseline"]
    rows: List[List[str]] = [
        ["data", f"train {data['counts']['train']['examples']} / test {data['counts']['test']['examples']} "
                 f"examples, {data['counts']['speech']['clips']} speech clips, "
                 f"{sum(data['skips'].values())} skipped ({nonzero(data['skips'])})"],
        ["compile", f"{train['compile_seconds']:.1f} s (first step)"],
        ["train", f"{train['steps']} steps, {train['train_seconds']:.0f} s, {train['samples_per_second']:.0f} samples/s, "
                  f"loss {train['first_losses'].get('loss', float('nan')):.3f} -> {train['final_losses'].get('loss', float('nan')):.3f}"],
        ["VQA, text question", f"{pct(metrics['vqa_text']['accuracy'])} "
                               f"(generated answer {pct(metrics['vqa_text']['generated_accuracy'])})"],
        ["VQA, spoken question", f"{pct(metrics['vqa_audio']['accuracy'])} "
                                 f"(generated answer {pct(metrics['vqa_audio']['generated_accuracy'])}), unseen voices"],
        ["majority baseline", f"{pct(baseline['accuracy'])} (always '{baseline['answer']}')"],
        ["image -> caption", f"R@1 {pct(metrics['image_to_caption']['R@1'])}, R@5 {pct(metrics['image_to_caption']['R@5'])}"],
        ["speech -> text", f"R@1 {pct(metrics['audio_to_text']['R@1'])}, R@5 {pct(metrics['audio_to_text']['R@5'])}"],
        ["model package", f"{export['package']}: {len({c['graph'] for c in checks}) - lite2} MindIR graphs + {lite2} "
                          f"Lite 2.0 graphs verified, max |diff| {max(c['max_abs_diff'] for c in checks):.1e}"
                          + "".join(f"; {note}" for note in export["verify"].get("notes", []))],
        ["serving", f"{serve['questions']} questions (half spoken) over REST and gRPC: {serve['correct']} answered "
                    f"right, protocols {'agree' if serve['protocols_agree'] else 'DISAGREE'}, median "
                    f"{serve['median_ms']['rest']:.0f} ms (REST) / {serve['median_ms']['grpc']:.0f} ms (gRPC)"],
        ["device", f"the same {device['questions']} questions on {device['backend']}: {device['correct']} right, "
                   f"{device['same_as_server']}/{device['questions']} answers as the server's, median "
                   f"{device['median_ms']:.1f} ms"],
        ["C++ runner", f"{runner['questions']} typed questions: {runner['same_as_device']}/{runner['questions']} "
                       f"answers as the device pipeline's, predict {runner['median_predict_ms']:.1f} ms"
         if runner["ran"] else f"not run: {runner['reason']}"],
        ["cascade", f"T {cascade['temperature']:.3f}, threshold {cascade['threshold']:.3f} (30% cloud calls on "
                    f"{cascade['calibrated_on']} other test questions): {cascade['sources']['edge']} edge, "
                    f"{cascade['sources']['cloud']} cloud, {cascade['sources']['edge_fallback']} fallback; "
                    f"{cascade['correct']} right"],
        plots_row(summary["plots"]),
        ["wall time", f"{summary['wall_seconds']:.0f} s"],
        ["try it", summary["try_it"]],
    ]
    return table("mindvl quickstart summary", rows)
