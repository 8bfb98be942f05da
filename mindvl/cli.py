"""The `mindvl` command line: it only wires the library's entry points together."""
import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the progress bars

from mindvl.config import ConfigError, load_config  # noqa: E402


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="tiny", help="recipe name (mindvl/configs) or YAML path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.lr=3e-4 (repeatable)")


def _data_build(args) -> None:
    from mindvl.data.build import build_dataset
    cfg = load_config(args.config, args.overrides)
    # paths are set on the config, not through --set, so that YAML never reinterprets them
    for value, section, key in ((args.root, cfg.data, "root"), (args.from_folder, cfg.data, "source"),
                                (args.shards, cfg.data, "shards"),
                                (args.align_checkpoint, cfg.data.cleaning, "align_checkpoint"),
                                (args.align_min_similarity, cfg.data.cleaning, "align_min_similarity")):
        if value is not None:
            setattr(section, key, value)
    cfg.validate()
    report = build_dataset(cfg, limit=args.limit, force=args.force)
    print(json.dumps(asdict(report), indent=2, default=str) if args.json else report.summary())


def _train(args) -> None:
    from mindvl.train import train
    result = train(load_config(args.config, args.overrides), resume=args.resume)
    if os.environ.get("RANK_ID", "0") == "0":  # under msrun every rank holds the same result
        print(json.dumps(asdict(result), indent=2) if args.json else result.summary())


def _eval(args) -> None:
    from mindvl.eval import evaluate, load_trained
    cfg, model = load_trained(args.run, args.data_root)
    print(json.dumps(evaluate(cfg, model), indent=2))


def _key(args) -> Optional[bytes]:
    from mindvl.export.keys import read_key
    return read_key(args.key_file, args.key_env)


def _package_options(args, evaluate: bool):
    from mindvl.export.pipeline import PackageOptions
    return PackageOptions(args.static_batch, _key(args), args.version, args.force, evaluate, args.data_root,
                          graphs=args.graph, lite2_batch=args.lite2_batch if args.target == "lite2" else None)


def _print_export(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"wrote {result['package']} (verified)")
    if "evaluation" in result:
        row = result["evaluation"]
        print(f"VQA text {row['vqa_text']:.1%}, audio {row['vqa_audio']:.1%}; image->caption R@1 "
              f"{row['image_to_caption_r1']:.1%}, speech->question R@1 {row['audio_to_text_r1']:.1%}; latency b1 "
              f"{row['latency_ms_b1']:.1f} ms (mindvl export compare PKG... for the table)")


def _export(args) -> None:
    if args.export_command is None and not (args.checkpoint and args.out):
        raise ConfigError("mindvl export: pass --checkpoint CKPT --out PKG, or a subcommand (verify, evaluate, "
                          "compare, quantize, prune, distill, onnx)")
    from mindvl.export.pipeline import package_and_check
    from mindvl.export.source import load_source
    cfg, model, source = load_source(args.checkpoint, args.config, args.overrides, args.data_root)
    _print_export(package_and_check(cfg, model, source, args.out, _package_options(args, args.evaluate)), args.json)


def _export_verify(args) -> int:
    from mindvl.export.verify import verify_package
    report = verify_package(args.package, _key(args))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def _export_evaluate(args) -> None:
    from mindvl.export.evaluate import evaluate_package
    print(json.dumps(evaluate_package(args.package, args.data_root, _key(args)), indent=2))


def _export_compare(args) -> None:
    from mindvl.export.evaluate import comparison_table
    print(comparison_table(args.packages))


def _export_quantize(args) -> None:
    from mindvl.export.pipeline import package_and_check
    from mindvl.export.quantize import quantize_int8
    from mindvl.export.source import load_source
    cfg, model, source = load_source(args.checkpoint, args.config, args.overrides, args.data_root)
    report = quantize_int8(model)
    result = package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                               {"method": "int8-weight-only", **report})
    _print_export(result, args.json)


def _export_prune(args) -> None:
    from mindvl.export.pipeline import package_and_check
    from mindvl.export.prune import RECORD_FILE, prune_and_finetune
    from mindvl.export.source import load_source
    run_dir = Path(args.run_dir or f"{args.out}.run")
    if (run_dir / RECORD_FILE).is_file():  # written once the fine-tune completed: package it again
        print(f"{run_dir}: pruned and fine-tuned already ({RECORD_FILE}); packaging it")
        record = json.loads((run_dir / RECORD_FILE).read_text())
    else:
        record = prune_and_finetune(args.checkpoint, run_dir, args.keep_heads, args.keep_mlp, args.steps)
    cfg, model, source = load_source(str(run_dir), data_root=args.data_root)
    result = package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                               {"method": "pruned", "run": str(run_dir), "settings": record["settings"],
                                "parameters": record["parameters"]})
    _print_export(result, args.json)


def _export_distill(args) -> None:
    from mindvl.export.package import parameter_count
    from mindvl.export.pipeline import package_and_check
    from mindvl.export.source import load_source
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
    cfg, model, source = load_source(str(run_dir), data_root=args.data_root)
    _, teacher_model, teacher = load_source(args.teacher)
    compression = {"method": "distilled", "teacher": teacher, "teacher_parameters": parameter_count(teacher_model),
                   "student_config": args.config}
    _print_export(package_and_check(cfg, model, source, args.out, _package_options(args, not args.no_eval),
                                    compression), args.json)


def _export_onnx(args) -> int:
    from mindvl.export.onnx import export_onnx
    from mindvl.export.source import load_source
    cfg, model, _ = load_source(args.checkpoint, args.config, args.overrides, args.data_root)
    report = export_onnx(cfg, model, args.out, args.graph, args.batch)
    print(json.dumps(report, indent=2) if args.json else report["summary"])
    return 0 if report["ok"] else 1


def _average(args) -> None:
    from mindvl.train.average import average_checkpoints, evaluate_soup, format_report, read_record
    out = average_checkpoints(args.ingredients, args.weights, args.out)
    if not args.no_eval:
        evaluate_soup(out, args.data_root)
    print(format_report(read_record(out)))
    print(f"wrote {out} (mindvl eval --run {out})")


def _convert(args) -> None:
    from mindvl.pretrained import convert
    out = convert(args.source, args.out or f"pretrained/{args.source}", args.file)
    config = json.loads((out / "config.json").read_text())
    print(f"{args.source}: {config['parameters']:,} parameters ({config['kind']} encoder) -> {out}")


def _quickstart(args) -> None:
    from mindvl.quickstart import run_quickstart
    run_quickstart(args.workdir, args.config, args.overrides)


def _add_key_args(parser: argparse.ArgumentParser) -> None:
    keys = parser.add_argument_group("encryption (AES-GCM; never a key on the command line)")
    keys.add_argument("--key-file", metavar="PATH", help="file holding a 16/24/32-byte key, raw or as hex text")
    keys.add_argument("--key-env", metavar="VAR", help="environment variable holding the key as hex text")


def _add_source_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--checkpoint", required=required, metavar="CKPT",
                        help="run folder (its newest checkpoint), step_* folder or model.safetensors")
    parser.add_argument("--out", required=required, metavar="PKG", help="package folder to write")
    parser.add_argument("--config", help="recipe the checkpoint was trained with (default: the run's config.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of --config (repeatable)")
    _add_package_args(parser)


def _add_package_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", help="data set folder for the samples and evaluation (default: the config's)")
    parser.add_argument("--static-batch", type=int, action="append", default=[], metavar="N",
                        help="also write every graph with batch size fixed to N (repeatable)")
    parser.add_argument("--graph", action="append", default=[], metavar="NAME",
                        help="export only this graph (repeatable; vqa, image_embed, text_embed, audio_embed)")
    parser.add_argument("--target", choices=("standard", "lite2"), default="standard",
                        help="lite2: also write lite2/, the graphs down-converted to MindIR v1 for the MindSpore "
                             "Lite 2.0 runtime, and the device assets (mindvl lite, lite/runner)")
    parser.add_argument("--lite2-batch", type=int, default=1, metavar="N",
                        help="static batch of the lite2 graphs (the device resizes them; default 1)")
    parser.add_argument("--version", type=int, default=1, help="model version recorded in the manifest")
    parser.add_argument("--force", action="store_true", help="replace an existing package folder")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_key_args(parser)


def _add_export_commands(commands) -> None:
    export = commands.add_parser(
        "export", help="write a model package (MindIR graphs + manifest.json + samples), verify, compress",
        description="mindvl export --checkpoint CKPT --out PKG writes and verifies a model package; the "
                    "subcommands verify, evaluate and compare packages, or write compressed ones.")
    _add_source_args(export, required=False)
    export.add_argument("--evaluate", action="store_true", help="also evaluate the package (its table row)")
    export.set_defaults(func=_export, export_command=None)
    sub = export.add_subparsers(dest="export_command", metavar="{verify,evaluate,compare,quantize,prune,distill,onnx}")

    verify = sub.add_parser("verify", help="check hashes, load every graph, compare the stored samples' outputs")
    verify.add_argument("package", metavar="PKG")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_key_args(verify)
    verify.set_defaults(func=_export_verify)

    evaluate = sub.add_parser("evaluate", help="a package's comparison row: accuracy, Recall@1, latency")
    evaluate.add_argument("package", metavar="PKG")
    evaluate.add_argument("--data-root", help="data set folder (default: the package config's data.root)")
    _add_key_args(evaluate)
    evaluate.set_defaults(func=_export_evaluate)

    compare = sub.add_parser("compare", help="markdown table of evaluated packages (the first is the reference)")
    compare.add_argument("packages", nargs="+", metavar="PKG")
    compare.set_defaults(func=_export_compare)

    quantize = sub.add_parser("quantize", help="INT8 weight-only post-training quantization into a new package")
    _add_source_args(quantize, required=True)
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


# ----------------------------------------------------------------------------- serving

SERVE_FLAGS = ("servable_dir", "host", "port", "grpc_port", "batching", "max_batch_size", "max_wait_ms", "workers",
               "max_request_mb", "max_instances", "timeout_s", "strict_http", "poll_s", "key_file", "key_env")
QUERY_METHODS = {  # the inputs of the methods `mindvl deploy` generates; --input NAME=VALUE for any other
    "predict": ("image", "question", "audio"), "embed_image": ("image",), "embed_text": ("text",),
    "embed_audio": ("audio",)}
QUERY_DEFAULTS = {"predict": {"question": "", "audio": b""}}  # an unasked modality is empty, as the servable expects
FILE_INPUTS = ("image", "audio")


def _serve_config(args):
    """ServeConfig from --config's YAML (unknown keys refused, naming them), the flags given overriding it."""
    from mindvl.config import read_yaml
    from mindvl.serving.server import ServeConfig
    values, source = {}, "flags"
    if args.serve_config:
        path = Path(args.serve_config)
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file")
        values, source = read_yaml(path), f"serve config {path}"
    values.update({name: getattr(args, name) for name in SERVE_FLAGS if getattr(args, name) is not None})
    try:
        return ServeConfig.from_mapping(values)
    except ConfigError as exc:  # flags arrive typed by argparse: only the file can hold a wrong key or type
        raise ConfigError(f"{source}: {exc}") from None


def _serve(args) -> None:
    import logging
    from mindvl.serving.server import serve
    config = _serve_config(args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("mindvl").setLevel(logging.INFO)
    try:
        serve(config)
    except OSError as exc:  # most often a port another server holds
        raise ConfigError(f"cannot serve on {config.host} (REST port {config.port}, gRPC port {config.grpc_port}): "
                          f"{exc}; choose other ports with --port / --grpc-port (0: any free port)") from None


def _deploy(args) -> None:
    from mindvl.serving.servable import deploy
    version, folder = deploy(args.package, args.servable_dir, args.name)
    print(f"deployed {args.package} as {args.name} version {version} in {folder}")
    print(f"a running `mindvl serve --servable-dir {args.servable_dir}` loads it within its --poll-s seconds")


def file_bytes(given: str, path: str) -> bytes:
    """The bytes of the file `path`; `given` is the argument that named it, for the error."""
    if not Path(path).is_file():
        raise ConfigError(f"{given}: no such file")
    return Path(path).read_bytes()


def _query_instance(args) -> dict:
    """The one instance `mindvl query` sends: the named flags, the method's defaults, then each --input."""
    given = {name: getattr(args, name) for name in ("image", "question", "audio", "text")
             if getattr(args, name) is not None}
    takes = QUERY_METHODS.get(args.method)
    for name in given:
        if takes is not None and name not in takes:
            raise ConfigError(f"--{name}: {args.method} takes {', '.join('--' + n for n in takes)}; pass other "
                              f"inputs as --input NAME=VALUE")
    instance = {**QUERY_DEFAULTS.get(args.method, {}),
                **{name: file_bytes(f"--{name} {value}", value) if name in FILE_INPUTS else value
                   for name, value in given.items()}}
    for item in args.inputs:
        name, equals, value = item.partition("=")
        if not name or not equals:
            raise ConfigError(f"--input {item!r}: expected NAME=VALUE (VALUE @PATH sends the file's bytes)")
        instance[name] = file_bytes(f"--input {item}", value[1:]) if value.startswith("@") else value
    missing = [name for name in takes or () if name not in instance]
    if missing or not instance:
        raise ConfigError(f"{args.method}: give {', '.join('--' + n for n in missing) or '--input NAME=VALUE'}")
    return instance


def _describe(value) -> str:
    """An output for people: arrays by dtype, shape, norm and first values; floats to 4 places; bytes by size."""
    import numpy as np
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" or value.ndim == 0:
            return f"{value.dtype} {list(value.shape)}: {value}"
        head = np.array2string(value.ravel()[:5], precision=4, separator=", ")
        return (f"{value.dtype} {list(value.shape)}, norm {np.linalg.norm(value.astype(np.float64)):.4f}, first "
                f"{head}")
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return str(value)


def _query(args) -> None:
    from mindvl.serving.client import Client, ServingError
    from mindvl.serving.protocol import encode_reply
    instance = _query_instance(args)
    with Client(args.address, args.servable, args.method, args.version) as client:
        result = client.infer(instance)[0]
    if "error" in result and len(result) == 1:
        raise ServingError(f"{args.servable} {args.method}: {result['error']}")
    if args.json:  # the outputs as the REST protocol writes them
        print(json.dumps(json.loads(encode_reply([result]))["instances"][0], indent=2, ensure_ascii=False))
        return
    width = max(map(len, result))
    for name, value in result.items():
        print(f"{name:<{width}}  {_describe(value)}")


def _add_serving_commands(commands) -> None:
    serve = commands.add_parser(
        "serve", help="serve a servable directory over MindSpore Serving 2.0's REST and gRPC protocols",
        description="Serves DIR/<servable>/<version>/ (fill it with `mindvl deploy`) until Ctrl-C or SIGTERM; "
                    "flags override the --config file's keys (ServeConfig's names: max_batch_size, ...).")
    serve.add_argument("--servable-dir", metavar="DIR", help="the servable directory (required here or in --config)")
    serve.add_argument("--config", dest="serve_config", metavar="YAML",
                       help="file of settings (unknown keys refused)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, help="REST port (default 1500; 0: any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 5500; 0: any free port, -1: no gRPC)")
    serve.add_argument("--max-batch-size", type=int, metavar="N", help="instances batched per run (default 16)")
    serve.add_argument("--max-wait-ms", type=float, metavar="MS", help="how long a batch waits to fill (default 2)")
    serve.add_argument("--no-batching", dest="batching", action="store_const", const=False,
                       help="run each request alone (no dynamic batching)")
    serve.add_argument("--workers", type=int, metavar="N", help="threads for preprocessing stages (default 4)")
    serve.add_argument("--max-request-mb", type=float, metavar="MB", help="largest request body (default 32)")
    serve.add_argument("--max-instances", type=int, metavar="N", help="most instances per request (default 64)")
    serve.add_argument("--timeout-s", type=float, metavar="S", help="per request, queueing included (default 60)")
    serve.add_argument("--strict-http", action="store_const", const=True,
                       help="answer errors with 4xx/5xx (default: HTTP 200 with error_msg, as MindSpore Serving)")
    serve.add_argument("--poll-s", type=float, metavar="S",
                       help="how often DIR is checked for new versions (default 2; 0: never)")
    keys = serve.add_argument_group("encrypted packages (AES-GCM; never a key on the command line)")
    keys.add_argument("--key-file", metavar="PATH", help="file holding the key, raw or as hex text")
    keys.add_argument("--key-env", metavar="VAR", help="environment variable holding the key as hex text")
    serve.set_defaults(func=_serve)

    deploy = commands.add_parser("deploy", help="add a model package as the next version of a servable")
    deploy.add_argument("package", metavar="PKG", help="model package folder (from `mindvl export`)")
    deploy.add_argument("--servable-dir", required=True, metavar="DIR", help="the servable directory")
    deploy.add_argument("--name", required=True, help="servable name (letters, digits, '_.-')")
    deploy.set_defaults(func=_deploy)

    query = commands.add_parser(
        "query", help="call a method of a served servable (REST or gRPC) and print its outputs",
        description="Sends one instance built from the flags; predict's missing question is '' and missing "
                    "audio b'' (ask by text, by speech or both).")
    query.add_argument("address", metavar="URL_OR_ADDRESS",
                       help="http://HOST:PORT (REST), or grpc://HOST:PORT or HOST:PORT (gRPC)")
    query.add_argument("--servable", required=True, metavar="NAME")
    query.add_argument("--method", default="predict", help="predict (default), embed_image, embed_text, "
                       "embed_audio, or a method of your servable_config.py")
    query.add_argument("--version", type=int, default=0, metavar="N", help="version to ask (default 0: the newest)")
    query.add_argument("--image", metavar="PATH", help="PNG or JPEG file (predict, embed_image)")
    query.add_argument("--question", metavar="TEXT", help="typed question (predict)")
    query.add_argument("--audio", metavar="PATH", help="WAV, FLAC or OGG file: a spoken question (predict, "
                       "embed_audio)")
    query.add_argument("--text", metavar="TEXT", help="text to embed (embed_text)")
    query.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=VALUE",
                       help="any other input as a string, or @PATH for a file's bytes (repeatable)")
    query.add_argument("--json", action="store_true", help="print the outputs as the REST reply's JSON")
    query.set_defaults(func=_query)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindvl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="data set commands").add_subparsers(dest="data_command", required=True)
    build = data.add_parser("build", help="clean a source (easy-VQA or your folder) into MindRecord shards")
    _add_config_args(build)
    build.add_argument("--root", help="output folder (default: data.root of the config)")
    build.add_argument("--from-folder", metavar="DIR", help="build from your own data instead of easy-VQA: DIR holds "
                       "train.jsonl, test.jsonl and the files they name (data.source; see mindvl/data/userdata.py)")
    build.add_argument("--limit", type=int, help="at most N source images per split (0: all)")
    build.add_argument("--shards", type=int, help="MindRecord files per split (data.shards)")
    build.add_argument("--align-checkpoint", metavar="RUN", help="drop image-caption pairs a trained run scores "
                       "below --align-min-similarity (data.cleaning.align_checkpoint)")
    build.add_argument("--align-min-similarity", type=float, metavar="COS",
                       help="cosine similarity threshold (data.cleaning.align_min_similarity)")
    build.add_argument("--force", action="store_true", help="rebuild even if a complete build exists (and discard "
                       "an interrupted one instead of resuming it)")
    build.add_argument("--json", action="store_true", help="print the whole report as JSON instead of the table")
    build.set_defaults(func=_data_build)

    train = commands.add_parser("train", help="train a recipe")
    _add_config_args(train)
    train.add_argument("--resume", metavar="CKPT|RUN|auto",
                       help="continue from a checkpoint (step_* folder), a run's latest one, or 'auto': the "
                            "latest in train.output_dir if any (same samples as an uninterrupted run)")
    train.add_argument("--json", action="store_true", help="print the whole result as JSON instead of the summary")
    train.set_defaults(func=_train)

    evaluate = commands.add_parser("eval", help="evaluate a trained run")
    evaluate.add_argument("--run", required=True, help="run folder, checkpoint folder or model.safetensors")
    evaluate.add_argument("--data-root", help="data set folder (default: the run's data.root)")
    evaluate.set_defaults(func=_eval)

    _add_export_commands(commands)

    average = commands.add_parser("average", help="average checkpoints of one architecture (a model soup) and "
                                  "compare its VQA accuracy with each ingredient's")
    average.add_argument("ingredients", nargs="+", metavar="RUN_OR_CKPT",
                         help="run folder, checkpoint folder or model.safetensors (at least 2)")
    average.add_argument("--out", required=True, help="folder to write: config.json, model.safetensors, average.json")
    average.add_argument("--weights", nargs="+", type=float, metavar="W",
                         help="one weight >= 0 per ingredient, normalised to sum 1 (default: uniform)")
    average.add_argument("--data-root", help="data set to evaluate on (default: the first ingredient's data.root)")
    average.add_argument("--no-eval", action="store_true", help="only write the average")
    average.set_defaults(func=_average)

    from mindvl.pretrained import SOURCES
    convert = commands.add_parser("convert", help="convert published pretrained weights into a mindvl encoder",
                                  description="sources: " + "; ".join(f"{k}: {text}" for k, (_, text) in SOURCES.items()))
    convert.add_argument("source", choices=sorted(SOURCES))
    convert.add_argument("--out", help="folder to write (default: pretrained/<source>)")
    convert.add_argument("--file", help="the published file (default: the one in the installed wheel)")
    convert.set_defaults(func=_convert)

    quick = commands.add_parser("quickstart", help="build data, train, evaluate, export and verify")
    _add_config_args(quick)
    quick.add_argument("--workdir", default="mindvl_quickstart", help="folder for data, run and export")
    quick.set_defaults(func=_quickstart)

    _add_serving_commands(commands)
    from mindvl.lite.cli import add_lite_commands
    add_lite_commands(commands)
    from mindvl.parallel.cli import add_plan_command
    add_plan_command(commands)
    return parser


def _user_errors() -> tuple:
    """The exceptions whose message tells the user what to fix; imported only once one is raised (some of
    their modules import MindSpore, which `mindvl query` never needs)."""
    from mindvl.data.loader import DataRootError
    from mindvl.export.errors import PackageError
    from mindvl.lite.model import LiteError
    from mindvl.preprocess import InputError
    from mindvl.pretrained import ConversionError
    from mindvl.serving.client import ServingError
    from mindvl.serving.register import ServableError
    from mindvl.train.checkpoint import CheckpointError
    return ConfigError, InputError, CheckpointError, DataRootError, ConversionError, PackageError, ServingError, \
        ServableError, LiteError


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        print(f"mindvl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
