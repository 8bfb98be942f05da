"""`from_pretrained(path)`: the one door to everything mindvl writes into a folder.

It looks at what the folder holds, says what it found (`describe`, and one line to the `mindvl` logger), and
opens it as the object that uses it:

    a converted LLM (mindvl convert llm)                  -> mindvl.generation.LanguageModel
    a converted VLM (mindvl convert vlm: Qwen2(.5)-VL)    -> mindvl.generation.NativeGenerator
    a trained generative run (its folder, a step_*, ...)  -> mindvl.generation.MultimodalGenerator
    a trained classifier run                              -> its MultimodalModel cell, in eval mode
    a converted encoder (mindvl convert minilm|dinov2|whisper-base) -> the encoder cell with its weights
    a model package (mindvl export)                       -> mindvl.lite.DevicePipeline over its graphs

Every loader of the library goes through here (`mindvl.from_pretrained`); what it calls for each kind
(LanguageModel(folder), model_factory.load_model, pretrained.store.load_converted, DevicePipeline) is
the kind's own constructor. Options apply to the kinds they name; one given for another kind is refused by
name, never silently ignored.
"""
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from mindvl.choices import GENERATION_WEIGHTS, KERNELS, LITE_BACKENDS
from mindvl.errors import ConfigError

LOG = logging.getLogger("mindvl")
PathLike = Union[str, Path]

LLM = "a converted LLM"
VLM = "a converted VLM"
GENERATIVE_RUN = "a trained generative run"
CLASSIFIER_RUN = "a trained classifier run"
ENCODER = "a converted encoder"
PACKAGE = "a model package"

# the options each kind takes, with their defaults
OPTIONS = {
    LLM: {"cache_len": 1024, "kernels": KERNELS.default, "weights": GENERATION_WEIGHTS.default},
    VLM: {"cache_len": 1024, "kernels": KERNELS.default, "weights": GENERATION_WEIGHTS.default},
    GENERATIVE_RUN: {"cache_len": 256, "kernels": KERNELS.default},
    CLASSIFIER_RUN: {},
    ENCODER: {"image_size": None},
    PACKAGE: {"backend": LITE_BACKENDS.default, "threads": 1},
}


@dataclass(frozen=True)
class Found:
    """What a folder holds: its kind (one of OPTIONS) and a line saying what it is."""

    kind: str
    description: str


def describe(path: PathLike) -> Found:
    """What `path` holds, or ConfigError saying what was looked for."""
    from mindvl.generation.language_model import is_llm_folder
    from mindvl.package_reader import MANIFEST
    from mindvl.pretrained.store import FORMAT as ENCODER_FORMAT
    from mindvl.pretrained.store import KINDS as ENCODER_KINDS
    from mindvl.pretrained.store import read_config, read_json
    from mindvl.pretrained.vlm import is_vlm_folder
    from mindvl.runs import is_run_folder, read_run_config, resolve_checkpoint

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    if is_llm_folder(path):
        config = json.loads((path / "config.json").read_text())
        return Found(LLM, f"{LLM} ({config.get('architecture', 'decoder')}, "
                          f"{config.get('decoder', {}).get('layers', '?')} layers, {config.get('weights', 'float32')} "
                          f"weights) written by `mindvl convert llm`")
    if is_vlm_folder(path):
        config = json.loads((path / "config.json").read_text())
        return Found(VLM, f"{VLM} ({config.get('architecture')}, vision {config['vision'].get('layers', '?')} layers, "
                          f"language {config['decoder'].get('layers', '?')} layers) written by `mindvl convert vlm`")
    if (path / MANIFEST).is_file():
        manifest = json.loads((path / MANIFEST).read_text())
        kind = "generative" if manifest.get("kind") == "generative" else "classifier"
        return Found(PACKAGE, f"{PACKAGE} ({manifest.get('name')} version {manifest.get('version')}, {kind}) "
                              f"written by `mindvl export`")
    if is_run_folder(path) or path.suffix == ".safetensors" and path.is_file():
        weights = resolve_checkpoint(path)
        config = read_run_config(weights)
        model = config.get("model", {})
        generative = model.get("decoder", {}).get("layers", 0) > 0 or bool(model.get("pretrained", {}).get("decoder"))
        kind = GENERATIVE_RUN if generative else CLASSIFIER_RUN
        return Found(kind, f"{kind} ({config.get('name')}, checkpoint {weights.parent.name})")
    config_file = path / "config.json"
    if config_file.is_file():
        config = read_json(config_file, "a converted encoder", "`mindvl convert`")
        if isinstance(config, dict) and "format" in config:  # written by mindvl: an encoder, or refused saying why
            if config.get("format") != ENCODER_FORMAT or config.get("kind") not in ENCODER_KINDS:
                read_config(path)  # raises, naming what the folder's config.json says
            return Found(ENCODER, f"{ENCODER} ({config['kind']}, {config['encoder'].get('layers', '?')} layers) "
                                  f"written by `mindvl convert`")
    raise ConfigError(f"{path}: not a folder mindvl opens; expected a converted LLM, VLM or encoder (`mindvl convert`), "
                      f"a training run (`mindvl train`) or a model package (`mindvl export`)")


def _options(found: Found, given: dict) -> dict:
    """The kind's options with what the caller gave; an option the kind does not take is refused by name."""
    allowed = OPTIONS[found.kind]
    unknown = sorted(name for name, value in given.items() if value is not None and name not in allowed)
    if unknown:
        takes = f"takes {', '.join(allowed)}" if allowed else "takes no option"
        raise ConfigError(f"{', '.join(unknown)}: not an option of {found.kind} ({takes})")
    return {name: default if given.get(name) is None else given[name] for name, default in allowed.items()}


def from_pretrained(path: PathLike, *, cache_len: Optional[int] = None, kernels: Optional[str] = None,
                    weights: Optional[str] = None, image_size: Optional[int] = None, backend: Optional[str] = None,
                    threads: Optional[int] = None) -> Any:
    """Open whatever `path` holds (see the module docstring) and log what it found.

    cache_len: prompt + new tokens at most (an LLM or VLM: 1024, a generative run: 256); kernels: mindvl.choices.
    KERNELS (a generator's; "auto"); weights: mindvl.choices.GENERATION_WEIGHTS (an LLM's or a VLM's: "stored", or
    int8 / int4 quantizing a float32 folder's decoder as it loads); image_size: a converted vision encoder built for another resolution;
    backend and threads: a package's device runtime (LiteModel's backend, workers per modality)."""
    found = describe(path)
    options = _options(found, {"cache_len": cache_len, "kernels": kernels, "weights": weights, "image_size": image_size,
                               "backend": backend, "threads": threads})
    LOG.info("mindvl: %s: %s", path, found.description)
    return _OPEN[found.kind](Path(path), **options)


def _open_llm(path: Path, cache_len: int, kernels: str, weights: str):
    from mindvl.generation.language_model import LanguageModel

    return LanguageModel(path, cache_len, kernels, weights)


def _open_vlm(path: Path, cache_len: int, kernels: str, weights: str):
    from mindvl.generation.native_generator import NativeGenerator

    return NativeGenerator.from_folder(path, cache_len, kernels, weights)


def _open_generative_run(path: Path, cache_len: int, kernels: str):
    from mindvl.chat import recipe_chat
    from mindvl.generation.multimodal_generator import MultimodalGenerator
    from mindvl.model_factory import load_model

    cfg, model, source = load_model(path)
    if cfg.model.is_native:  # a fine-tuned Qwen2(.5)-VL
        from mindvl.generation.native_generator import NativeGenerator

        return NativeGenerator.from_run(cfg, model, cache_len, kernels, source)
    chat = recipe_chat(cfg, model.image_tokens, model.audio_tokens)
    return MultimodalGenerator(model, chat.tokenizer, chat, cfg.preprocess, cache_len, kernels)


def _open_classifier_run(path: Path):
    from mindvl.model_factory import load_model

    return load_model(path)[1]


def _open_encoder(path: Path, image_size: Optional[int]):
    from mindvl.pretrained.store import load_converted

    return load_converted(path, image_size=image_size)


def _open_package(path: Path, backend: str, threads: int):
    from mindvl.lite.device import DevicePipeline

    return DevicePipeline(path, backend=backend, threads=threads)


_OPEN = {LLM: _open_llm, VLM: _open_vlm, GENERATIVE_RUN: _open_generative_run, CLASSIFIER_RUN: _open_classifier_run,
         ENCODER: _open_encoder, PACKAGE: _open_package}

