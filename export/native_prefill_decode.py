"""Writing a converted native-resolution VLM (Qwen2-VL, Qwen2.5-VL: mindvl.generation.NativeGenerator) as a model
package: the same folder as a generative run's (export/prefill_decode.py) with the vision tower as graphs of its
own.

  vision_<V>.mindir       a batch's images packed in V patches (windows as rows where the tower has windows) ->
                          their merged tokens, padded to the largest V's count T (one graph per vision bucket V)
  prefill_<L>.mindir      a prompt of L tokens (left-padded) with M-RoPE positions (B, L, 3) and its images'
                          tokens (T, width) -> last logits and the key/value caches
  speech.mindir           a model that hears (a dinov2 recipe with model.native.audio): the clips' log-mels (B, n_mels,
                          T) -> their pooled, projected tokens (B, A, width), which the prefill graphs take after the
                          vision tokens
  decode.mindir           the decoder's step (each token at its index plus its prompt's M-RoPE delta)

The manifest's "generation" section holds the vision buckets, the tower's layout, the image and video processor
settings and the chat's default system turn ("native"); the stored questions are easy-vqa's test images, one,
two at once and none, with the framework's greedy tokens, which `mindvl export verify` generates again. A request
whose images take more patches than the largest vision bucket is refused by name. With `lite2` the same graphs at
batch 1 go to lite2/ for MindSpore Lite 2.0 (export/lite2_folder.py write_native_lite2): the Python device pipeline
generates with them; the C++ runner does not read the family's byte-level BPE tokenizer.
"""
from dataclasses import asdict
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from mindvl.cells import NativePrefillNet, NativeSpeechNet, NativeVisionNet, ViTVisionNet
from mindvl.engine.native_prompts import NativePrompt
from mindvl.engine.package_graphs import (EXTEND_STEPS, SPEECH, WIDE_ROWS, GenerationSpec, prefill_name,
                                         vision_name)
from mindvl.engine.vision_layout import ViTPacking, package_packing
from mindvl.errors import PackageError
from mindvl.export.graphs import GraphSpec, TensorSpec
from mindvl.export.lite2_folder import write_native_lite2
from mindvl.export.prefill_decode import (MAX_NEW_TOKENS, GenerationPackage, cache_specs, decode_graphs,
                                          prefill_buckets, write_generation_package)
from mindvl.preprocess import preprocess_dict

VISION_BUCKETS = (1024, 4096)  # patches: a 448 x 448 image, or four; a 896 x 896 image, or a short video
SAMPLE_QUESTIONS = 3  # easy-vqa test images: one with its question, two at once, a question alone


def native_spec(generator, cache_len: int, max_new_tokens: int, buckets: Sequence[int],
                vision_buckets: Sequence[int]) -> GenerationSpec:
    """The package's GenerationSpec: prefill buckets as a generative run's, the vision buckets checked against the
    tower's layout (multiples of a window row, or of a merged block; a ViT tower's: rows, each image a CLS row and
    its patches, at least a merged block's)."""
    layout, lm = generator.layout, generator.lm
    packing = layout.packing
    vit = isinstance(packing, ViTPacking)
    windowed = not vit and packing.window_rows
    unit = packing.window ** 2 * packing.merge ** 2 if windowed else packing.merge ** 2
    vision_buckets = sorted(set(vision_buckets)) or list(VISION_BUCKETS)
    wrong = [v for v in vision_buckets if v < unit or (v % unit and not vit)]
    if wrong:
        raise PackageError(f"--vision-bucket {wrong[0]}: expected a positive multiple of {unit} patches (the tower's "
                           f"{'window row' if windowed else 'merged block'})")
    native = {"vision_buckets": vision_buckets, **packing.manifest(), "mrope": layout.mrope, "tokens_per_second": generator.tokens_per_second,
              "patches": asdict(generator.patches), "video": asdict(generator.video),
              "default_system": layout.chat.template.default_system,
              **({"speech_shape": list(layout.speech_shape)} if layout.audio_tokens else {})}
    return GenerationSpec(cache_len=cache_len, buckets=prefill_buckets(cache_len, max_new_tokens, buckets),
                          layers=lm.layers, vocab_size=lm.cfg.vocab_size, width=lm.width, kv_width=lm.kv_width,
                          image_tokens=0, audio_tokens=layout.audio_tokens, pad_id=layout.pad_id,
                          stop_ids=sorted(layout.stop_ids),
                          chat_template=layout.chat.template.name, max_new_tokens=max_new_tokens, native=native,
                          extend_steps=EXTEND_STEPS, wide_rows=WIDE_ROWS)


def native_graph_specs(spec: GenerationSpec) -> List[GraphSpec]:
    native = spec.native
    tokens = TensorSpec("vision_tokens", "float32", (spec.vision_capacity, spec.width))
    packing = package_packing(native)
    specs = []
    for size in native["vision_buckets"]:
        inputs = [TensorSpec(*entry) for entry in packing.specs(size, spec.vision_capacity)]
        specs.append(GraphSpec(vision_name(size), f"images packed in {size} patches -> their merged tokens",
                               ViTVisionNet if isinstance(packing, ViTPacking) else NativeVisionNet, inputs, [tokens]))
    speech = []
    if spec.audio_tokens:
        n_mels, frames = native["speech_shape"]
        speech = [TensorSpec("audio_tokens", "float32", (-1, spec.audio_tokens, spec.width))]
        specs.append(GraphSpec(SPEECH, "the clips' log-mels -> their tokens", NativeSpeechNet,
                               [TensorSpec("mel", "float32", (-1, n_mels, frames)),
                                TensorSpec("frame_mask", "float32", (-1, frames))], speech))
    positions = (3,) if native.get("mrope", True) else ()
    for bucket in spec.buckets:
        row = [TensorSpec(name, "int32", (-1, bucket)) for name in ("ids", "valid")]
        specs.append(GraphSpec(prefill_name(bucket), f"a left-padded prompt of {bucket} tokens and its attachments' "
                                                     f"tokens -> its last logits and the caches", NativePrefillNet,
                               [*row, TensorSpec("positions", "int32", (-1, bucket, *positions)),
                                TensorSpec("slot_index", "int32", (-1, bucket)), tokens, *speech],
                               [TensorSpec("logits", "float32", (-1, spec.vocab_size)), *cache_specs(spec)]))
    return specs + decode_graphs(spec)


def sample_prompts(generator, count: int = SAMPLE_QUESTIONS) -> List[NativePrompt]:
    """Real questions to store: easy-vqa's first test image with its question, the next two together, and a
    question alone."""
    import easy_vqa

    questions, _, image_ids = easy_vqa.get_test_questions()
    paths = easy_vqa.get_test_image_paths()
    first, second, third = (paths[i] for i in (image_ids[0], image_ids[0] + 1, image_ids[0] + 2))
    prompts = [generator.prompt(questions[0], images=[first]),
               generator.prompt("what differs between the two shapes?", images=[second, third]),
               generator.prompt("what is a triangle?")]
    return prompts[:count]


def write_native_package(generator, out: Path, cache_len: int = 0, max_new_tokens: int = MAX_NEW_TOKENS,
                         buckets: Sequence[int] = (), vision_buckets: Sequence[int] = (), version: int = 1,
                         force: bool = False, progress: bool = True,
                         source: Optional[Mapping[str, object]] = None, lite2: bool = False,
                         prompts: Sequence[NativePrompt] = (), files: Mapping[str, str] = {}) -> Path:
    """Export a NativeGenerator's model into the package `out`. cache_len 0: the decoder's max_positions, at most
    1024 (the model's cache is rebuilt at it); buckets: the prompt lengths (prefill_buckets'); vision_buckets: the
    packed patches a vision graph takes (default VISION_BUCKETS); lite2: also the graphs for MindSpore Lite 2.0;
    prompts: more questions to store after sample_prompts' (a model that hears: a spoken test question); files:
    text files written beside the graphs (a trained run's config.json, which its evaluation reads)."""
    lm = generator.lm
    if lite2 and isinstance(generator.layout.packing, ViTPacking):
        raise PackageError("--target lite2: a native recipe with a ViT tower (model.native.family dinov2) has no Lite 2.0 "
                           "graphs yet; export it for the framework and the server (without --target lite2)")
    cache_len = int(cache_len or min(lm.cfg.max_positions, 1024))
    spec = native_spec(generator, cache_len, max_new_tokens, buckets, vision_buckets)
    lm.cache_len = cache_len  # a constant of the generation graphs
    generator.model.set_train(False)
    layout = generator.layout.for_graphs(spec.limits, spec.native["vision_buckets"], spec.stop_ids)
    prompts = [p for p in [*sample_prompts(generator), *prompts]
               if layout.vision_size([p]) <= spec.native["vision_buckets"][-1]]
    source = dict(source or generator.source)

    def entry(prompt: NativePrompt) -> dict:
        return {"question": prompt.question, "attachments": [{"kind": kind, "time_step": step}
                                                             for kind, _, _, step in prompt.attachments],
                **({"audio": True} if prompt.audio is not None else {})}

    def arrays(prompt: NativePrompt) -> dict:
        speech = zip(("mel", "frame_mask"), prompt.audio) if prompt.audio is not None else ()
        return {**{f"{k}.{name}": value for k, (_, patches, grid, _) in enumerate(prompt.attachments)
                   for name, value in (("patches", patches), ("grid", grid))}, **dict(speech)}

    package = GenerationPackage(
        generator.name, generator.model, spec, native_graph_specs(spec), layout, prompts, arrays,
        entry, {"architecture": generator.architecture,
                **({"preprocess": preprocess_dict(generator.pre)} if layout.audio_tokens else {})}, dict(files),
        (lambda work, samples: write_native_lite2(work, generator.model, samples)) if lite2 else None)
    return write_generation_package(package, out, source, version, force, progress)
