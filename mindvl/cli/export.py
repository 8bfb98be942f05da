"""`mindvl export`: write and verify a model package, and its subcommands verify, evaluate, compare, quantize,
prune, distill, hf (a converted VLM back to a Hugging Face folder) and onnx."""
import argparse
import json
from pathlib import Path

from mindvl.choices import EXPORT_TARGETS
from mindvl.cli.options import add_key_args, package_key
from mindvl.config import load_config
from mindvl.errors import ConfigError


def _package_options(args, evaluate: bool):
    from mindvl.deploy.export_pipeline import PackageOptions
    return PackageOptions(args.static_batch, package_key(args), args.version, args.force, evaluate, args.data_root,
                          graphs=args.graph, lite2_batch=args.lite2_batch if args.target == "lite2" else None,
                          prompt_buckets=args.prompt_bucket, cache_len=args.cache_len, eval_limit=args.limit,
                          vision_buckets=args.vision_bucket)


def _print_export(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"wrote {result['package']} (verified)")
    if "evaluation" in result:
        row = result["evaluation"]
        if row.get("kind") == "generative":
            print(f"generated answers: VQA typed {row['vqa_text']:.1%}, spoken {row['vqa_audio']:.1%}; decode "
                  f"{row['decode_ms_b1']:.2f} ms/token at batch 1 (mindvl export compare PKG... for the table)")
            return
        print(f"VQA text {row['vqa_text']:.1%}, audio {row['vqa_audio']:.1%}; image->caption R@1 "
              f"{row['image_to_caption_r1']:.1%}, speech->question R@1 {row['audio_to_text_r1']:.1%}; latency b1 "
              f"{row['latency_ms_b1']:.1f} ms (mindvl export compare PKG... for the table)")


def _export(args) -> None:
    if args.export_command is None and not (args.checkpoint and args.out):
        raise ConfigError("mindvl export: pass --checkpoint CKPT --out PKG, or a subcommand (verify, evaluate, "
                          "compare, quantize, prune, distill, onnx)")
    from mindvl.deploy.export_pipeline import package_and_check, package_native_and_check
    from mindvl.model_factory import load_model
    from mindvl.pretrained.vlm import is_vlm_folder
    if is_vlm_folder(args.checkpoint):
        if args.config or args.overrides or args.data_root:
            raise ConfigError("--config, --set and --data-root: a converted VLM folder has no recipe; leave them out")
        _print_export(package_native_and_check(args.checkpoint, args.out, _package_options(args, args.evaluate)),
                      args.json)
        return
    cfg, model, source = load_model(args.checkpoint, args.config, args.overrides, args.data_root)
    _print_export(package_and_check(cfg, model, source, args.out, _package_options(args, args.evaluate)), args.json)


def _export_verify(args) -> int:
    from mindvl.deploy.verify import verify_package
    report = verify_package(args.package, package_key(args))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def _export_evaluate(args) -> None:
    from mindvl.deploy.evaluate_package import evaluate_package
    print(json.dumps(evaluate_package(args.package, args.data_root, package_key(args), limit=args.limit), indent=2))


def _export_compare(args) -> None:
    from mindvl.deploy.evaluate_package import comparison_table
    print(comparison_table(args.packages))


def _export_quantize(args) -> None:
    from mindvl.deploy.export_pipeline import package_and_check
    from mindvl.cells.quantize import quantize_model
    from mindvl.model_factory import load_model
    cfg, model, source = load_model(args.checkpoint, args.config, args.overrides, args.data_root)
    report = quantize_model(model, args.weights)
    result = package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                               {"method": f"{args.weights}-weight-only", **report})
    _print_export(result, args.json)


def _export_prune(args) -> None:
    from mindvl.deploy.export_pipeline import package_and_check
    from mindvl.model_factory import load_model
    from mindvl.train.prune import RECORD_FILE, prune_and_finetune
    run_dir = Path(args.run_dir or f"{args.out}.run")
    if (run_dir / RECORD_FILE).is_file():  # written once the fine-tune completed: package it again
        print(f"{run_dir}: pruned and fine-tuned already ({RECORD_FILE}); packaging it")
        record = json.loads((run_dir / RECORD_FILE).read_text())
    else:
        record = prune_and_finetune(args.checkpoint, run_dir, args.keep_heads, args.keep_mlp, args.steps)
    cfg, model, source = load_model(str(run_dir), data_root=args.data_root)
    result = package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                               {"method": "pruned", "run": str(run_dir), "settings": record["settings"],
                                "parameters": record["parameters"]})
    _print_export(result, args.json)


def _export_distill(args) -> None:
    from mindvl.cells import count_cell_parameters
    from mindvl.deploy.export_pipeline import package_and_check
    from mindvl.model_factory import load_model
    from mindvl.train import train
    overrides = [*args.overrides, f"train.distill.teacher={args.teacher}"]
    if args.run_dir:
        overrides.append(f"train.output_dir={args.run_dir}")
    student = load_config(args.config, overrides)
    run_dir = Path(student.train.output_dir)
    if (run_dir / "train_result.json").is_file():  # written when a run completes: package it again, no retraining
        print(f"{run_dir}: the student's training is complete; packaging it")
    else:
        train(student, resume="auto")
    cfg, model, source = load_model(str(run_dir), data_root=args.data_root)
    _, teacher_model, teacher = load_model(args.teacher)
    compression = {"method": "distilled", "teacher": teacher, "teacher_parameters": count_cell_parameters(teacher_model),
                   "student_config": args.config}
    _print_export(package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                                    compression), args.json)


def _export_onnx(args) -> int:
    from mindvl.export.onnx import export_onnx
    from mindvl.model_factory import load_model
    cfg, model, _ = load_model(args.checkpoint, args.config, args.overrides, args.data_root)
    report = export_onnx(cfg, model, args.out, args.graph, args.batch)
    print(json.dumps(report, indent=2) if args.json else report["summary"])
    return 0 if report["ok"] else 1


def _add_source_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--checkpoint", required=required, metavar="CKPT",
                        help="run folder (its newest checkpoint), step_* folder or model.safetensors; or a converted "
                             "VLM folder (mindvl convert vlm)")
    parser.add_argument("--out", required=required, metavar="PKG", help="package folder to write")
    parser.add_argument("--config", help="recipe the checkpoint was trained with (default: the run's config.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of --config (repeatable)")
    _add_package_args(parser)


def _add_limit_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=0, metavar="N",
                        help="evaluating a generative package: only the test split's first N typed and N spoken "
                             "questions (0: all)")


def _add_package_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", help="data set folder for the samples and evaluation (default: the config's)")
    parser.add_argument("--static-batch", type=int, action="append", default=[], metavar="N",
                        help="also write every graph with batch size fixed to N (repeatable)")
    parser.add_argument("--graph", action="append", default=[], metavar="NAME",
                        help="export only this graph (repeatable; vqa, image_embed, text_embed, audio_embed)")
    parser.add_argument("--target", choices=EXPORT_TARGETS.values, default=EXPORT_TARGETS.default,
                        help="lite2: also write lite2/, the graphs down-converted to MindIR v1 for the MindSpore "
                             "Lite 2.0 runtime, and the device assets (mindvl lite, lite/runner)")
    parser.add_argument("--lite2-batch", type=int, default=1, metavar="N",
                        help="static batch of the lite2 graphs (the device resizes them; default 1)")
    parser.add_argument("--prompt-bucket", type=int, action="append", default=[], metavar="L",
                        help="a generative model: export a prefill graph for prompts of up to L tokens (repeatable; "
                             "default: 16, 24, 32, 48, ... while they fit the cache). Each holds the decoder, whose "
                             "weights a server or device keeps once per graph in memory: few buckets for a large one")
    parser.add_argument("--cache-len", type=int, default=0, metavar="N",
                        help="a generative model: the key/value cache's length, prompt + new tokens (default: the "
                             "decoder's max_positions, at most 512)")
    parser.add_argument("--vision-bucket", type=int, action="append", default=[], metavar="V",
                        help="a converted VLM (mindvl convert vlm): export a vision graph for images packed in up to V "
                             "patches (repeatable; default 1024 and 4096; a request needing more is refused)")
    _add_limit_arg(parser)
    parser.add_argument("--version", type=int, default=1, help="model version recorded in the manifest")
    parser.add_argument("--force", action="store_true", help="replace an existing package folder")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_key_args(parser)


def _export_hf(args) -> None:
    from mindvl.deploy.hf_export import export_hf
    export_hf(args.model, args.out)


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="write a model package (MindIR graphs + manifest.json + samples), verify, compress",
        description="mindvl export --checkpoint CKPT --out PKG writes and verifies a model package; the "
                    "subcommands verify, evaluate and compare packages, or write compressed ones.")
    _add_source_args(export, required=False)
    export.add_argument("--evaluate", action="store_true", help="also evaluate the package (its table row)")
    export.set_defaults(func=_export, export_command=None)
    sub = export.add_subparsers(dest="export_command", metavar="{verify,evaluate,compare,quantize,prune,distill,hf,onnx}")

    verify = sub.add_parser("verify", help="check hashes, load every graph, compare the stored samples' outputs")
    verify.add_argument("package", metavar="PKG")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    add_key_args(verify)
    verify.set_defaults(func=_export_verify)

    evaluate = sub.add_parser("evaluate", help="a package's comparison row: accuracy, Recall@1, latency")
    evaluate.add_argument("package", metavar="PKG")
    evaluate.add_argument("--data-root", help="data set folder (default: the package config's data.root)")
    _add_limit_arg(evaluate)
    add_key_args(evaluate)
    evaluate.set_defaults(func=_export_evaluate)

    compare = sub.add_parser("compare", help="markdown table of evaluated packages (the first is the reference)")
    compare.add_argument("packages", nargs="+", metavar="PKG")
    compare.set_defaults(func=_export_compare)

    quantize = sub.add_parser("quantize", help="INT8 / INT4 weight-only post-training quantization into a new package")
    _add_source_args(quantize, required=True)
    quantize.add_argument("--weights", choices=("int8", "int4"), default="int8",
                          help="int8: per output channel; int4: groups of 32 inputs (per-channel int8 where a layer's "
                               "inputs are not in groups of 32)")
    prune = sub.add_parser("prune", help="prune attention heads and FFN channels by importance, fine-tune, package")
    _add_source_args(prune, required=True)
    prune.add_argument("--keep-heads", type=float, default=0.5, help="fraction of attention heads kept per layer")
    prune.add_argument("--keep-mlp", type=float, default=0.5, help="fraction of FFN channels kept per layer")
    prune.add_argument("--steps", type=int, default=200, help="fine-tuning steps after pruning")
    prune.add_argument("--run-dir", help="folder of the fine-tuning run (default: PKG.run)")
    distill = sub.add_parser("distill", help="train a student recipe from a teacher checkpoint, package it")
    distill.add_argument("--teacher", required=True, metavar="CKPT", help="the teacher's run or checkpoint")
    distill.add_argument("--config", default="tiny-student", help="the student's recipe")
    distill.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a student recipe key (repeatable)")
    distill.add_argument("--out", required=True, metavar="PKG", help="package folder to write")
    distill.add_argument("--run-dir", help="the student's training folder (default: the recipe's train.output_dir)")
    _add_package_args(distill)
    for parser, func in ((quantize, _export_quantize), (prune, _export_prune), (distill, _export_distill)):
        parser.add_argument("--no-eval", action="store_true", help="skip the evaluation (the table row)")
        parser.set_defaults(func=func)

    hf = sub.add_parser("hf", help="write a converted VLM back as a Hugging Face folder of its family (transformers, "
                                   "vLLM, vllm-mindspore load it)")
    hf.add_argument("model", metavar="FOLDER", help="a folder written by `mindvl convert vlm`, or a run trained from "
                                                    "one (its LoRA merged into the weights)")
    hf.add_argument("--out", required=True, metavar="DIR", help="the Hugging Face folder to write")
    hf.set_defaults(func=_export_hf)

    onnx = sub.add_parser("onnx", help="export the same graphs to ONNX where MindSpore can; report failing ops")
    onnx.add_argument("--checkpoint", required=True, metavar="CKPT", help="run folder, step_* folder or model.safetensors")
    onnx.add_argument("--out", required=True, metavar="DIR", help="folder for <graph>.onnx and onnx_report.json")
    onnx.add_argument("--config", help="recipe the checkpoint was trained with (default: the run's config.json)")
    onnx.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    onnx.add_argument("--data-root", help="data set folder (default: the config's)")
    onnx.add_argument("--graph", action="append", default=[], metavar="NAME", help="only this graph (repeatable)")
    onnx.add_argument("--batch", type=int, default=3, metavar="N", help="static batch of the ONNX graphs (default 3)")
    onnx.add_argument("--json", action="store_true", help="print the report as JSON")
    onnx.set_defaults(func=_export_onnx)
