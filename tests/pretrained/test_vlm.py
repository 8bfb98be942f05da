"""`mindvl convert vlm`: the tiny Qwen2-VL and Qwen2.5-VL checkpoints (tests/references/ref_qwen2_vl.py) converted
from either key layout, opened by `mindvl.from_pretrained` and asked about the stored photos and video as a user
would (files, frames): transformers' 32 greedy tokens; the checkpoint's chat template checked and followed."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file, save_file

import mindvl
from mindvl.cli import main
from mindvl.errors import ConfigError, ConversionError
from mindvl.generation.native_generator import NativeGenerator
from mindvl.loading import VLM, describe
from mindvl.pretrained.vlm import convert_vlm

REFERENCES = Path(__file__).parents[1] / "references"
STORED = np.load(REFERENCES / "qwen2_vl.npz")
QUIET = {"log": lambda line: None}

# the published Qwen2-VL chat template's format (ChatML, a default system turn, each image or video between
# vision tokens), written here for the tests
TEMPLATE = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
            "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
            "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
            "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
            "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
            "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% endif %}")


def checkpoint_copy(family: str, folder: Path, **files) -> Path:
    """The tiny checkpoint copied into `folder`, with `files` (name -> JSON-able) added."""
    shutil.copytree(REFERENCES / f"tiny_{family}", folder)
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    return folder


@pytest.fixture(scope="module")
def generators(tmp_path_factory):
    """Each family converted and opened through the one door; the frames' pixel bounds are the image
    processor's, as the reference patchified its video."""
    out = {}
    for family in ("qwen2_5_vl", "qwen2_vl"):
        root = tmp_path_factory.mktemp(family)
        source = checkpoint_copy(family, root / "hf", **{
            "video_preprocessor_config.json": {"min_pixels": 3136, "max_pixels": 47040, "fps": 2.0}})
        folder = convert_vlm(source, root / "converted", **QUIET)
        out[family] = mindvl.from_pretrained(folder, cache_len=256)
    return out


def photo(index: int, folder: Path) -> str:
    path = folder / f"photo_{index}.png"
    Image.fromarray(STORED[f"photo_{index}"]).save(path)
    return str(path)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl"])
def test_the_converted_model_answers_photos_files_and_frames_as_transformers(generators, family, tmp_path):
    generator = generators[family]
    assert isinstance(generator, NativeGenerator) and generator.source["checkpoint"] and describe(generator.source["checkpoint"]).kind == VLM
    question = "what is in it?"
    prompts = {"one_image": generator.prompt(question, images=photo(0, tmp_path)),
               "two_images": generator.prompt(question, images=[STORED["photo_2"], photo(1, tmp_path)]),
               "video": generator.prompt(question, video=list(STORED["video_frames"])),  # taken 0.5 s apart
               "text": generator.prompt(question)}
    for case, prompt in prompts.items():
        assert generator.layout.encode(prompt).tolist() == STORED[f"{family}_ids_{case}"].tolist(), case
    answers = generator.generate(list(prompts.values()), max_new_tokens=32, ignore_eos=True)
    for case, answer in zip(prompts, answers):
        assert answer.tokens == STORED[f"{family}_greedy_{case}"].tolist(), case


def test_both_key_layouts_convert_to_the_same_folder(tmp_path):
    source = checkpoint_copy("qwen2_5_vl", tmp_path / "new_layout")
    tensors = load_file(str(source / "model.safetensors"))
    moved = {name.replace("visual.", "model.visual.", 1) if name.startswith("visual.") else
             name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name: value
             for name, value in tensors.items()}
    assert any(k.startswith("model.language_model.layers.") for k in moved)
    save_file(moved, str(source / "model.safetensors"))
    old = load_file(str(convert_vlm(REFERENCES / "tiny_qwen2_5_vl", tmp_path / "a", **QUIET) / "model.safetensors"))
    new = load_file(str(convert_vlm(source, tmp_path / "b", **QUIET) / "model.safetensors"))
    assert old.keys() == new.keys() and all(np.array_equal(old[k], new[k]) for k in old)
    assert {k.split(".")[0] for k in old} == {"tower", "decoder"}


def test_the_checkpoints_chat_template_is_followed_and_a_changed_one_refused(tmp_path):
    source = checkpoint_copy("qwen2_5_vl", tmp_path / "hf", **{"chat_template.json": {"chat_template": TEMPLATE}})
    folder = convert_vlm(source, tmp_path / "converted", **QUIET)
    config = json.loads((folder / "config.json").read_text())
    assert config["chat"] == {"template": "qwen", "default_system": "You are a helpful assistant."}
    generator = NativeGenerator.from_folder(folder, 256)
    ids = generator.layout.encode(generator.prompt("what is in it?", images=[STORED["photo_0"]]))
    system = generator.tokenizer.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
                                        add_special_tokens=False).ids
    assert ids.tolist() == system + STORED["qwen2_5_vl_ids_one_image"].tolist()
    changed = checkpoint_copy("qwen2_5_vl", tmp_path / "changed", **{"tokenizer_config.json": {
        "chat_template": TEMPLATE.replace("<|im_start|>{{ message['role'] }}\n", "<|im_start|>{{ message['role'] }}:")}})
    with pytest.raises(ConversionError, match="tokenizer_config.json: its chat template renders .* where the family's"):
        convert_vlm(changed, tmp_path / "x", **QUIET)


def test_bad_checkpoints_and_attachments_are_refused_by_name(generators, tmp_path):
    other = checkpoint_copy("qwen2_5_vl", tmp_path / "llama")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ConversionError, match="model_type 'llama' is not a native-resolution VLM"):
        convert_vlm(other, tmp_path / "x", **QUIET)
    (other / "config.json").write_text(json.dumps(config))
    (other / "tokenizer.json").unlink()
    with pytest.raises(ConversionError, match="tokenizer.json: missing"):
        convert_vlm(other, tmp_path / "x", **QUIET)
    generator = generators["qwen2_5_vl"]
    with pytest.raises(mindvl.errors.InputError, match=r"images\[0\]: .* is not a readable image"):
        generator.prompt("q", images=[str(other / "config.json")])
    with pytest.raises(mindvl.errors.InputError, match=r"images\[0\]: the image is 600x2 pixels, its sides more"):
        generator.prompt("q", images=[np.zeros((2, 600, 3), np.uint8)])
    with pytest.raises(mindvl.errors.InputError, match="is not a readable video"):
        generator.prompt("q", video=str(other / "config.json"))


def test_cli_converts_and_answers_about_two_images_and_in_json(tmp_path, capsys):
    out = tmp_path / "vlm"
    assert main(["convert", "vlm", "--hf", str(REFERENCES / "tiny_qwen2_vl"), "--out", str(out)]) == 0
    assert "qwen2_vl:" in capsys.readouterr().out
    assert main(["generate", "--model", str(out), "what is in it?", "--image", photo(2, tmp_path), "--image",
                 photo(1, tmp_path), "--max-new-tokens", "4"]) == 0
    printed = capsys.readouterr()
    assert "[length]" in printed.err or "[stop]" in printed.err
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
                                  "required": ["n"], "additionalProperties": False}))
    assert main(["generate", "--model", str(out), "how many?", "--image", photo(2, tmp_path), "--json-schema",
                 str(schema), "--max-new-tokens", "24"]) == 0
    printed = capsys.readouterr()
    assert "[stop]" in printed.err and isinstance(json.loads(printed.out)["n"], int)  # the random model writes JSON
    assert main(["generate", "--model", str(out), "yes?", "--choice", "yes", "--choice", "no"]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")
    assert main(["generate", "--model", str(out), "q", "--regex", "[a", "--max-new-tokens", "2"]) == 2
    assert "regex: cannot be compiled" in capsys.readouterr().err
    assert main(["convert", "vlm", "--gguf", "x.gguf"]) == 2


@pytest.mark.parametrize("family,layout", [("qwen2_5_vl", "new"), ("qwen2_vl", "old")])
def test_written_back_the_folder_is_the_checkpoint_transformers_saved(tmp_path, family, layout, capsys):
    """convert -> export hf gives back every tensor bit for bit under the names it was read with (either layout),
    the config (dtype float32), processor, generation and template files: what transformers loaded for the stored
    logits (tests/references/ref_qwen2_vl.py --written-back loads such a folder with transformers and compares)."""
    source = checkpoint_copy(family, tmp_path / "hf", **{"chat_template.json": {"chat_template": TEMPLATE}})
    if layout == "new":
        tensors = load_file(str(source / "model.safetensors"))
        save_file({("model." + k if k.startswith("visual.") else
                    k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
                   for k, v in tensors.items()}, str(source / "model.safetensors"))
    converted = convert_vlm(source, tmp_path / "converted", **QUIET)
    assert main(["export", "hf", str(converted), "--out", str(tmp_path / "back")]) == 0
    back = tmp_path / "back"
    original, written = load_file(str(source / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert original.keys() == written.keys()
    assert all(np.array_equal(original[k], written[k]) and written[k].dtype == np.float32 for k in original)
    for name in ("preprocessor_config.json", "generation_config.json", "chat_template.json"):
        assert json.loads((back / name).read_text()) == json.loads((source / name).read_text()), name
    config = json.loads((back / "config.json").read_text())
    assert config == {**json.loads((source / "config.json").read_text()), "torch_dtype": "float32", "dtype": "float32"}
    assert (back / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_vlm_folder_opens_with_its_language_model_quantized(generators, weights, tmp_path):
    """from_pretrained(weights=...) of a converted VLM: the decoder's products and token table quantized (the vision
    tower float32), generating exactly what the float model generates holding the widened weights."""
    from mindspore import Tensor

    from mindvl.cells.quant import QuantizedLinear

    folder = generators["qwen2_5_vl"].source["checkpoint"]
    quantized = mindvl.from_pretrained(folder, cache_len=256, kernels="standard", weights=weights)
    widened = mindvl.from_pretrained(folder, cache_len=256, kernels="standard")
    layers = {name: cell for name, cell in quantized.lm.cells_and_names() if isinstance(cell, QuantizedLinear)}
    assert quantized.weights == weights and widened.weights == "float32" and "embed" in layers
    assert not any(isinstance(cell, QuantizedLinear) for _, cell in quantized.model.tower.cells_and_names())
    float_params = dict(widened.lm.parameters_and_names())
    for path, layer in layers.items():
        float_params[f"{path}.weight"].set_data(Tensor(layer.dequantized_weight()))
    prompt = quantized.prompt("what is in it?", images=photo(0, tmp_path))
    answers = [g.generate(prompt, max_new_tokens=16, ignore_eos=True).tokens for g in (quantized, widened)]
    assert answers[0] == answers[1]
    with pytest.raises(ConfigError, match="weights: expected one of"):
        mindvl.from_pretrained(folder, weights="int2")
