"""Generation on the device: a generative package exported with --target lite2 generates, greedy, the tokens the
framework generated at export (the stored test questions, typed and spoken, about their image) on the Lite 2.0
runtime through DevicePipeline and through the C++ runner's --generate mode, and DevicePipeline on Lite 2.0
generates what it generates on the package's GraphCell graphs (what the server runs). Skipped with the reason
only where the Lite 2.0 runtime or the runner cannot be prepared here."""
import json
import os
import subprocess

import numpy as np
import pytest

from mindvl.data.reading.examples import query_examples
from mindvl.deploy.verify import stored_prompts
from mindvl.errors import InputError
from mindvl.lite.device import DevicePipeline
from mindvl.lite.lite_model import Context, GenerationGraphs, LiteError
from mindvl.package_reader import read_manifest

# Measured on this package: each token's log-probability on Lite 2.0 (Python and C++ alike) is within 2e-6 of
# GraphCell's; the runner's equal the bridge's to float32 printing.
LOGPROB_ATOL = 1e-4
TOKENS = 12  # fixed-length answers (ignore_eos): this small model says its answer in 1-2 tokens


@pytest.fixture(scope="module")
def lite2_package(generative_package):
    """The session's generative package: two prompt buckets, a 112-token cache, lite2/ at batch 1, verified (when the
    runtime is here, `verify_package` has already generated the stored questions on Lite 2.0)."""
    return generative_package[1]


@pytest.fixture(scope="module")
def examples(generative_package):
    return query_examples(generative_package[0].data.root, 2)


def run_generate(runner, package, *arguments) -> subprocess.CompletedProcess:
    return subprocess.run([str(runner), str(package), "--generate", *map(str, arguments)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "GLOG_v": "3"})


def generated(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_lite2_generates_the_stored_questions_with_the_frameworks_tokens(lite2_package, lite2_ready):
    from mindvl.engine.decode_loop import generate
    from mindvl.engine.package_graphs import PackageGraphs, package_layout
    from mindvl.engine.sampling import sampling_config

    manifest = read_manifest(lite2_package)
    samples = manifest["generation_samples"]
    with GenerationGraphs(lite2_package, "lite2", Context(2)) as runner:
        graphs = PackageGraphs(runner.spec, runner)
        layout = package_layout(lite2_package, manifest)
        settings = sampling_config(max_new_tokens=samples["max_new_tokens"])
        for stored, prompt in zip(samples["prompts"], stored_prompts(lite2_package, manifest)):
            (answer,) = generate(layout, graphs, [prompt], settings)
            assert answer.tokens == stored["tokens"] and answer.text == stored["text"]
        assert set(runner.models) <= {"attachments", "prefill_32", "prefill_48", "decode"}
        with pytest.raises(LiteError, match="prefill_48: 2 prompts for a graph of batch 1.*one prompt at a time"):
            generate(layout, graphs, stored_prompts(lite2_package, manifest)[:2], settings)


@pytest.mark.parametrize("mode", ["typed", "spoken", "both"])
def test_device_pipeline_on_lite2_generates_what_graphcell_generates(lite2_package, lite2_ready, examples, mode):
    example = examples[0]
    request = {"image": example.image, "question": "" if mode == "spoken" else example.question,
               "audio": b"" if mode == "typed" else example.audio}
    with DevicePipeline(lite2_package, backend="lite2") as device, \
            DevicePipeline(lite2_package, backend="graphcell") as cell:
        assert device.backend == "lite2" and cell.backend == "graphcell"
        ours = device.generate(**request, max_new_tokens=TOKENS, ignore_eos=True)
        theirs = cell.generate(**request, max_new_tokens=TOKENS, ignore_eos=True)
        assert ours.tokens == theirs.tokens and ours.text == theirs.text and len(ours.tokens) == TOKENS
        assert ours.finish == "length" and ours.prompt_tokens == theirs.prompt_tokens
        np.testing.assert_allclose(ours.logprobs, theirs.logprobs, atol=LOGPROB_ATOL, rtol=0)
        assert ours.mean_logprob == pytest.approx(float(np.mean(ours.logprobs)))
        assert {"preprocess", "first_token", "decode", "total"} <= set(ours.timings)
        streamed = list(device.stream(**request, max_new_tokens=TOKENS, ignore_eos=True))
        assert [d.token for d in streamed] == ours.tokens and "".join(d.text for d in streamed) == ours.text
        assert streamed[-1].finish == "length" and all(d.finish is None for d in streamed[:-1])


def test_the_runner_generates_the_stored_questions_with_the_frameworks_tokens(runner, lite2_package, tmp_path):
    manifest = read_manifest(lite2_package)
    samples = manifest["generation_samples"]
    for index, (stored, prompt) in enumerate(zip(samples["prompts"], stored_prompts(lite2_package, manifest))):
        arguments = ["--question", prompt.question, "--max-new-tokens", samples["max_new_tokens"]]
        for flag, value in (("--image-f32", prompt.image), ("--mel", prompt.mel), ("--frame-mask", prompt.frame_mask)):
            if value is not None:
                value.astype(np.float32).tofile(tmp_path / f"{index}{flag}")
                arguments += [flag, tmp_path / f"{index}{flag}"]
        answer = generated(run_generate(runner, lite2_package, *arguments))
        assert answer["tokens"] == stored["tokens"] and answer["text"] == stored["text"]
        assert answer["finish"] in ("stop", "length") and answer["bucket"] in (32, 48)
        assert answer["build_ms"] > 0 and answer["first_token_ms"] > 0


def test_the_runner_generates_what_the_device_pipeline_generates(runner, lite2_package, examples, tmp_path):
    """The same PNG and typed question: the runner's own image decoding, chat prompt and decode loop against
    DevicePipeline's on Lite 2.0, token for token, and on 2 threads too."""
    from mindvl.engine.package_graphs import package_layout
    from mindvl.engine.prompts import MultimodalPrompt

    image = tmp_path / "question.png"
    image.write_bytes(examples[1].image)
    with DevicePipeline(lite2_package, backend="lite2") as device:
        expected = device.generate(image=examples[1].image, question=examples[1].question, max_new_tokens=TOKENS,
                                   ignore_eos=True)
    for threads in (1, 2):
        answer = generated(run_generate(runner, lite2_package, "--image", image, "--question", examples[1].question,
                                        "--max-new-tokens", TOKENS, "--ignore-eos", "--threads", threads))
        assert answer["tokens"] == expected.tokens and answer["text"] == expected.text
        np.testing.assert_allclose(answer["logprobs"], expected.logprobs, atol=LOGPROB_ATOL, rtol=0)
        assert answer["finish"] == "length" and answer["decode_tokens_per_s"] > 0
    manifest = read_manifest(lite2_package)
    layout = package_layout(lite2_package, manifest)
    pixels = np.zeros((3, 1, 1), np.float32)  # only its presence shapes the prompt
    bucket, rendered = layout.admit([MultimodalPrompt(examples[1].question, pixels)], TOKENS)
    assert answer["prompt_tokens"] == expected.prompt_tokens == len(rendered[0]) and answer["bucket"] == bucket


def test_the_runner_takes_a_control_token_in_the_question_as_text(runner, lite2_package):
    """A typed "[EOS]" (the template's turn end) is the characters, never the control token, as in mindvl.chat."""
    plain = generated(run_generate(runner, lite2_package, "--question", "what is eos ?", "--max-new-tokens", 4))
    spelt = generated(run_generate(runner, lite2_package, "--question", "what is [EOS] ?", "--max-new-tokens", 4))
    with DevicePipeline(lite2_package, backend="lite2") as device:
        expected = device.generate(question="what is [EOS] ?", max_new_tokens=4)
    assert spelt["prompt_tokens"] == plain["prompt_tokens"] + 2  # "[" and "]" around "eos"
    assert spelt["tokens"] == expected.tokens and spelt["prompt_tokens"] == expected.prompt_tokens


@pytest.mark.parametrize("arguments, message", [
    ((), "--generate needs PKG and --question, --mel or both"),
    (("--question", "   ", "--max-new-tokens", 4), "question: give the question as text"),
    (("--question", "what?", "--max-new-tokens", 65), "--max-new-tokens 65: this package generates 1 to 64"),
    (("--question", " ".join(["shape"] * 60)), "longer than the largest bucket (48)"),
    (("--question", "what?", "--mel", "m.f32"), "--mel and --frame-mask go together"),
    (("--question", "what?", "--image-f32", "short.f32"), "short.f32: 8 bytes, but a (3, S, S) image is"),
])
def test_the_runner_refuses_an_unusable_request_naming_it(runner, lite2_package, tmp_path, monkeypatch, arguments,
                                                          message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "short.f32").write_bytes(bytes(8))
    result = run_generate(runner, lite2_package, *arguments)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_vqa_and_generative_packages_refuse_each_others_modes(runner, lite2_package, package):
    result = run_generate(runner, package, "--question", "what shape is it?")
    assert result.returncode == 2 and "lite2/generation.txt: missing" in result.stderr
    vqa_mode = subprocess.run([str(runner), str(lite2_package), "--image", "x.png", "--question", "what?"],
                              capture_output=True, text=True, timeout=60)
    assert vqa_mode.returncode == 2 and "a generative package answers in words; run it with --generate" in \
        vqa_mode.stderr
    with DevicePipeline(lite2_package, backend="graphcell") as generative:
        with pytest.raises(LiteError, match="generative package answers in words: use generate"):
            generative.answer(b"png", "what?")
    with DevicePipeline(package, backend="graphcell") as vqa:
        with pytest.raises(LiteError, match="generate\\(\\) needs a generative package"):
            vqa.generate(question="what?")


def test_a_bad_generation_input_is_named(lite2_package):
    with DevicePipeline(lite2_package, backend="graphcell") as device:
        with pytest.raises(InputError, match="question and audio are both empty"):
            device.generate(image=b"", question=" ")
        with pytest.raises(InputError, match="image"):
            device.generate(image=b"not an image", question="what?")
        from mindvl.errors import ConfigError

        with pytest.raises(ConfigError, match="max_new_tokens: 65 asked, this model generates at most 64"):
            device.generate(question="what?", max_new_tokens=65)
