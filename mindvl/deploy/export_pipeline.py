"""Every export command ends the same way: write the package, verify it, and (for the comparison
table) evaluate it. One function, so a quantized, pruned or distilled package is checked exactly like a
plain one."""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from mindvl.deploy.evaluate_package import evaluate_package
from mindvl.deploy.verify import verify_package
from mindvl.errors import PackageError
from mindvl.export.package_writer import write_package


@dataclass
class PackageOptions:
    static_batches: Sequence[int] = field(default_factory=tuple)
    key: Optional[bytes] = None
    version: int = 1
    force: bool = False
    evaluate: bool = False
    data_root: Optional[str] = None  # evaluation data (default: the config's data.root)
    progress: bool = True
    graphs: Sequence[str] = field(default_factory=tuple)  # default: every graph
    lite2_batch: Optional[int] = None  # also write the Lite 2.0 graphs (--target lite2) at this static batch
    prompt_buckets: Sequence[int] = field(default_factory=tuple)  # a generative package's prefill buckets
    cache_len: int = 0  # a generative package's key/value cache length (0: export/prefill_decode.py's default)
    eval_limit: int = 0  # a generative package's evaluation: the first N questions of each kind (0: all)
    vision_buckets: Sequence[int] = field(default_factory=tuple)  # a native VLM's packed patches per vision graph


def _write_generative(cfg, model, source: Mapping[str, object], out: Path, options: PackageOptions,
                      compression: Optional[Mapping[str, object]]) -> Path:
    """A generative run's package (export/prefill_decode.py), its sample questions from the test split."""
    from mindvl.chat import recipe_chat
    from mindvl.eval.generated_answers import GenerativeEvaluator
    from mindvl.export.prefill_decode import SAMPLE_QUESTIONS, write_generative_package

    given = [flag for flag, value in (("--static-batch", options.static_batches), ("--key-file/--key-env",
             options.key), ("--graph", options.graphs)) if value]
    if given:
        raise PackageError(f"{', '.join(given)}: not available for a generative model's package yet (its graphs "
                           f"are attachments, prefill per bucket and decode); leave {given[0]} out")
    prompts = [prompt for _, prompt in GenerativeEvaluator(cfg, model).questions("test", SAMPLE_QUESTIONS)]
    chat = recipe_chat(cfg, model.image_tokens, model.audio_tokens)
    return write_generative_package(cfg, model, chat, prompts, out, source, cache_len=options.cache_len,
                                    version=options.version, force=options.force, progress=options.progress,
                                    compression=compression, buckets=options.prompt_buckets,
                                    lite2_batch=options.lite2_batch)


def package_and_check(cfg, model, source: Mapping[str, object], out: Path, options: PackageOptions,
                      compression: Optional[Mapping[str, object]] = None,
                      log: Callable[[str], None] = print) -> dict:
    """Write `out`, verify it (PackageError on any mismatch, naming graph and output) and, when asked,
    evaluate it; returns {"package", "verify", "evaluation"?}. A generative run writes its generation graphs."""
    if cfg.model.is_native:  # a fine-tuned Qwen2(.5)-VL
        from mindvl.generation.native_generator import NativeGenerator

        if compression:
            raise PackageError("a native-resolution VLM's package is written uncompressed; export it without "
                               "quantize or prune")
        generator = NativeGenerator.from_run(cfg, model, options.cache_len or 1024, "standard", source)
        spoken = []
        if cfg.model.native.audio:  # a model that hears stores a spoken test question too
            from mindvl.eval.generated_answers import GenerativeEvaluator

            asked = GenerativeEvaluator(cfg, generator=generator).questions("test", 2)
            spoken = [prompt for sample, prompt in asked if sample.question_id >= 0]
        return _native_checked(generator, out, options, log, spoken, cfg)
    if options.vision_buckets:
        raise PackageError("--vision-bucket: only a native-resolution VLM's package has vision graphs (a folder of "
                           "mindvl convert vlm, or a run trained from one); leave it out")
    if cfg.model.generative:
        path = _write_generative(cfg, model, source, out, options, compression)
    elif options.prompt_buckets or options.cache_len:
        raise PackageError("--prompt-bucket / --cache-len: only a generative model's package has prompt buckets and "
                           "a cache; leave them out")
    else:
        path = write_package(cfg, model, out, source, options.static_batches, options.key, compression,
                             options.version, options.force, options.progress, options.graphs, options.lite2_batch)
    return _checked(path, options, log)


def package_native_and_check(folder: Path, out: Path, options: PackageOptions,
                             log: Callable[[str], None] = print) -> dict:
    """A converted VLM folder (mindvl convert vlm) written as a package (export/native_prefill_decode.py) and
    verified; options a generative run's package takes and a VLM's does not are refused by name."""
    from mindvl.generation.native_generator import NativeGenerator

    generator = NativeGenerator.from_folder(folder, cache_len=options.cache_len or 1024, kernels="standard")
    return _native_checked(generator, out, options, log)


def _native_checked(generator, out: Path, options: PackageOptions, log: Callable[[str], None],
                    prompts: Sequence = (), cfg=None) -> dict:
    """A NativeGenerator's model written as a package (with `prompts` among its stored questions) and verified;
    `cfg`: a trained run's recipe, stored as config.json (its evaluation reads the data set there)."""
    from mindvl.export.lite2_folder import wants_generation_lite2
    from mindvl.export.native_prefill_decode import write_native_package

    given = [flag for flag, value in (("--static-batch", options.static_batches), ("--key-file/--key-env",
             options.key), ("--graph", options.graphs)) if value]
    if given:
        raise PackageError(f"{', '.join(given)}: not available for a converted VLM's package (its graphs are vision "
                           f"per bucket, prefill per bucket and decode); leave {given[0]} out")
    if options.evaluate and cfg is None:
        raise PackageError("--evaluate: a converted VLM folder names no data set to answer; evaluate a run trained "
                           "from it (mindvl export --checkpoint RUN --evaluate), or leave --evaluate out")
    path = write_native_package(generator, out, options.cache_len, buckets=options.prompt_buckets,
                                vision_buckets=options.vision_buckets, version=options.version, force=options.force,
                                progress=options.progress, lite2=wants_generation_lite2(options.lite2_batch, "VLM"),
                                prompts=prompts,
                                files={} if cfg is None else {"config.json": json.dumps(cfg.to_dict(), indent=2)})
    return _checked(path, options, log)


def _checked(path: Path, options: PackageOptions, log: Callable[[str], None]) -> dict:
    report = verify_package(path, options.key)
    log(report.summary())
    if not report.ok:
        raise PackageError(f"{path}: the exported graphs do not reproduce the framework's outputs: "
                           + "; ".join(f"graph {c.graph} output {c.output} (max |diff| {c.max_abs_diff:.2e})"
                                       for c in report.failures()))
    result = {"package": str(path), "verify": report.to_dict()}
    if options.evaluate:
        log(f"evaluating {path} on the test split (the exported graphs, not the Python model)")
        result["evaluation"] = evaluate_package(path, options.data_root, options.key, options.progress,
                                                limit=options.eval_limit)
    return result
