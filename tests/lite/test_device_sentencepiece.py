"""The real generative model's path to the device at test size: a generative package whose decoder is a converted
tiny Gemma-layout model with a SentencePiece vocabulary (tiny_gemma_sentencepiece: a GGUF through `convert_gguf`, as
Gemma 3 270M) exported with --target lite2 carries the decoder's tokenizer.model; the C++ runner reads it with
libsentencepiece and tokenises as the framework's tokenizer.json does (Unicode, whitespace runs, turn markers, a
typed special token kept as text), the Python device pipeline reads tokenizer.json with `tokenizers`, and Lite 2.0
and the runner generate the framework's greedy tokens. The export refuses a model file that reads otherwise. Slow:
vlm-s (Gemma 3 270M's own vocabulary) exported the same way, verified on Lite 2.0 and in the runner."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import small_generative_config, small_overrides
from mindvl.errors import PackageError
from mindvl.lite.cpp_runner import run_tokenize
from mindvl.package_reader import read_manifest

# Texts a user's turn may hold: Unicode (accents, CJK, an emoji, a fraction), runs of spaces and tabs, line breaks,
# Gemma's turn markers and image markers typed as text, special tokens of other families, empty-looking ones.
TEXTS = ["What is the shape in the image?", "what colour is it",
         "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 \u00bd",
         "two  spaces,   three,\ttab\tand\nlines\n\ndone", "<start_of_turn>user\ntyped a turn<end_of_turn>\n",
         "<start_of_image><end_of_image> <bos><eos><pad>", "[multimodal] and <b>bold</b>", "  leading and trailing  ",
         "<<start_of_turn>>", "\u200b\r\n", " ", "2026-12-07: 3.14!"]


@pytest.fixture(scope="module")
def sentencepiece_package(small_cfg, small_report, tiny_gemma_sentencepiece, tmp_path_factory):
    """(config, package) of an untrained generative model over the tiny Gemma-layout decoder (the tiny recipe's
    encoders, Gemma's chat template), lite2/ at batch 1, verified on Lite 2.0 and in the runner where they are here.
    Untrained is enough: every path must give the framework's tokens, whatever they are."""
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.model_factory import create_model

    out = tmp_path_factory.mktemp("sentencepiece_pkg")
    cfg = small_generative_config(small_cfg.data.root, f"model.pretrained.decoder={tiny_gemma_sentencepiece}",
                                  "model.chat_template=auto", f"train.output_dir={out / 'run'}")
    model = create_model(cfg)
    model.set_train(False)
    options = PackageOptions(progress=False, lite2_batch=1, prompt_buckets=(48, 64), cache_len=128)
    record = {"checkpoint": "", "sha256": "", "step": 0}
    return cfg, package_and_check(cfg, model, record, out / "vlm", options, log=lambda *_: None)


def test_the_package_carries_the_decoders_sentencepiece_model(sentencepiece_package, tiny_gemma_sentencepiece):
    _, report = sentencepiece_package
    package = Path(report["package"])
    lite2 = read_manifest(package)["lite2"]
    assert lite2["device"] == {"tokenizer_model": "lite2/tokenizer.model", "preprocess": "lite2/preprocess.txt",
                               "generation": "lite2/generation.txt"}
    model = (tiny_gemma_sentencepiece / "tokenizer.model").read_bytes()
    assert (package / "lite2" / "tokenizer.model").read_bytes() == model
    assert not (package / "lite2" / "vocab.txt").exists()
    lines = dict(line.split(" ", 1) for line in (package / "lite2" / "preprocess.txt").read_text().splitlines())
    assert lines["tokenizer"] == "sentencepiece" and lines["tokenizer_model"] == "tokenizer.model"


def test_verify_generated_the_stored_questions_on_lite2_and_in_the_runner(sentencepiece_package, runner):
    """package_and_check verified the package: Lite 2.0 (Python) and the C++ runner generated each stored question,
    typed and spoken, about its image, with the framework's greedy tokens."""
    _, report = sentencepiece_package
    checks = report["verify"]["checks"]
    prompts = read_manifest(report["package"])["generation_samples"]["prompts"]
    assert any(p["audio"] for p in prompts) and any(p["question"] for p in prompts)
    for graph in ("lite2/generate", "runner/generate"):
        mine = [c for c in checks if c["graph"] == graph]
        assert len(mine) == len(prompts) and all(c["ok"] and c["mismatched"] == 0 for c in mine), graph


def framework_ids(chat, text: str) -> list:
    """mindvl.chat's ids of a user's text (ChatEncoder's literal pieces through tokenizer.json)."""
    return [i for e in chat.tokenizer.encode_batch(chat.literal_pieces(text), add_special_tokens=False) for i in e.ids]


@pytest.fixture(scope="module")
def layout(sentencepiece_package):
    from mindvl.engine.package_graphs import package_layout

    package = sentencepiece_package[1]["package"]
    return package_layout(package, read_manifest(package))


def assert_tokenized_as_the_framework(package, layout, text: str) -> None:
    """--tokenize: the runner's ids of a user's text (libsentencepiece, the text cut where a special token is spelt),
    the ids decoded again and the chat prompts of that question with and without an image and a clip, against
    mindvl.chat on tokenizer.json."""
    from mindvl.engine.prompts import MultimodalPrompt

    got = run_tokenize(package, text)
    assert got["ids"] == framework_ids(layout.chat, text), text
    assert got["text"] == layout.chat.tokenizer.decode(got["ids"], skip_special_tokens=True), text
    pixels, mel = np.zeros((3, 1, 1), np.float32), np.zeros((1, 1), np.float32)  # only their presence counts
    for key, image, audio in (("prompt", None, None), ("prompt_image", pixels, None), ("prompt_audio", None, mel),
                              ("prompt_image_audio", pixels, mel)):
        if text.strip() or audio is not None:  # a prompt needs a typed or a spoken question
            want = layout.render(MultimodalPrompt(text, image, audio, None if audio is None else mel[0])).ids
            assert got[key] == want.tolist(), (key, text)


@pytest.mark.parametrize("text", TEXTS + [""])
def test_the_runner_tokenizes_as_the_framework(sentencepiece_package, runner, layout, text):
    assert_tokenized_as_the_framework(sentencepiece_package[1]["package"], layout, text)


def test_a_typed_special_token_stays_text(sentencepiece_package, runner, layout):
    """"<start_of_turn>" typed by a user is characters on the device too: never the control token, and it reads back."""
    got = run_tokenize(sentencepiece_package[1]["package"], "<start_of_turn>model\n")
    assert layout.chat.tokenizer.token_to_id("<start_of_turn>") not in got["ids"]
    assert got["text"] == "<start_of_turn>model\n"


def test_the_runner_and_the_python_device_pipeline_answer_as_graphcell(sentencepiece_package, runner, lite2_ready,
                                                                     tmp_path):
    """A test image (PNG) and its typed question, 12 tokens whatever they are: DevicePipeline on Lite 2.0 (tokenizers)
    and the runner (its own PNG decoding, libsentencepiece) against DevicePipeline on the package's GraphCell graphs,
    token for token."""
    from mindvl.data.reading.examples import query_examples
    from mindvl.lite.device import DevicePipeline

    cfg, report = sentencepiece_package
    package = report["package"]
    example = query_examples(cfg.data.root, 1)[0]
    with DevicePipeline(package, backend="graphcell") as cell, DevicePipeline(package, backend="lite2") as device:
        theirs = cell.generate(image=example.image, question=example.question, max_new_tokens=12, ignore_eos=True)
        ours = device.generate(image=example.image, question=example.question, max_new_tokens=12, ignore_eos=True)
    assert ours.tokens == theirs.tokens and ours.text == theirs.text and len(theirs.tokens) == 12
    image = tmp_path / "question.png"
    image.write_bytes(example.image)
    answer = runner_json(runner, package, "--generate", "--image", image, "--question", example.question,
                         "--max-new-tokens", 12, "--ignore-eos")
    assert answer["tokens"] == theirs.tokens and answer["text"] == theirs.text
    assert answer["prompt_tokens"] == theirs.prompt_tokens


def runner_json(runner, package, *arguments) -> dict:
    result = subprocess.run([str(runner), str(package), *map(str, arguments)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "GLOG_v": "3"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])



def test_a_missing_or_damaged_model_file_exits_2_naming_it(sentencepiece_package, runner, writable_copy, tmp_path):
    package = writable_copy(Path(sentencepiece_package[1]["package"]), tmp_path)
    model = package / "lite2" / "tokenizer.model"
    model.write_bytes(b"not a model")
    for arguments in (["--tokenize", "--question", "hi"], ["--generate", "--question", "hi"]):
        result = subprocess.run([str(runner), str(package), *arguments], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and f"{model}: not a readable SentencePiece model" in result.stderr
    model.unlink()
    result = subprocess.run([str(runner), str(package), "--tokenize", "--question", "hi"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "tokenizer.model" in result.stderr

def test_a_model_file_that_reads_otherwise_is_refused_by_name(sentencepiece_package, layout, tmp_path):
    """The export's check: another vocabulary's model (the Gemma layout at another size: the same specials, other
    pieces) reads the stored questions differently, and the package is not written with it."""
    from conftest import gemma_layout_vocabulary
    from mindvl.export.lite2_folder import sentencepiece_assets
    from mindvl.preprocess.sentencepiece_vocab import sentencepiece_model

    cfg, report = sentencepiece_package
    tokens, scores, types = gemma_layout_vocabulary(320)
    other = tmp_path / "tokenizer.model"
    other.write_bytes(sentencepiece_model(tokens, scores, types, unk_id=3)[0])
    with pytest.raises(PackageError, match=r"tokenizer.model: reads .* tokenizer.json as .*convert the decoder again"):
        sentencepiece_assets(tmp_path, other, layout.chat, ["What is the shape in the image?"], cfg.preprocess, {})
    assert not (tmp_path / "preprocess.txt").exists()



def test_the_cascade_with_a_gemma_layout_edge_calibrates_on_its_answers_and_streams_the_cloud(
        sentencepiece_package, lite2_ready, tmp_path):
    """The edge-cloud cascade with the Gemma-layout package at the edge on Lite 2.0 and a live `mindvl serve` of it
    as the cloud: `calibrate` fits the threshold on the edge's generated answers (confidence exp(mean token
    log-probability)) with the cloud measured on the same questions; below the threshold the cloud's tokens stream
    back (the same graphs, greedy: the edge's tokens)."""
    from conftest import _background_server
    from mindvl.deploy.calibrate import calibrate
    from mindvl.data.reading.examples import query_examples
    from mindvl.lite.cascade import Cascade
    from mindvl.lite.device import DevicePipeline
    from mindvl.serving.servable import deploy

    cfg, report = sentencepiece_package
    package = Path(report["package"])
    deploy(package, tmp_path / "servables", "gemma")
    example = query_examples(cfg.data.root, 1)[0]
    settings = {"max_new_tokens": 6, "ignore_eos": True}
    with _background_server(tmp_path / "servables") as cloud, DevicePipeline(package, backend="lite2") as edge:
        calibration = calibrate(package, cfg.data.root, split="test", limit=4, target_cloud_rate=0.5, pipeline=edge,
                                cloud=cloud.rest_url, servable="gemma")
        assert calibration.examples == 4 and calibration.cloud["measured"] and calibration.cloud["failed"] == 0
        expected = edge.generate(image=example.image, question=example.question, **settings)
        path = calibration.save(tmp_path / "calibration.json")
        with Cascade.from_calibration(path, edge, cloud.rest_url, servable="gemma") as cascade:
            assert cascade.threshold == calibration.threshold
        with Cascade(edge, cloud.rest_url, threshold=2.0, servable="gemma") as cascade:
            deltas = list(cascade.stream(image=example.image, question=example.question, **settings))
        assert [d.source for d in deltas] == ["cloud"] * 6 and [d.token for d in deltas] == expected.tokens
        assert "".join(d.text for d in deltas) == expected.text

# ----------------------------------------------------------------------------- vlm-s: the real model on the device

# The runner's peak RSS for vlm-s in float32, measured 5.2-5.7 GiB (2026-12-07): Lite 2.0 holds ~6 copies of a weight
# while it builds a graph (a single MatMul's 256 MiB weight: +1.5 GiB), so one graph at a time still peaks at ~5x the
# decoder's 1.07 GB. Issue 52's goal is 2 GB; this bound keeps what holds today from growing.
RUNNER_PEAK_RSS_LIMIT_GB = 6.5
_PEAK_OF_CHILD = ("import resource, subprocess, sys; "
                  "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
                  "sys.stdout.write(done.stdout); sys.stderr.write(done.stderr); "
                  "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")


@pytest.fixture(scope="module")
def vlm_s_package(small_cfg, small_report, converted, gemma3_folder, tmp_path_factory):
    """(config, package_and_check's report) of vlm-s (DINOv2 ViT-S/14, Whisper base, Gemma 3 270M with LoRA r8;
    projectors untrained) exported with --target lite2: one prompt bucket of 96 and a 192-token cache."""
    from mindvl.config import load_config
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.model_factory import create_model

    out = tmp_path_factory.mktemp("vlm_s_pkg")
    cfg = load_config("vlm-s", small_overrides(
        small_cfg.data.root, f"model.pretrained.vision={converted('dinov2')}",
        f"model.pretrained.audio={converted('whisper-base')}", f"model.pretrained.decoder={gemma3_folder}",
        f"model.pretrained.cache={out / 'cache'}", "train.init_from=''", f"train.output_dir={out / 'run'}"))
    model = create_model(cfg)
    model.set_train(False)
    options = PackageOptions(progress=False, lite2_batch=1, prompt_buckets=(96,), cache_len=192)
    return cfg, package_and_check(cfg, model, {"checkpoint": "", "sha256": "", "step": 0}, out / "vlm-s", options,
                                  log=lambda *_: None)


@pytest.mark.slow
def test_vlm_s_generates_the_frameworks_tokens_on_lite2_and_in_the_runner(vlm_s_package, runner):
    """`export verify` (package_and_check) generated the stored questions, typed and spoken, on Lite 2.0 and in the
    C++ runner with the framework's tokens; the runner answers a spoken question about an image (attachments,
    prefill, decode: one graph in memory at a time) within RUNNER_PEAK_RSS_LIMIT_GB of RSS in float32."""
    import sys

    from mindvl.deploy.verify import stored_prompts

    _, report = vlm_s_package
    package = Path(report["package"])
    checks = report["verify"]["checks"]
    manifest = read_manifest(package)
    prompts = manifest["generation_samples"]["prompts"]
    assert any(p["audio"] for p in prompts) and any(p["question"] for p in prompts)
    for graph in ("lite2/generate", "runner/generate"):
        mine = [c for c in checks if c["graph"] == graph]
        assert len(mine) == len(prompts) and all(c["ok"] for c in mine), graph
    assert (package / "lite2" / "tokenizer.model").is_file() and manifest["lite2"]["device"]["tokenizer_model"]
    prompt = next(p for p in stored_prompts(package, manifest) if p.mel is not None and p.image is not None)
    folder = package.parent / "spoken"
    folder.mkdir()
    arguments = [str(runner), str(package), "--generate", "--question", prompt.question, "--max-new-tokens", "8"]
    for flag, value in (("--image-f32", prompt.image), ("--mel", prompt.mel), ("--frame-mask", prompt.frame_mask)):
        value.astype(np.float32).tofile(folder / flag.strip("-"))
        arguments += [flag, str(folder / flag.strip("-"))]
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_CHILD, *arguments], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "GLOG_v": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    peak_gb = int(done.stdout.split("PEAK_KB")[-1]) / 2 ** 20
    assert peak_gb <= RUNNER_PEAK_RSS_LIMIT_GB, f"the runner's peak RSS {peak_gb:.2f} GiB"
    answer = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert len(answer["tokens"]) >= 1 and answer["decode_ms"] >= 0


@pytest.mark.slow
def test_vlm_s_tokenizes_on_the_runner_as_the_framework(vlm_s_package, runner):
    """Gemma 3's own vocabulary (262,144 tokens, its space runs and turn markers): the runner's ids of every text
    against mindvl.chat on the package's tokenizer.json."""
    from mindvl.engine.package_graphs import package_layout

    package = vlm_s_package[1]["package"]
    layout = package_layout(package, read_manifest(package))
    for text in TEXTS + ["", " " * 31 + "x", "\t\t\n\n\n  indented"]:
        assert_tokenized_as_the_framework(package, layout, text)
