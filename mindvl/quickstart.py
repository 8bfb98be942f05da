"""`mindvl quickstart`: build data, train the tiny recipe, evaluate, write and verify the model package, serve
it and query it over REST and gRPC, then summarise."""
import json
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Sequence

from mindvl.config import load_config


def run_quickstart(workdir: str = "mindvl_quickstart", config: str = "tiny", overrides: Sequence[str] = (),
                   progress: bool = True) -> Dict[str, Any]:
    from mindvl.data.build import build_dataset
    from mindvl.eval import evaluate, load_trained
    from mindvl.export.pipeline import PackageOptions, package_and_check
    from mindvl.export.source import load_source
    from mindvl.train import train

    start = time.perf_counter()
    work = Path(workdir)
    cfg = load_config(config, [f"data.root={work / 'data'}", f"train.output_dir={work / 'run'}", *overrides])
    _stage("1/5 build data")
    report = build_dataset(cfg, progress=progress)
    _stage("2/5 train")
    result = train(cfg, progress=progress)
    _stage("3/5 evaluate")
    cfg, model = load_trained(result.output_dir)
    metrics = evaluate(cfg, model, progress=progress)
    _stage("4/5 export the model package and verify it")
    cfg, model, source = load_source(result.output_dir)
    check = package_and_check(cfg, model, source, work / "package", PackageOptions(force=True, progress=progress))
    _stage("5/5 serve the package (mindvl serve) and query it over REST and gRPC")
    served = serve_and_query(work / "package", work / "servables", cfg.data.root)
    summary = {"data": report.to_dict(), "train": asdict(result), "eval": metrics, "export": check,
               "serve": served, "wall_seconds": round(time.perf_counter() - start, 1)}
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(format_summary(summary))
    return summary


def serve_and_query(package: Path, servables: Path, data_root: str, count: int = 8) -> Dict[str, Any]:
    """Deploy the package as servable `vqa`, serve it on free local ports and ask `count` test questions,
    half typed and half spoken, over REST and over gRPC; -> the answers, their accuracy and latencies."""
    from mindvl.data.examples import query_examples
    from mindvl.serving import Client
    from mindvl.serving.servable import deploy
    from mindvl.serving.server import BackgroundServer, ServeConfig

    shutil.rmtree(servables, ignore_errors=True)  # the workdir's own: a previous run's package is replaced
    version, _ = deploy(package, servables, "vqa")
    examples = query_examples(data_root, count)
    instances = [{"image": e.image, "question": e.question if i % 2 == 0 else "", "audio": b"" if i % 2 == 0 else e.audio}
                 for i, e in enumerate(examples)]
    answers, latencies = {}, {}
    with BackgroundServer(ServeConfig(servable_dir=str(servables), port=0, grpc_port=0, poll_s=0)) as server:
        for protocol, address in (("rest", server.rest_url), ("grpc", server.grpc_target)):
            client = Client(address, "vqa", "predict")
            answers[protocol], latencies[protocol] = [], []
            for instance in instances:
                begin = time.perf_counter()
                reply = client.infer(instance)[0]
                latencies[protocol].append(1000 * (time.perf_counter() - begin))
                answers[protocol].append(reply.get("answer", f"error: {reply.get('error')}"))
    correct = sum(a == e.answer for a, e in zip(answers["rest"], examples))
    return {"servable": f"vqa version {version}", "questions": len(examples), "correct": correct,
            "protocols_agree": answers["rest"] == answers["grpc"], "answers": answers,
            "median_ms": {p: round(statistics.median(v), 1) for p, v in latencies.items()}}


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _nonzero(counts: Dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in counts.items() if count) or "none"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def format_summary(summary: Dict[str, Any]) -> str:
    data, train, metrics, export, serve = (summary[k] for k in ("data", "train", "eval", "export", "serve"))
    baseline = metrics["baseline"]
    rows: List[List[str]] = [
        ["data", f"train {data['counts']['train']['examples']} / test {data['counts']['test']['examples']} "
                 f"examples, {data['counts']['speech']['clips']} speech clips, "
                 f"{sum(data['skips'].values())} skipped ({_nonzero(data['skips'])})"],
        ["compile", f"{train['compile_seconds']:.1f} s (first step)"],
        ["train", f"{train['steps']} steps, {train['train_seconds']:.0f} s, {train['samples_per_second']:.0f} samples/s, "
                  f"loss {train['first_losses'].get('loss', float('nan')):.3f} -> {train['final_losses'].get('loss', float('nan')):.3f}"],
        ["VQA, text question", f"{_pct(metrics['vqa_text']['accuracy'])} "
                               f"(generated answer {_pct(metrics['vqa_text']['generated_accuracy'])})"],
        ["VQA, spoken question", f"{_pct(metrics['vqa_audio']['accuracy'])} "
                                 f"(generated answer {_pct(metrics['vqa_audio']['generated_accuracy'])}), unseen voices"],
        ["majority baseline", f"{_pct(baseline['accuracy'])} (always '{baseline['answer']}')"],
        ["image -> caption", f"R@1 {_pct(metrics['image_to_caption']['R@1'])}, R@5 {_pct(metrics['image_to_caption']['R@5'])}"],
        ["speech -> text", f"R@1 {_pct(metrics['audio_to_text']['R@1'])}, R@5 {_pct(metrics['audio_to_text']['R@5'])}"],
        ["model package", f"{export['package']}: {len({c['graph'] for c in export['verify']['checks']})} MindIR graphs "
                          f"verified, max |diff| {max(c['max_abs_diff'] for c in export['verify']['checks']):.1e}"],
        ["serving", f"{serve['questions']} questions (half spoken) over REST and gRPC: {serve['correct']} answered "
                    f"right, protocols {'agree' if serve['protocols_agree'] else 'DISAGREE'}, median "
                    f"{serve['median_ms']['rest']:.0f} ms (REST) / {serve['median_ms']['grpc']:.0f} ms (gRPC)"],
        ["wall time", f"{summary['wall_seconds']:.0f} s"],
    ]
    width = max(len(r[0]) for r in rows)
    lines = ["", "mindvl quickstart summary", "-" * (width + 60)]
    lines += [f"{name.ljust(width)}  {value}" for name, value in rows]
    return "\n".join(lines)
