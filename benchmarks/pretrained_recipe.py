"""The pretrained-s recipe against the tiny recipe on easy-VQA (issue 4), side by side.

    python benchmarks/pretrained_recipe.py [--tiny-data mindvl_data] [--pretrained-data mindvl_data_pretrained]
        [--pretrained pretrained] [--out runs/compare] [--tiny-run DIR] [--pretrained-run DIR] [--epochs 1]

Builds the two data roots (pretrained-s tokenises with MiniLM's WordPiece) and converts the encoders when
missing, trains each recipe for `--epochs` unless its finished run is given, evaluates both on the test
split with `mindvl eval`'s code and prints one table: VQA accuracy with text and with spoken questions
(unseen voices), image -> caption and speech -> question Recall@1, and the training cost. pretrained-s
trains from the frozen encoders' cached states (model.pretrained.cache); the first run fills the cache.
"""
import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

SOURCES = {"vision": "dinov2", "text": "minilm", "audio": "whisper-base"}


def _train(recipe: str, overrides, run: str):
    """The finished run folder: `run` when given, else a fresh training of `recipe`."""
    from mindvl.config import load_config
    from mindvl.data.build.builder import build_dataset
    from mindvl.train.trainer import train

    if run:
        return Path(run)
    cfg = load_config(recipe, overrides)
    build_dataset(cfg, progress=True)
    return Path(train(cfg).output_dir)


def _evaluate(run: Path):
    from mindvl.eval import evaluate
    from mindvl.model_factory import load_model

    cfg, model, _ = load_model(str(run))
    report = evaluate(cfg, model)
    (run / "eval.json").write_text(json.dumps(report, indent=2))
    return report, json.loads((run / "train_result.json").read_text())


def _row(name, values, fmt="{:.1%}"):
    return f"| {name} | " + " | ".join(fmt.format(v) if isinstance(v, (int, float)) else str(v) for v in values) + " |"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny-data", default="mindvl_data")
    parser.add_argument("--pretrained-data", default="mindvl_data_pretrained")
    parser.add_argument("--pretrained", default="pretrained", help="folder of converted encoders")
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("--tiny-run", default="", help="a finished tiny run to evaluate instead of training one")
    parser.add_argument("--pretrained-run", default="", help="the same for pretrained-s")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)

    from mindvl.pretrained import convert

    folders = {kind: Path(args.pretrained) / source for kind, source in SOURCES.items()}
    for kind, folder in folders.items():
        if not args.pretrained_run and not (folder / "config.json").is_file():
            convert(SOURCES[kind], folder)
    common = [f"train.epochs={args.epochs}", "train.max_steps=0"]
    runs = {
        "tiny": _train("tiny", [f"data.root={args.tiny_data}", f"train.output_dir={args.out}/tiny", *common],
                       args.tiny_run),
        "pretrained-s": _train("pretrained-s", [
            f"data.root={args.pretrained_data}", f"train.output_dir={args.out}/pretrained-s",
            f"data.tokenizer={folders['text']}", f"model.pretrained.cache={args.pretrained}/cache",
            *(f"model.pretrained.{kind}={folder}" for kind, folder in folders.items()), *common],
            args.pretrained_run)}
    results = {name: _evaluate(run) for name, run in runs.items()}

    names = list(results)
    print(f"\n| metric (easy-VQA test split) | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    metric = {name: report for name, (report, _) in results.items()}
    train = {name: result for name, (_, result) in results.items()}
    print(_row("VQA, text question", [metric[n]["vqa_text"]["accuracy"] for n in names]))
    print(_row("VQA, spoken question (unseen voices)", [metric[n]["vqa_audio"]["accuracy"] for n in names]))
    print(_row("generated answer text, text / spoken", [
        f"{metric[n]['vqa_text']['generated_accuracy']:.1%} / {metric[n]['vqa_audio']['generated_accuracy']:.1%}"
        for n in names]))
    for key, label in (("image_to_caption", "image -> caption R@1 / R@5"),
                       ("audio_to_text", "speech -> question R@1 / R@5")):
        print(_row(label, [f"{metric[n][key]['R@1']:.1%} / {metric[n][key]['R@5']:.1%}" for n in names]))
    print(_row("majority baseline", [metric[n]["baseline"]["accuracy"] for n in names]))
    print(_row("trainable parameters", [train[n].get("trainable_parameters", "?") for n in names], "{:,}"))
    print(_row("training: steps, samples/s", [f"{train[n]['steps']}, {train[n]['samples_per_second']}"
                                              for n in names]))
    print(_row("training wall time (s): encoder cache, compile, steps", [
        f"{train[n].get('token_cache_seconds', 0):.0f}, {train[n]['compile_seconds']:.0f}, "
        f"{train[n]['train_seconds']:.0f}" for n in names]))
    print(_row("evaluation wall time (s)", [f"{metric[n]['seconds']:.0f}" for n in names]))


if __name__ == "__main__":
    main()
