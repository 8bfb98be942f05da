"""A converted native-resolution VLM (the tiny Qwen2.5-VL) exported as a package: vision graphs per patch bucket,
prefill per prompt bucket and one decode graph, verified on their samples and on the stored easy-vqa questions
(one image, two at once, text), generating through the package's graphs exactly what the framework generates, on
MindSpore Lite 2.0 too (lite2/, the Python device pipeline); the options a VLM's package does not take refused by
name."""
import json

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.deploy.verify import stored_prompts, verify_package
from mindvl.engine.decode_loop import generate
from mindvl.engine.package_graphs import GenerationSpec, PackageGraphs, package_layout
from mindvl.engine.sampling import sampling_config
from mindvl.generation.native_generator import NativeGenerator
from mindvl.package_reader import graph_caller, load_graph


@pytest.fixture(scope="module")
def package(native_package):
    return native_package


def test_the_graphs_and_the_stored_questions_reproduce_the_framework(package):
    folder, path = package
    manifest = json.loads((path / "manifest.json").read_text())
    assert list(manifest["graphs"]) == ["vision_256", "vision_512", "prefill_64", "prefill_128", "decode",
                                        "decode_wide", "extend_8"]
    native = manifest["generation"]["native"]
    assert native["vision_buckets"] == [256, 512] and native["window_rows"] and native["window"] == 4
    samples = manifest["generation_samples"]["prompts"]
    assert [len(p["attachments"]) for p in samples] == [1, 2, 0]
    report = verify_package(path)
    assert report.ok and any(c.graph == "generate" for c in report.checks)
    # Lite 2.0: each graph at batch 1 on its samples, and the stored questions generated one at a time
    device = [name for name in manifest["graphs"] if name not in ("decode_wide", "extend_8")]  # a token, a row
    assert list(manifest["lite2"]["graphs"]) == device and not manifest["lite2"]["device"]
    checked = {c.graph for c in report.checks}
    assert {f"lite2/{name}" for name in device} | {"lite2/generate", "decode_wide", "extend_8"} <= checked, checked
    # the framework (a NativeGenerator, mindvl's fused decoder kernels) generates the stored tokens too
    generator = NativeGenerator.from_folder(folder, 256)
    prompts = stored_prompts(path, manifest)
    framework = generator.generate(prompts, max_new_tokens=manifest["generation_samples"]["max_new_tokens"])
    assert [g.tokens for g in framework] == [p["tokens"] for p in samples]


def test_images_past_the_largest_vision_graph_are_refused_by_name(package):
    folder, path = package
    manifest = json.loads((path / "manifest.json").read_text())
    layout = package_layout(path, manifest)
    generator = NativeGenerator.from_folder(folder, 256)
    many = generator.prompt("q", images=[np.full((196, 196, 3), 80, np.uint8)] * 3)  # 4 windows of 64 each
    with pytest.raises(Exception, match="768 patches laid out, more than the 512 this model's vision graphs hold"):
        layout.render(many)
    graphs = PackageGraphs(GenerationSpec.from_manifest(manifest), graph_caller(
        {name: load_graph(path, manifest, name) for name in GenerationSpec.from_manifest(manifest).graph_names()}))
    two = generator.prompt("q", images=[np.full((196, 196, 3), 80, np.uint8)] * 2)
    alone = generate(layout, graphs, [two], sampling_config(max_new_tokens=4))[0]
    assert alone.tokens == generator.generate(two, max_new_tokens=4).tokens


def test_a_native_prompt_reuses_its_images_rows_at_their_m_rope_positions(package):
    """Two images asked about twice (their M-RoPE positions and the delta after them in the cached rows) and
    speculation: the plain loop's tokens."""
    from mindvl.engine.decode_loop import DecodeBatch
    from mindvl.engine.prefix_cache import PrefixCache

    folder, path = package
    manifest = json.loads((path / "manifest.json").read_text())
    spec = GenerationSpec.from_manifest(manifest)
    layout = package_layout(path, manifest)
    graphs = PackageGraphs(spec, graph_caller({name: load_graph(path, manifest, name) for name in spec.graph_names()}))
    generator = NativeGenerator.from_folder(folder, 256)
    images = [np.full((196, 196, 3), 80, np.uint8), np.full((112, 140, 3), 200, np.uint8)]
    asked = [generator.prompt(q, images=images) for q in ("what is here?", "what is here? and the colours?")]
    greedy = sampling_config(max_new_tokens=12, ignore_eos=True)
    plain = [generate(layout, graphs, [p], greedy)[0].tokens for p in asked]
    cache = PrefixCache(32 << 20)
    batch = DecodeBatch(layout, graphs, prefixes=cache, speculative_tokens=4)
    assert [batch.generate([p], greedy)[0].tokens for p in asked] == plain
    assert cache.hits == 1 and cache.reused_tokens > spec.vision_capacity // 4


def test_options_a_vlm_package_does_not_take_are_refused(package, tmp_path, capsys):
    folder, _ = package
    out = str(tmp_path / "p")
    assert main(["export", "--checkpoint", str(folder), "--out", out, "--target", "lite2", "--lite2-batch", "2"]) == 2
    assert "--lite2-batch 2: a VLM package's lite2 graphs have batch 1" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(folder), "--out", out, "--vision-bucket", "100"]) == 2
    assert "--vision-bucket 100: expected a positive multiple of 64 patches" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(folder), "--out", out, "--config", "tiny"]) == 2
    assert main(["export", "--checkpoint", str(folder), "--out", out, "--evaluate"]) == 2
    assert "--evaluate: a converted VLM folder names no data set to answer" in capsys.readouterr().err
    assert main(["export", "evaluate", str(package[1])]) == 2
    assert "no config.json, so no data set to evaluate on" in capsys.readouterr().err


def test_the_device_pipeline_generates_the_stored_questions_on_lite2(package):
    """mindvl.lite.DevicePipeline over the package's lite2/ graphs, each stored question sent as a device app sends
    it (the images' files, the question): the framework's tokens; audio refused by name."""
    import easy_vqa

    from mindvl.errors import InputError
    from mindvl.lite import DevicePipeline

    _, path = package
    manifest = json.loads((path / "manifest.json").read_text())
    questions, _, image_ids = easy_vqa.get_test_questions()
    paths = easy_vqa.get_test_image_paths()
    files = [[paths[image_ids[0]]], [paths[image_ids[0] + 1], paths[image_ids[0] + 2]], []]  # sample_prompts' images
    with DevicePipeline(path, backend="lite2") as device:
        assert device.backend == "lite2"
        for stored, images in zip(manifest["generation_samples"]["prompts"], files):
            sent = [open(file, "rb").read() for file in images]
            got = device.generate(question=stored["question"], images=sent,
                                  max_new_tokens=manifest["generation_samples"]["max_new_tokens"])
            assert got.tokens == stored["tokens"], stored["question"]
        with pytest.raises(InputError, match="audio: this model reads images and video"):
            device.generate(question="what is it?", audio=b"RIFF")
