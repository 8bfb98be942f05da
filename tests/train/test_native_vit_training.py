"""The native-resolution recipe over a converted decoder (vlm-s-native at test size): the real DINOv2 ViT-S/14 reads
each image at its own size through a ViTTower (its patch states 2 x 2 side by side, projected) into the committed
tiny random Gemma 3 (1-D positions) and the real Whisper base hears (its states cached), on the small data set's
typed, spoken and two-image conversations. A checkpoint stores the projectors and the LoRA adapters and names the
frozen folders (the encoder at its path in the tower, where loading the run puts it back), and the run generates
through mindvl.from_pretrained, a batch of prompts (one spoken) as each alone; its package (a vision graph over the
packed rows, a speech graph, 1-D prefill graphs, one decode graph) regenerates the stored questions' tokens (export
verify, a spoken one among them), answers a spoken question over the OpenAI API as the framework does, is evaluated
on the test split's questions with the framework's tokens (`mindvl export evaluate`), and Lite 2.0 graphs for it are
refused by name."""
import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

import mindvl
from conftest import small_overrides
from mindvl.config import load_config


def recipe(root, converted, decoder, out):
    return load_config("vlm-s-native", small_overrides(
        root, f"model.pretrained.vision={converted('dinov2')}", f"model.pretrained.decoder={decoder}",
        f"model.pretrained.audio={converted('whisper-base')}", f"model.pretrained.cache={out}/cache",
        "model.chat_template=plain", "model.decoder.lora_rank=4", "train.init_from=''", f"train.output_dir={out}",
        "train.max_steps=4", "train.checkpoint_every=4", "train.warmup_steps=1", "train.log_every=2",
        "train.lr=5e-3", "data.conversation_kinds=[vqa, spoken, pair]", "data.packing.length=96"))


def test_dinov2_at_its_own_resolution_trains_into_a_decoder_generates_and_exports(small_cfg, small_report, converted,
                                                                                 tiny_llms, tmp_path):
    from mindvl.model_factory import create_model
    from mindvl.train import Trainer, TrainingArguments

    decoder = tiny_llms["gemma3_text"]
    cfg = recipe(small_cfg.data.root, converted, decoder, tmp_path / "run")
    model = create_model(cfg)
    assert type(model.tower).__name__ == "ViTTower" and cfg.model.native.table == 37
    result = Trainer(model, TrainingArguments(cfg, progress=False)).train()
    assert result.final_losses["lm"] < result.first_losses["lm"]
    step = Path(result.checkpoint)
    stored = load_file(str(step / "model.safetensors"))
    assert stored and all(n.startswith(("tower.projector.", "audio_proj.")) or ".lora_" in n for n in stored)
    base = json.loads((step / "train_state.json").read_text())["base"]
    assert {kind: part["path"] for kind, part in base.items()} == {"vision": "tower.vit", "audio": "audio",
                                                                    "decoder": "decoder"}

    import easy_vqa

    generator = mindvl.from_pretrained(result.output_dir, cache_len=128)
    paths = easy_vqa.get_train_image_paths()
    prompts = [generator.prompt("what shape is it?", images=[paths[0]]),
               generator.prompt("are they the same color?", images=[paths[1], paths[2]])]
    assert [tuple(a[2]) for p in prompts for a in p.attachments] == [(1, 8, 8)] * 3  # 64 px read at 112 (min_pixels)
    from mindvl.data.reading.stages import Tables, voices_of

    clip = Tables(Path(cfg.data.root), cfg.preprocess, voices_of("test")).waveform(0)  # a spoken question, float32
    heard = generator.prompt("", images=[paths[3]], audio=clip)
    assert heard.audio[0].shape == (80, 256) and generator.layout.audio_tokens == 32
    prompts.append(heard)
    together = generator.generate(prompts, max_new_tokens=4)
    assert [a.tokens for a in together] == [generator.generate(p, max_new_tokens=4).tokens for p in prompts]

    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.errors import PackageError
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(result.output_dir)
    options = PackageOptions(progress=False, prompt_buckets=(96,), cache_len=160, vision_buckets=(320,))
    checked = package_and_check(cfg, model, record, tmp_path / "pkg", options, log=lambda *_: None)
    assert checked["verify"]["ok"]
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    native = manifest["generation"]["native"]
    assert native["packing"] == "vit" and native["table"] == 37 and native["mrope"] is False
    assert "speech" in manifest["graphs"] and native["speech_shape"] == [80, 256]
    assert [p.get("audio", False) for p in manifest["generation_samples"]["prompts"]].count(True) == 1
    served_spoken_question(tmp_path / "pkg", tmp_path / "servables", generator, cfg.data.root)
    evaluated_like_the_framework(cfg, model, tmp_path / "pkg", manifest)
    with pytest.raises(PackageError, match="--target lite2: a native recipe with a ViT tower"):
        package_and_check(cfg, model, record, tmp_path / "lite", PackageOptions(progress=False, lite2_batch=1),
                          log=lambda *_: None)


def evaluated_like_the_framework(cfg, model, package, manifest):
    """`mindvl export evaluate` of the native package: its graphs answer the test split's first typed and spoken
    questions (the evaluation's own prompts: images cut at their own resolution, the clip heard) with the
    framework's tokens, and its row counts them."""
    from mindvl.deploy.evaluate_package import PackageGenerator, evaluate_package
    from mindvl.eval.generated_answers import GenerativeEvaluator

    packaged = GenerativeEvaluator(cfg, generator=PackageGenerator(package, manifest, sizes=(2,)))
    local = GenerativeEvaluator(cfg, model)
    asked = [[prompt for _, prompt in evaluator.questions("test", 2)] for evaluator in (packaged, local)]
    assert [p.audio is not None for p in asked[0]] == [False, True]
    assert [a.tokens for a in packaged.generator.generate(asked[0], max_new_tokens=4)] == \
        [a.tokens for a in local.generator.generate(asked[1], max_new_tokens=4)]
    row = evaluate_package(package, progress=False, limit=1)
    assert row["questions"] == 2 and 0 <= row["vqa_text"] <= 1 and 0 <= row["vqa_audio"] <= 1


def served_spoken_question(package, servables, generator, root):
    """The package served on 127.0.0.1: the real `openai` client sends an image and a spoken question (a WAV) and
    gets the framework's answer to the same image and clip."""
    import base64
    import io

    import openai
    from PIL import Image

    from mindvl.data.reading.examples import query_examples
    from mindvl.serving.serve_config import ServeConfig
    from mindvl.serving.servable import deploy
    from mindvl.serving.server import BackgroundServer

    example = query_examples(root)[0]
    deploy(package, servables, "vlm")
    with BackgroundServer(ServeConfig(servable_dir=str(servables), port=0, grpc_port=0, poll_s=0)) as server:
        client = openai.OpenAI(base_url=f"{server.rest_url}/v1", api_key="unused", max_retries=0, timeout=120)
        answer = client.chat.completions.create(model="vlm", max_tokens=4, extra_body={"ignore_eos": True}, messages=[
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                           + base64.b64encode(example.image).decode()}},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(example.audio).decode(),
                                                        "format": "wav"}}]}])
    picture = Image.open(io.BytesIO(example.image)).convert("RGB")
    expected = generator.generate(generator.prompt("", images=[picture], audio=example.audio), max_new_tokens=4,
                                  ignore_eos=True)
    assert answer.choices[0].message.content == expected.text and answer.usage.completion_tokens == 4
