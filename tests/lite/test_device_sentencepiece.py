"""The real generative model's path to the device at test size: a generative package whose decoder is a converted
tiny Gemma-layout model with a SentencePiece vocabulary (tiny_gemma_sentencepiece: a GGUF through `convert_gguf`, as
Gemma 3 270M) exported with --target lite2 carries the decoder's tokenizer.model; the C++ runner reads it with
libsentencepiece and tokenises as the framework's tokenizer.json does (Unicode, whitespace runs, turn markers, a
typed special token kept as text), the Python device pipeline reads tokenizer.json with `tokenizers`, and Lite 2.0
and the runner generate the framework's greedy tokens. The export refuses a model file that reads otherwise."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import small_generative_config
from mindvl.errors import PackageError
from mindvl.lite.cpp_runner import run_tokenize
from mindvl.package_reader import read_manifest

# Texts a user's turn may hold: Unicode (accents, CJK, an emoji, a fraction), runs of spaces and tabs, line breaks,
# Gemma's turn markers and image markers typed as text, special tokens of other families, empty-looking ones.
TEXTS = ["What is the shape in the image?", "what colour is it", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 \u00bd",
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
    assert (package / "lite2" / "tokenizer.model").read_bytes() == (tiny_gemma_sentencepiece / "tokenizer.model").read_bytes()
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


@pytest.mark.parametrize("text", TEXTS)
def test_the_runner_tokenizes_as_the_framework(sentencepiece_package, runner, layout, text):
    """--tokenize: the runner's ids of a user's text (libsentencepiece, the text cut where a special token is spelt),
    the chat prompt of that typed question and the ids decoded again, against mindvl.chat on tokenizer.json."""
    from mindvl.engine.prompts import MultimodalPrompt

    got = run_tokenize(sentencepiece_package[1]["package"], text)
    assert got["ids"] == framework_ids(layout.chat, text)
    assert got["text"] == layout.chat.tokenizer.decode(got["ids"], skip_special_tokens=True)
    if text.strip():  # a prompt needs a question
        assert got["prompt"] == layout.render(MultimodalPrompt(text)).ids.tolist()


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
