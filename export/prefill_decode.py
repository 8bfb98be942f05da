"""Writing a generative model (a MultimodalLM) as a model package: attachments, prefill per bucket, decode.

  attachments.mindir      image + log-mel -> projected image and audio tokens (the encoders and projectors)
  prefill_<L>.mindir      a prompt of L tokens (left-padded) -> last logits and the key/value caches
  decode.mindir           one token per running sequence, each at its own cache slot -> logits and caches
  weights.bin             every graph's parameters, once (export/shared_weights.py): the decoder is in each
                          prefill graph and in decode, and would otherwise be stored 1 + buckets times
  samples/<graph>.safetensors   each graph's sample inputs and the framework's outputs (as any package)
  samples/generation.safetensors + manifest "generation_samples": real test questions (typed and spoken,
                          about their image) and the tokens the framework generated for them, greedy

  lite2/                  (--target lite2) the same graphs at batch 1 for the MindSpore Lite 2.0 runtime, their
                          parameters in ../weights.bin, and the device assets (export/lite2_folder.py)

The manifest's "generation" section (mindvl.engine.decode_loop.GenerationSpec) holds the cache length, the
buckets, the chat template, the stop tokens and the request limit; the tokenizer is tokenizer.json.
"""
import json
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
from safetensors.numpy import save_file

from mindvl.cells import AttachmentNet, DecodeNet, PrefillNet
from mindvl.config import Config
from mindvl.engine.decode_loop import DecodeBatch
from mindvl.engine.package_graphs import (ATTACHMENTS, DECODE, DECODE_WIDE, EXTEND_STEPS, SECTION, SPEECH, WIDE_ROWS,
                                         GenerationSpec, PackageGraphs, extend_name, prefill_name)
from mindvl.engine.prompts import MultimodalPrompt, PromptLayout, prompt_buckets
from mindvl.engine.sampling import sampling_config
from mindvl.errors import PackageError
from mindvl.export.graphs import GraphSpec, TensorSpec
from mindvl.export.lite2_folder import GENERATIVE_BATCH, wants_generation_lite2, write_generative_lite2
from mindvl.export.package_writer import file_entries, manifest_head, write_graph
from mindvl.export.shared_weights import share_weights
from mindvl.files import swap_folder, work_folder
from mindvl.package_reader import MANIFEST, TOLERANCE, graph_caller
from mindvl.preprocess import preprocess_dict
from mindvl.progress import progress_bar

SAMPLE_QUESTIONS = 4  # stored test questions, alternately typed and spoken
SAMPLE_TOKENS = 16  # tokens generated for each at export (greedy) and again by `export verify`
MAX_NEW_TOKENS = 64  # the most tokens one request may ask for (the cache holds the longest bucket + these)
VISION = "vision_"  # a native package's vision graphs: vision_<patches>


def prefill_buckets(cache_len: int, max_new_tokens: int, buckets: Sequence[int] = ()) -> List[int]:
    """The prompt lengths to export a prefill graph for: `buckets` checked, or every prompt_buckets size that
    leaves room for max_new_tokens."""
    fitting = [b for b in prompt_buckets(cache_len) if b + max_new_tokens <= cache_len]
    if not fitting:
        raise PackageError(f"a cache of {cache_len} tokens leaves no prompt bucket with room for {max_new_tokens} "
                           f"new tokens; raise --cache-len")
    wrong = [b for b in buckets if b < 1 or b + max_new_tokens > cache_len]
    if wrong:
        raise PackageError(f"--prompt-bucket {wrong[0]}: expected 1..{cache_len - max_new_tokens} (the cache of "
                           f"{cache_len} tokens holds the prompt and {max_new_tokens} new tokens)")
    return sorted(set(buckets)) or fitting


def generation_spec(model, chat, cache_len: int, max_new_tokens: int,
                    buckets: Sequence[int] = ()) -> GenerationSpec:
    """buckets: the prompt lengths to export a prefill graph for (default: every prompt_buckets size that leaves
    room for max_new_tokens). Each prefill graph holds the decoder: a server or device keeps one copy of its
    weights in memory per graph, so a large decoder wants few buckets."""
    lm = model.decoder
    return GenerationSpec(cache_len=cache_len, buckets=prefill_buckets(cache_len, max_new_tokens, buckets), layers=lm.layers, vocab_size=lm.cfg.vocab_size,
                          width=lm.width, kv_width=lm.kv_width, image_tokens=model.image_tokens,
                          audio_tokens=model.audio_tokens, pad_id=chat.pad_id, stop_ids=[chat.stop_id],
                          chat_template=chat.template.name, max_new_tokens=max_new_tokens,
                          extend_steps=EXTEND_STEPS, wide_rows=WIDE_ROWS)


def decode_graphs(spec: GenerationSpec) -> List[GraphSpec]:
    """The decode graph of every generation package (the decoder's step), the same step for many rows (its products
    laid out for them: cells.linear's docstring) and the several-token step (a reused prefix's rest, drafts
    verified: the server's prefix caching and speculative decoding)."""
    def step(name: str, steps: int, doc: str, wide: bool = False) -> GraphSpec:
        inputs = [TensorSpec(what, "int32", (-1, steps)) for what in ("token", "position", "slot")]
        return GraphSpec(name, doc, partial(DecodeNet, wide=wide),
                         inputs + [TensorSpec("slot_valid", "int32", (-1, spec.cache_len))] + cache_specs(spec),
                         [TensorSpec("logits", "float32", (-1, spec.vocab_size)), *cache_specs(spec, wide)])

    graphs = [step(DECODE, 1, "one token per sequence, each at its own cache slot -> logits and caches")]
    if spec.wide_rows:
        graphs.append(step(DECODE_WIDE, 1, f"decode for {spec.wide_rows} sequences or more (the same numbers) -> "
                                           f"logits and each sequence's new key and value rows, which the caller "
                                           f"writes at its slot (the caches are only read)", True))
    if spec.extend_steps:
        graphs.append(step(extend_name(spec.extend_steps), spec.extend_steps,
                           f"{spec.extend_steps} tokens per sequence at consecutive cache slots -> each one's logits "
                           f"(rows x {spec.extend_steps}) and the caches"))
    return graphs


def cache_specs(spec: GenerationSpec, rows: bool = False) -> List[TensorSpec]:
    """Every layer's key cache, then its value cache; rows: a step's new rows (B, 1, kv_width) instead."""
    return [TensorSpec(f"{'new' if rows else 'cache'}_{kind}_{i}", "float32",
                       (-1, 1 if rows else spec.cache_len, spec.kv_width))
            for kind in ("k", "v") for i in range(spec.layers)]


def graph_specs(spec: GenerationSpec, pre) -> List[GraphSpec]:
    caches = cache_specs(spec)
    logits = TensorSpec("logits", "float32", (-1, spec.vocab_size))
    tokens = [TensorSpec("image_tokens", "float32", (-1, spec.image_tokens, spec.width)),
              TensorSpec("audio_tokens", "float32", (-1, spec.audio_tokens, spec.width))]
    specs = [GraphSpec(ATTACHMENTS, "image + log-mel -> the decoder-width image and audio tokens", AttachmentNet,
                       [TensorSpec("image", "float32", (-1, 3, pre.image_size, pre.image_size)),
                        TensorSpec("audio_mel", "float32", (-1, pre.n_mels, pre.max_audio_frames)),
                        TensorSpec("audio_mask", "float32", (-1, pre.max_audio_frames))], tokens)]
    for bucket in spec.buckets:
        row = [TensorSpec(name, "int32", (-1, bucket)) for name in ("ids", "valid", "slot_index")]
        specs.append(GraphSpec(prefill_name(bucket), f"a left-padded prompt of {bucket} tokens -> its last logits "
                               f"and the caches", PrefillNet, row + tokens, [logits, *caches]))
    return specs + decode_graphs(spec)


def _fitting(prompts: Sequence, layout, bucket: int) -> list:
    """The sample prompts a bucket can hold; the typed questions without their attachments when none fits."""
    fits = [p for p in prompts if len(layout.render(p)) <= bucket]
    if not fits:
        fits = [layout.text_only(p) for p in prompts if p.question]
        fits = [p for p in fits if len(layout.render(p)) <= bucket]
    if not fits:
        raise PackageError(f"no sample question fits the prompt bucket of {bucket} tokens")
    return fits


@dataclass
class GenerationPackage:
    """What a generation package's writer needs from its model's kind: the spec, the graphs with their cells, the
    layout of the stored questions and how each is stored (arrays in samples/generation.safetensors, a manifest
    entry), the manifest's model-specific sections and the Lite 2.0 folder's writer (None: no lite2)."""

    name: str
    model: object
    spec: GenerationSpec
    graphs: List[GraphSpec]
    layout: object
    prompts: list
    prompt_arrays: Callable[[object], Dict[str, np.ndarray]]
    prompt_entry: Callable[[object], dict]
    sections: Dict[str, object]
    files: Dict[str, str]  # more files of the package: name -> text
    write_lite2: Optional[Callable] = None


def write_generation_package(package: GenerationPackage, out: Path, source: Mapping[str, object], version: int = 1,
                             force: bool = False, progress: bool = True,
                             compression: Optional[Mapping[str, object]] = None) -> Path:
    """The package folder of `package`, written aside and swapped in: each graph with its sample inputs and the
    framework's outputs, the parameters once in weights.bin, the stored questions with the framework's greedy
    tokens, the tokenizer and the manifest."""
    out, spec, layout = Path(out), package.spec, package.layout
    if out.exists() and not force:
        raise PackageError(f"{out}: already exists; pass --force to replace it or choose another --out")
    prompts = [p for p in package.prompts if len(layout.render(p)) <= spec.buckets[-1]]
    if not prompts:
        raise PackageError(f"no sample question fits the largest prompt bucket ({spec.buckets[-1]} tokens); add a "
                           f"larger --prompt-bucket")
    nets = {g.name: g.build(package.model) for g in package.graphs}
    batch = DecodeBatch(layout, PackageGraphs(spec, graph_caller(nets)))
    work = work_folder(out)
    (work / "samples").mkdir()
    try:
        entries = {}
        for graph in progress_bar(package.graphs, desc="export graphs", disable=not progress, leave=False):
            inputs = _sample_inputs(graph.name, batch, layout, prompts)
            entries[graph.name] = write_graph(graph, nets[graph.name], dict(zip((t.name for t in graph.inputs),
                                                                                 inputs)), work, None)
        sizes = share_weights(work, [entry["file"] for entry in entries.values()])
        greedy = sampling_config(max_new_tokens=SAMPLE_TOKENS)
        generated = DecodeBatch(layout, batch.graphs).generate(prompts, greedy)
        save_file({f"{i}.{name}": np.ascontiguousarray(value) for i, p in enumerate(prompts)
                   for name, value in package.prompt_arrays(p).items()}, str(work / "samples" / "generation.safetensors"))
        layout.tokenizer.save(str(work / spec.tokenizer))
        lite2 = None if package.write_lite2 is None else package.write_lite2(  # the device takes a token a step
            work, [(g, _sample_inputs(g.name, batch, layout, prompts, GENERATIVE_BATCH)) for g in package.graphs
                   if g.name not in (extend_name(spec.extend_steps), DECODE_WIDE)])
        for name, text in package.files.items():
            (work / name).write_text(text)
        manifest = {
            **manifest_head(package.name, package.model, source, version, compression, None),
            "kind": "generative",
            **package.sections,
            "labels": [],
            "graphs": entries,
            SECTION: spec.to_dict(),
            "generation_samples": {
                "file": "samples/generation.safetensors", "max_new_tokens": SAMPLE_TOKENS,
                "prompts": [{**package.prompt_entry(p), "tokens": g.tokens, "text": g.text}
                            for p, g in zip(prompts, generated)]},
            "weights": {"file": "weights.bin", **sizes},
            **({"lite2": lite2} if lite2 else {}),
            "tolerance": TOLERANCE,
            "files": file_entries(work),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        swap_folder(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def write_generative_package(cfg: Config, model, chat, prompts: Sequence[MultimodalPrompt], out: Path,
                             source: Mapping[str, object], cache_len: int = 0, max_new_tokens: int = MAX_NEW_TOKENS,
                             version: int = 1, force: bool = False, progress: bool = True,
                             compression: Optional[Mapping[str, object]] = None,
                             buckets: Sequence[int] = (), lite2_batch: Optional[int] = None) -> Path:
    """Export `model` (a MultimodalLM in eval mode, `chat` its recipe's ChatEncoder) into the package `out`;
    `prompts`: real test questions stored with the framework's greedy tokens (those no bucket holds are left
    out). cache_len 0: the decoder's max_positions, at most 512; buckets: generation_spec's. lite2_batch: also
    write lite2/, the generation graphs for the MindSpore Lite 2.0 runtime (export/lite2_folder.py
    write_generative_lite2); batch 1 only."""
    lite2 = wants_generation_lite2(lite2_batch, "generative")
    lm = model.decoder
    cache_len = int(cache_len or min(lm.cfg.max_positions, 512))
    spec = generation_spec(model, chat, cache_len, max_new_tokens, buckets)
    lm.cache_len = cache_len  # a constant of the generation graphs
    model.set_train(False)
    layout = PromptLayout(chat, cfg.preprocess, spec.limits, spec.pad_id, spec.stop_ids)
    package = GenerationPackage(
        cfg.name, model, spec, graph_specs(spec, cfg.preprocess), layout, list(prompts),
        lambda p: {name: value for name, value in (("image", p.image), ("mel", p.mel), ("frame_mask", p.frame_mask))
                   if value is not None},
        lambda p: {"question": p.question, "image": p.image is not None, "audio": p.mel is not None},
        {"preprocess": {**preprocess_dict(cfg.preprocess), "tokenizer": spec.tokenizer}},
        {"config.json": json.dumps(cfg.to_dict(), indent=2)},
        None if not lite2 else
        lambda work, samples: write_generative_lite2(work, model, samples, spec, chat, cfg.preprocess,
                                                     _decoder_sentencepiece(cfg), [p.question for p in prompts]))
    return write_generation_package(package, out, source, version, force, progress, compression)


def _decoder_sentencepiece(cfg: Config) -> Optional[Path]:
    """The converted decoder's SentencePiece model (mindvl.pretrained.llm.sentencepiece_file), None for a decoder
    without one or trained from scratch."""
    from mindvl.pretrained.llm import sentencepiece_file

    folder = cfg.model.pretrained.decoder
    return sentencepiece_file(folder) if folder else None


def _sample_inputs(name: str, batch: DecodeBatch, layout, prompts: Sequence, rows: int = 0) -> List[np.ndarray]:
    """Graph `name`'s sample inputs from the stored prompts (the decode graph's: one step after a prefill), at
    most `rows` of them (0: all; the lite2 graphs' batch-1 samples)."""
    if name == ATTACHMENTS:
        laid = layout.batch(list(prompts[:rows or None]), 1)
        return [laid.image, laid.mel, laid.frame_mask]
    if name == SPEECH:  # the prompts with a clip
        heard = [p for p in prompts if p.audio is not None][:rows or None]
        if not heard:
            raise PackageError(f"no stored spoken question fits the largest prompt bucket ({layout.limits.buckets[-1]} "
                               f"tokens), so the speech graph has no sample; add a larger --prompt-bucket")
        return list(layout.speech(heard))
    if name.startswith(VISION):  # the prompts whose images this size holds together, in order
        size = int(name.rsplit("_", 1)[1])
        fitting = [p for p in prompts if p.attachments and layout.vision_size([p]) <= size][:rows or None]
        while len(fitting) > 1 and layout.vision_size(fitting) > size:
            fitting.pop()
        return list(layout.vision_inputs(fitting, size))
    if name in (DECODE, DECODE_WIDE, extend_name(batch.graphs.spec.extend_steps)):
        steps = batch.graphs.spec.extend_steps if name.startswith("extend") else 1
        step = DecodeBatch(layout, batch.graphs)
        step.prefill(prompts, [sampling_config(max_new_tokens=2)] * len(prompts))
        step.sample_or_raise()
        running = step.rows[:rows or None]
        if not running:
            raise PackageError("every sample question stopped at its first token; no decode step to store")
        for row in running:
            row.slot_valid[row.slot:row.slot + steps] = True
        ahead = np.arange(steps, dtype=np.int32)  # the last token again as the drafts: any tokens do
        return [np.array([[r.sequence.tokens[-1]] * steps for r in running], np.int32),
                np.array([r.position + ahead for r in running], np.int32),
                np.array([r.slot + ahead for r in running], np.int32),
                np.stack([r.slot_valid for r in running]).astype(np.int32),
                *step.row_caches(running)]
    bucket = int(name.rsplit("_", 1)[1])
    only = layout.with_buckets([bucket])  # this bucket's layout
    return batch.graphs.prefill_inputs(only.batch(_fitting(prompts, layout, bucket)[:rows or None], 1))
