"""The servable directory MindSpore Serving reads, and `deploy`, which puts a model package into it.

  <servable_dir>/<name>/servable_config.py   the servable's methods (deploy generates it when absent)
  <servable_dir>/<name>/<n>/                  version n = 1, 2, ...: a model package's files

Names and versions arrive in requests, so every path is validated and must stay inside the servable
directory once symlinks are resolved. A version folder appears complete or not at all: deploy copies the
package into a hidden sibling and renames it into place; when two deploys race for a number, the rename
fails for one of them, which takes the next number.
"""
import ast
import dataclasses
import errno
import os
import pprint
import re
import shutil
import uuid
from pathlib import Path, PurePosixPath
from typing import List, Optional, Tuple, Union

from mindvl.config import PreprocessConfig
from mindvl.engine.package_graphs import SECTION
from mindvl.errors import PackageError
from mindvl.files import swap_folder
from mindvl.package_reader import MANIFEST, check_files, read_manifest
from mindvl.serving.protocol import is_safe_name
from mindvl.serving.register import MissingServable, ServableDefinition, ServableError, load_servable_config

CONFIG_FILE = "servable_config.py"
VERSION = re.compile(r"[1-9][0-9]*")
RENAME_ATTEMPTS = 100  # a failed rename means another deploy took the number; this only bounds a broken filesystem

PathLike = Union[str, Path]


def check_name(name: str) -> str:
    """`name` if it can name a servable (one folder of the servable directory), else ServableError."""
    if not is_safe_name(name):
        raise ServableError(f"servable name {name!r}: expected letters, digits, '_', '.' or '-' (not '.' or '..')")
    return name


def _inside(path: Path, servable_dir: PathLike, what: str) -> Path:
    """`path` resolved, refused unless it stays inside the servable directory (symlinks followed)."""
    resolved, root = path.resolve(), Path(servable_dir).resolve()
    if not resolved.is_relative_to(root):
        raise ServableError(f"{what}: {path} resolves to {resolved}, outside the servable directory {root}; "
                            f"refusing it (a symlink pointing elsewhere?)")
    return resolved


def _versions(folder: Path) -> List[int]:
    return sorted(int(p.name) for p in folder.iterdir() if VERSION.fullmatch(p.name) and p.is_dir())


def list_servables(servable_dir: PathLike) -> List[str]:
    """Names of the servables in `servable_dir`: its folders holding a servable_config.py, sorted."""
    root = Path(servable_dir)
    if not root.is_dir():
        raise ServableError(f"servable directory {root}: no such folder; deploy a package into it first")
    return sorted(p.name for p in root.iterdir() if is_safe_name(p.name) and (p / CONFIG_FILE).is_file())


def servable_folder(servable_dir: PathLike, name: str) -> Path:
    """The existing folder of servable `name` (resolved); errors list the servables there are."""
    folder = _inside(Path(servable_dir) / check_name(name), servable_dir, f"servable {name}")
    if not (folder / CONFIG_FILE).is_file():
        have = ", ".join(list_servables(servable_dir)) or "none"
        raise MissingServable(f"servable {name}: not in {servable_dir} (it has: {have})")
    return folder


def list_versions(servable_dir: PathLike, name: str) -> List[int]:
    """Version numbers of servable `name`, ascending."""
    return _versions(servable_folder(servable_dir, name))


def resolve(servable_dir: PathLike, name: str, version: Optional[int] = None) -> Path:
    """The version folder to serve (resolved); version 0 or None: the newest."""
    folder = servable_folder(servable_dir, name)
    versions = _versions(folder)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        raise ServableError(f"servable {name}: version {version!r}: expected a positive integer, or 0 for the newest")
    if not versions:
        raise MissingServable(f"servable {name}: has no version folder; deploy a package into it")
    version = version or versions[-1]
    if version not in versions:
        raise MissingServable(f"servable {name}: has no version {version} (it has {', '.join(map(str, versions))})")
    return _inside(folder / str(version), servable_dir, f"servable {name} version {version}")


# ----------------------------------------------------------------------------- deploy

def deploy(package: PathLike, servable_dir: PathLike, name: str) -> Tuple[int, Path]:
    """Copy the model package into the next version folder of servable `name`; -> (version, its folder).

    Every file's sha256 is checked first (PackageError names a changed file). servable_config.py is
    generated when the servable has none; an existing one must fit the package (its models present with
    their input and output counts; a generated one also its preprocessing, tokenizer and labels).
    """
    package = Path(package)
    manifest = read_manifest(package)
    outside = [n for n in manifest["files"] if PurePosixPath(n).is_absolute() or ".." in PurePosixPath(n).parts]
    if outside:
        raise PackageError(f"{package / MANIFEST}: lists {outside[0]!r}, outside the package; re-export the package")
    check_files(package, manifest)
    if Path(servable_dir).exists() and not Path(servable_dir).is_dir():
        raise ServableError(f"servable directory {servable_dir}: a file, not a folder; name a folder (created when "
                            f"missing) with --servable-dir")
    folder = _inside(Path(servable_dir) / check_name(name), servable_dir, f"servable {name}")
    folder.mkdir(parents=True, exist_ok=True)
    _install_config(folder / CONFIG_FILE, manifest, package)
    return _install_version(package, manifest, folder)


def _install_config(config: Path, manifest: dict, package: Path) -> None:
    if not config.exists():
        temporary = config.with_name(f".{CONFIG_FILE}.{uuid.uuid4().hex}")
        temporary.write_text(config_text(manifest, config.parent.name))
        try:
            os.link(temporary, config)  # never replaces: a concurrent deploy's file wins, and is checked below
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    check_config(load_servable_config(config), manifest, package)


def _install_version(package: Path, manifest: dict, folder: Path) -> Tuple[int, Path]:
    work = folder / f".deploy-{uuid.uuid4().hex}"
    try:
        for name in (MANIFEST, *manifest["files"]):
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(package / name, work / name)
        for _ in range(RENAME_ATTEMPTS):
            version = max(_versions(folder), default=0) + 1
            try:
                swap_folder(work, folder / str(version), exclusive=True)  # fails when another deploy won it
                return version, folder / str(version)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        raise ServableError(f"servable {folder.name}: no free version number after {RENAME_ATTEMPTS} attempts")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone after the rename; a half copy otherwise


# ----------------------------------------------------------------------------- servable_config.py

def package_contract(manifest: dict) -> dict:
    """What a generated servable_config.py records of its package (as `PACKAGE`), and so what every version
    of the servable must share: preprocessing parameters, the tokenizer (file, sha256), the answer labels."""
    native = (manifest.get(SECTION) or {}).get("native")
    if native:  # a native-resolution VLM's package: its image and video processing
        file = manifest[SECTION]["tokenizer"]
        return {"native": {"patches": native["patches"], "video": native["video"]},
                "tokenizer": {"file": file, "sha256": manifest["files"][file]["sha256"]}, "labels": []}
    pre = manifest["preprocess"]
    return {"preprocess": {f.name: pre[f.name] for f in dataclasses.fields(PreprocessConfig)},
            "tokenizer": {"file": pre["tokenizer"], "sha256": manifest["files"][pre["tokenizer"]]["sha256"]},
            "labels": list(manifest["labels"])}


def recorded_contract(config: Path) -> Optional[dict]:
    """The `PACKAGE = {...}` literal of a generated servable_config.py; None for a hand-written one."""
    for node in ast.parse(config.read_text(), str(config)).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PACKAGE"]:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _differences(recorded, expected, prefix: str = "") -> List[str]:
    if isinstance(recorded, dict) and isinstance(expected, dict):
        return [d for key in sorted(set(recorded) | set(expected))
                for d in _differences(recorded.get(key), expected.get(key), f"{prefix}{key}.")]
    return [] if recorded == expected else [prefix.rstrip(".")]


def check_config(definition: ServableDefinition, manifest: dict, package: Path) -> None:
    """Raise ServableError unless the servable's config can serve the package."""
    config = definition.config
    recorded = recorded_contract(config)
    differing = [] if recorded is None else _differences(recorded, package_contract(manifest))
    if differing:
        raise ServableError(f"{config}: generated for a package with other {', '.join(differing)} than {package}; "
                            f"deploy it under another servable name, or delete servable_config.py to generate one "
                            f"for this package (versions deployed before it would then no longer fit)")
    generative = SECTION in manifest
    if definition.generation != generative:
        what = "declares generation" if definition.generation else "declares methods over graphs"
        raise ServableError(f"{config}: {what}, but {package} is {'a' if generative else 'not a'} generative model "
                            f"package; deploy it under another servable name")
    graphs = {entry["file"]: (name, entry) for name, entry in manifest["graphs"].items()}
    for model in definition.models:
        model.check_loadable()
        missing = [f for f in model.files if f not in graphs]
        if missing:
            raise ServableError(f"{config}: declares model {missing[0]}, which {package} lacks (it has "
                                f"{', '.join(graphs)}); re-export with that graph or edit servable_config.py")
    for method in definition.methods.values():
        for number, stage in enumerate(method.stages, 1):
            if not stage.is_model or len(stage.target.files) != 1:
                continue
            graph, entry = graphs[stage.target.files[0]]
            for what, given, spec in (("inputs", len(stage.args), entry["inputs"]),
                                      ("outputs", len(stage.outputs), entry["outputs"])):
                if given != len(spec):
                    raise ServableError(f"{config}: method {method.name}: stage {number} ({stage.name}) has "
                                        f"{given} {what} but graph {graph} has {len(spec)} "
                                        f"({', '.join(t['name'] for t in spec)})")


_HEADER = '''"""Servable {name}, generated by mindvl deploy from the model package {package} (format {format_version}).

Runs under MindSpore Serving 2.0 and under `mindvl serve`. Every method takes one instance; the server
stacks instances into batches for the model stages (with_batch_dim=True).
{methods}
The Python stages call mindvl.preprocess with the parameters in PACKAGE: a stage cannot know which version
folder is being served, so they are recorded here, and `mindvl deploy` refuses a package whose
preprocessing, tokenizer or labels differ from them. The tokenizer is read from the newest version folder
holding the file with PACKAGE's sha256 (every version does).
"""
import functools
from pathlib import Path

from mindspore_serving.server import register

from mindvl import preprocess as P
from mindvl.config import PreprocessConfig
from mindvl.files import sha256_file

PACKAGE = {contract}
PRE = PreprocessConfig(**PACKAGE["preprocess"])
HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def tokenizer():
    """The package's tokenizer, read on first use."""
    versions = sorted((p for p in HERE.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
    for folder in versions:
        path = folder / PACKAGE["tokenizer"]["file"]
        if path.is_file() and sha256_file(path) == PACKAGE["tokenizer"]["sha256"]:
            return P.TextTokenizer.load(path)
    raise RuntimeError(f"{{HERE}}: no version folder holds the tokenizer this servable_config.py was generated "
                       f"for (sha256 {{PACKAGE['tokenizer']['sha256']}}); deploy that package again")


INPUTS = P.RequestInputs(PRE, tokenizer)  # the stages below, as the device pipeline runs them too


def pixels(image):
    """PNG/JPEG bytes -> float32 (3, image_size, image_size), normalised as in training."""
    return INPUTS.pixels(image)
'''

_GRAPHS = {
    "vqa": ("predict(image, question, audio) -> answer, confidence, answer_text\n"
            "    image: PNG/JPEG bytes; question: str ('' when spoken); audio: WAV bytes (b'' when typed);\n"
            "    answer: the most probable label, confidence: its probability (float32), answer_text: the\n"
            "    generated answer", '''
vqa_graph = register.declare_model(model_file="{file}", model_format="MindIR", with_batch_dim=True)


def question_input(question, audio):
    """The typed question -> (ids, mask, use_text); zeros and use_text 0 when the question is only spoken."""
    INPUTS.check_asked(question, audio)
    return INPUTS.question_input(question)


def audio_input(audio):
    """The spoken question -> (log-mel, frame mask, use_audio); zeros and use_audio 0 when there is none."""
    return INPUTS.audio_input(audio)


def vqa_answer(answer_logits, answer_ids):
    """The vqa graph's outputs for one instance -> (label, its softmax probability, generated text)."""
    return INPUTS.vqa_answer(answer_logits, answer_ids, PACKAGE["labels"])


@register.register_method(output_names=["answer", "confidence", "answer_text"])
def predict(image, question, audio):
    image_pixels = register.add_stage(pixels, image, outputs_count=1)
    question_ids, question_mask, use_text = register.add_stage(question_input, question, audio, outputs_count=3)
    audio_mel, audio_mask, use_audio = register.add_stage(audio_input, audio, outputs_count=3)
    answer_logits, answer_ids = register.add_stage(vqa_graph, image_pixels, question_ids, question_mask, audio_mel,
                                                   audio_mask, use_text, use_audio, outputs_count=2)
    answer, confidence, answer_text = register.add_stage(vqa_answer, answer_logits, answer_ids, outputs_count=3)
    return answer, confidence, answer_text
'''),
    "image_embed": ("embed_image(image) -> embedding    image: PNG/JPEG bytes; embedding: float32, unit length", '''

image_embed_graph = register.declare_model(model_file="{file}", model_format="MindIR", with_batch_dim=True)


@register.register_method(output_names=["embedding"])
def embed_image(image):
    image_pixels = register.add_stage(pixels, image, outputs_count=1)
    embedding = register.add_stage(image_embed_graph, image_pixels, outputs_count=1)
    return embedding
'''),
    "text_embed": ("embed_text(text) -> embedding      text: str; embedding: float32, unit length", '''

text_embed_graph = register.declare_model(model_file="{file}", model_format="MindIR", with_batch_dim=True)


def text_input(text):
    return INPUTS.tokens(text, "text")


@register.register_method(output_names=["embedding"])
def embed_text(text):
    text_ids, text_mask = register.add_stage(text_input, text, outputs_count=2)
    embedding = register.add_stage(text_embed_graph, text_ids, text_mask, outputs_count=1)
    return embedding
'''),
    "audio_embed": ("embed_audio(audio) -> embedding    audio: WAV/FLAC/OGG bytes; embedding: float32, unit length",
                    '''

audio_embed_graph = register.declare_model(model_file="{file}", model_format="MindIR", with_batch_dim=True)


def audio_embed_input(audio):
    return INPUTS.speech(audio, "audio")


@register.register_method(output_names=["embedding"])
def embed_audio(audio):
    audio_mel, audio_mask = register.add_stage(audio_embed_input, audio, outputs_count=2)
    embedding = register.add_stage(audio_embed_graph, audio_mel, audio_mask, outputs_count=1)
    return embedding
'''),
}


_GENERATIVE = '''"""Servable {name}, generated by mindvl deploy from the generative model package {package} (format
{format_version}).

Method `generate`: an image and a question, typed (`text`) or spoken (`audio`, a WAV), with the generation settings
(max_tokens, temperature, top_p, top_k, repetition_penalty, stop, seed) -> the answer in words (a native-resolution
VLM's package: several `images` and a `video` instead). It runs mindvl's
generation engine over the package's prefill and decode graphs: continuous batching, streaming (Server-Sent
Events), the OpenAI chat API. MindSpore Serving 2.0 has no generation loop: this servable runs under `mindvl serve`.
`mindvl deploy` refuses a package whose preprocessing or tokenizer differ from PACKAGE's.
"""
from mindspore_serving.server import register

PACKAGE = {contract}

register.declare_generation()
'''


def config_text(manifest: dict, name: str) -> str:
    """The servable_config.py for a mindvl package: one method per graph it has (predict, embed_image,
    embed_text, embed_audio), written against MindSpore Serving's documented API; `generate` for a generative
    package."""
    if SECTION in manifest:
        return _GENERATIVE.format(name=check_name(name), package=f"{manifest['name']} v{manifest['version']}",
                                  format_version=manifest["format_version"],
                                  contract=pprint.pformat(package_contract(manifest), width=100, sort_dicts=False)
                                  .replace("\n", "\n" + " " * len("PACKAGE = ")))
    graphs = [graph for graph in _GRAPHS if graph in manifest["graphs"]]
    if not graphs:
        raise ServableError(f"package {manifest['name']}: has none of the graphs {', '.join(_GRAPHS)} "
                            f"(only {', '.join(manifest['graphs'])}); export one of them to serve it")
    methods = "".join(f"\n{_GRAPHS[graph][0]}\n" for graph in graphs)
    header = _HEADER.format(name=check_name(name), package=f"{manifest['name']} v{manifest['version']}",
                            format_version=manifest["format_version"], methods=methods,
                            contract=pprint.pformat(package_contract(manifest), width=100, sort_dicts=False)
                            .replace("\n", "\n" + " " * len("PACKAGE = ")))
    return header + "".join("\n" + _GRAPHS[graph][1].format(file=manifest["graphs"][graph]["file"]) for graph in graphs)
