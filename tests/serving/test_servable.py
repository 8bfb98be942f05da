"""The servable directory: MindSpore Serving's registration API recorded from servable_config.py files,
deploy of a real model package (versions, hashes, races, path traversal), and the generated
servable_config.py, whose preprocessing stages must give the model what the data loader gives it."""
import functools
import json
import os
import sys
import threading
import types

import numpy as np
import pytest

from mindvl.data import create_dataset, load_meta, load_tokenizer
from mindvl.data.reading.examples import wav_bytes
from mindvl.data.records import read_split, read_table
from mindvl.errors import PackageError
from mindvl.export.graphs import graph_specs
from mindvl.export.package_writer import write_package
from mindvl.files import sha256_file
from mindvl.package_reader import check_files, read_manifest
from mindvl.serving import servable
from mindvl.serving.register import Placeholder, ServableError, declare_model, load_servable_config
from mindvl.serving.servable import (CONFIG_FILE, config_text, deploy, list_servables, list_versions, resolve,
                                     servable_folder)


@pytest.fixture(scope="module")
def source(small_model):
    """(config, model, source record) of the session's small untrained classifier."""
    return small_model


@pytest.fixture(scope="module")
def package(source, tmp_path_factory):
    """A real package with one cheap graph (image_embed)."""
    cfg, model, record = source
    return write_package(cfg, model, tmp_path_factory.mktemp("pkg") / "tiny", record, progress=False,
                         graphs=["image_embed"])


def write_config(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(text)
    return folder / CONFIG_FILE


# ----------------------------------------------------------------------------- registration API

RECORDED = '''
from mindspore_serving.server import register

net = register.declare_model(model_file="net.mindir", model_format="MindIR", with_batch_dim=True,
                             without_batch_dim_inputs=1, options=register.GpuOptions(precision_mode="fp16"))
context = register.Context(thread_num=2)
context.append_device_info(register.CPUDeviceInfo(precision_mode="fp16"))
pair = register.declare_model(model_file=["a.mindir", "b.mindir"], model_format="mindir", with_batch_dim=False,
                              context=context)


def scale(x, factor):
    return x * factor, x + factor


def label(y):
    return "big" if y.sum() > 0 else "small"


@register.register_method(output_names=["label", "raw"])
def classify(x, factor):
    scaled, shifted = register.add_stage(scale, x, factor, outputs_count=2)
    y = register.add_stage(net, scaled, shifted, outputs_count=1, tag="net")
    name = register.add_stage(label, y, outputs_count=1, batch_size=4)
    return name, y


@register.register_method(output_names="echo")
def echo(text):
    return text
'''


def test_a_method_body_records_its_python_and_model_stages(tmp_path):
    definition = load_servable_config(write_config(tmp_path / "demo", RECORDED))
    net, pair = definition.models
    assert (net.files, net.model_format, net.with_batch_dim, net.without_batch_dim_inputs) == \
        (("net.mindir",), "MindIR", True, (1,))
    assert (pair.files, pair.key, pair.model_format, pair.with_batch_dim) == \
        (("a.mindir", "b.mindir"), "a.mindir;b.mindir", "MindIR", False)
    assert repr(net.options.context) == "Context(GPUDeviceInfo(precision_mode='fp16'))"  # kept for the log
    assert repr(pair.context) == "Context(thread_num=2, CPUDeviceInfo(precision_mode='fp16'))"

    assert list(definition.methods) == ["classify", "echo"]
    classify = definition.methods["classify"]
    assert classify.inputs == ("x", "factor") and classify.output_names == ("label", "raw")
    scale, model, label = classify.stages
    assert [s.name for s in classify.stages] == ["scale", "net", "label"]
    assert [s.label for s in classify.stages] == ["Function 'demo.scale'", "net", "Function 'demo.label'"]
    assert not scale.is_model and model.is_model and model.target is net and not label.is_model
    assert scale.args == (Placeholder("classify", 0, 0), Placeholder("classify", 0, 1))
    assert model.args == scale.outputs == (Placeholder("classify", 1, 0), Placeholder("classify", 1, 1))
    assert label.args == model.outputs and label.batch_size == 4 and model.tag == "net"
    assert classify.returns == (label.outputs[0], model.outputs[0])
    assert scale.target(np.float32(2), 3) == (6, 5) and label.target(np.ones(2)) == "big"  # the file's functions

    echo = definition.methods["echo"]
    assert echo.inputs == ("text",) and echo.stages == [] and echo.returns == (Placeholder("echo", 0, 0),)


def test_model_call_takes_one_instance_or_a_list_of_them_as_mindspore_serving_does(tmp_path):
    net = load_servable_config(write_config(tmp_path / "demo", RECORDED)).models[0]
    with pytest.raises(ServableError, match=r"model net\.mindir: call\(\) runs only while a server serves"):
        net.call(np.ones(2))
    net.runner = lambda instances, subgraph: [tuple(x * 2 + subgraph for x in instance) for instance in instances]
    assert net.call(np.ones(1)).tolist() == [2.0]  # one instance, one output: the output itself
    assert [y.tolist() for y in net.call(np.ones(1), np.zeros(1))] == [[2.0], [0.0]]  # one instance, two outputs
    several = net.call([[np.ones(1)], (np.zeros(1),)], subgraph=1)  # several instances: an output tuple each
    assert [[y.tolist() for y in outputs] for outputs in several] == [[[3.0]], [[1.0]]]
    with pytest.raises(RuntimeError, match=r"^Model\(net\.mindir\)\.call\(\) failed: no inputs provided"):
        net.call()
    with pytest.raises(RuntimeError, match=r"^Model\(net\.mindir ,subgraph=1\)\.call\(\) failed: inputs format invalid"):
        net.call([np.ones(1)], subgraph=1)


PRELUDE = '''
from mindspore_serving.server import register

net = register.declare_model(model_file="net.mindir", model_format="MindIR")


def f(x):
    return x
'''

INVALID = {
    "outputs_count does not match the unpacking": ('''
@register.register_method(output_names=["y"])
def unpack(x):
    a, b = register.add_stage(f, x, outputs_count=3)
    return a
''', r"method unpack: ValueError: too many values to unpack.*outputs_count"),
    "returns a constant": ('''
@register.register_method(output_names=["y"])
def constant(x):
    y = register.add_stage(f, x, outputs_count=1)
    return 3
''', r"method constant: output 'y' is 3, not an input or a stage output"),
    "returns fewer values than output names": ('''
@register.register_method(output_names=["a", "b"])
def short(x):
    return register.add_stage(f, x, outputs_count=1)
''', r"method short: returns 1 value\(s\) for 2 output_names \['a', 'b'\]"),
    "an undeclared model": ('''
other = register.Model(("other.mindir",), "MindIR", True, None, (), None, None, __file__)

@register.register_method(output_names=["y"])
def stranger(x):
    return register.add_stage(other, x, outputs_count=1)
''', r"method stranger: stage 1: model other\.mindir was not declared with declare_model"),
    "a file declared twice": ('''
again = register.declare_model(model_file=["extra.mindir", "net.mindir"], model_format="MindIR")
''', r"declare_model: model file net\.mindir is declared twice"),
    "an unknown model format": ('''
onnx = register.declare_model(model_file="net.onnx", model_format="ONNX")
''', r"declare_model\('net\.onnx'\): model_format 'ONNX': expected one of MindIR, MindIR_Lite, OM"),
    "a model file outside the version folder": ('''
up = register.declare_model(model_file="../net2.mindir", model_format="MindIR")
''', r"model_file '\.\./net2\.mindir': expected a file name relative to the version folder"),
    "a constant stage argument": ('''
@register.register_method(output_names=["y"])
def constant_arg(x):
    return register.add_stage(f, x, 3, outputs_count=1)
''', r"method constant_arg: stage 1: argument 2 is 3, not an input or an earlier stage output"),
    "a placeholder of another method": ('''
@register.register_method(output_names=["y"])
def first(x):
    global kept
    kept = x
    return x

@register.register_method(output_names=["y"])
def second(x):
    return register.add_stage(f, kept, outputs_count=1)
''', r"method second: stage 1: argument 1 is Placeholder\(method='first'"),
    "no outputs": ('''
@register.register_method(output_names=["y"])
def nothing(x):
    return register.add_stage(f, x, outputs_count=0)
''', r"method nothing: stage 1: outputs_count: expected an int >= 1, got 0"),
    "a branch on a placeholder": ('''
@register.register_method(output_names=["y"])
def branchy(x):
    if x:
        return x
    return register.add_stage(f, x, outputs_count=1)
''', r"method branchy: TypeError: a placeholder has no value at registration"),
    "varargs": ('''
@register.register_method(output_names=["y"])
def star(*xs):
    return xs[0]
''', r"method star: its inputs are its parameters, each plain .*check xs"),
    "a stage outside a method": ('''
register.add_stage(f, outputs_count=1)
''', r"add_stage: called outside a @register_method body"),
    "an unknown device option": ('''
context = register.Context(threads=2)
''', r"RuntimeError: Set context failed, unsupported option threads \(it takes thread_num, "),
    "a legacy call_* whose result is not assigned": ('''
@register.register_method(output_names=["y"])
def legacy(x):
    return register.call_preprocess(f, x)
''', r"method legacy: Failed to parse method 'legacy', complex statements .* use 'add_stage' to replace "
     r"'call_preprocess'"),
    "call_servable with two models": ('''
other = register.declare_model(model_file="other.mindir", model_format="MindIR")


@register.register_method(output_names=["y"])
def legacy(x):
    y = register.call_servable(x)
    return y
''', r"call_servable: there are 2 models declared; call_servable needs exactly one"),
    "a stage named by a string": ('''
@register.register_method(output_names=["y"])
def named(x):
    y = register.add_stage("argmax", x, outputs_count=1)
    return y
''', r"stage 'argmax' names a C\+\+ stage function of MindSpore Serving"),
    "no method at all": ("", r"registers no method"),
    "a syntax error": ("def broken(:\n", r"SyntaxError"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_servable_config_is_refused_naming_file_and_method(case, tmp_path):
    body, message = INVALID[case]
    config = write_config(tmp_path / "demo", PRELUDE + body)
    with pytest.raises(ServableError, match=message) as caught:
        load_servable_config(config)
    assert str(config) in str(caught.value)


def test_the_mindspore_serving_modules_exist_only_while_a_file_loads(tmp_path, monkeypatch):
    assert "mindspore_serving" not in sys.modules
    seen = write_config(tmp_path / "seen", RECORDED.replace(
        "from mindspore_serving.server import register",
        "import mindspore_serving.server.register as register\nassert register.__name__ == 'mindvl.serving.register'"))
    load_servable_config(seen)
    with pytest.raises(ServableError):
        load_servable_config(write_config(tmp_path / "bad", PRELUDE + "def broken(:\n"))
    assert not {"mindspore_serving", "mindspore_serving.server", "mindspore_serving.server.register"} & set(sys.modules)

    real = types.ModuleType("mindspore_serving")  # an installed MindSpore Serving is put back as it was
    monkeypatch.setitem(sys.modules, "mindspore_serving", real)
    load_servable_config(seen)
    assert sys.modules["mindspore_serving"] is real and "mindspore_serving.server" not in sys.modules


def test_every_load_starts_from_an_empty_registry(tmp_path):
    first = load_servable_config(write_config(tmp_path / "one", RECORDED))
    second = load_servable_config(write_config(tmp_path / "two", RECORDED))  # same files: not "declared twice"
    assert first.models[0] is not second.models[0] and second.config == tmp_path / "two" / CONFIG_FILE
    with pytest.raises(ServableError, match="register.declare_model: called outside a servable_config.py"):
        declare_model("net.mindir", "MindIR")


def test_mindir_lite_and_om_models_are_recorded_but_refused_when_loaded(tmp_path):
    config = write_config(tmp_path / "demo", RECORDED.replace('"mindir", with_batch_dim=False', '"OM"'))
    pair = load_servable_config(config).models[1]
    assert pair.model_format == "OM"
    with pytest.raises(ServableError, match=r"model a\.mindir, b\.mindir: format OM is recorded, but mindvl "
                                            r"serves only MindIR"):
        pair.check_loadable()


# ----------------------------------------------------------------------------- the servable directory

def test_deploying_twice_gives_versions_1_and_2_with_verified_files(package, tmp_path):
    servables = tmp_path / "servables"
    assert deploy(package, servables, "tiny") == (1, (servables / "tiny" / "1").resolve())
    version, path = deploy(package, servables, "tiny")
    assert version == 2 and path == resolve(servables, "tiny") == resolve(servables, "tiny", 0)
    assert resolve(servables, "tiny", 1) == (servables / "tiny" / "1").resolve()
    assert list_servables(servables) == ["tiny"] and list_versions(servables, "tiny") == [1, 2]
    manifest = read_manifest(path)
    check_files(path, manifest)
    assert manifest == read_manifest(package)
    assert sorted(p.name for p in (servables / "tiny").iterdir()) == ["1", "2", CONFIG_FILE]  # no leftovers


def test_a_tampered_package_is_refused_naming_the_file(package, tmp_path, writable_copy):
    target = writable_copy(package, tmp_path)
    data = bytearray((target / "image_embed.mindir").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (target / "image_embed.mindir").write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"image_embed\.mindir: sha256 differs"):
        deploy(target, tmp_path / "servables", "tiny")
    assert not (tmp_path / "servables" / "tiny").exists()


def test_a_manifest_listing_files_outside_the_package_is_refused(package, tmp_path, writable_copy):
    target = writable_copy(package, tmp_path)
    (tmp_path / "escape").write_bytes(b"not part of the package")
    manifest = read_manifest(target)
    manifest["files"]["../escape"] = {"sha256": sha256_file(tmp_path / "escape"), "bytes": 23}
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=r"manifest\.json: lists '\.\./escape', outside the package"):
        deploy(target, tmp_path / "servables", "tiny")
    assert not (tmp_path / "servables" / "tiny").exists()


def test_concurrent_deploys_take_distinct_versions(package, tmp_path):
    servables, results, errors = tmp_path / "servables", [], []

    def run():
        try:
            results.append(deploy(package, servables, "tiny")[0])
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and sorted(results) == [1, 2, 3, 4]
    for version in results:
        check_files(resolve(servables, "tiny", version), read_manifest(package))


def test_a_version_number_taken_meanwhile_is_skipped(package, tmp_path, monkeypatch):
    """The race, made certain: this deploy reads the versions before another deploy's rename lands."""
    servables = tmp_path / "servables"
    deploy(package, servables, "tiny")
    listing, calls = servable._versions, []

    def stale_first(folder):
        calls.append(folder)
        return [] if len(calls) == 1 else listing(folder)

    monkeypatch.setattr(servable, "_versions", stale_first)
    assert deploy(package, servables, "tiny")[0] == 2
    assert len(calls) == 2  # version 1 was tried and refused by the rename, then 2 taken


@pytest.mark.parametrize("name", ["..", ".", "../outside", "/etc", "a/b", "", "tiny\x00"])
def test_names_that_leave_the_servable_directory_are_refused(package, tmp_path, name):
    servables = tmp_path / "servables"
    deploy(package, servables, "tiny")
    with pytest.raises(ServableError, match="servable name .*: expected letters, digits"):
        resolve(servables, name)
    with pytest.raises(ServableError, match="servable name .*: expected letters, digits"):
        deploy(package, servables, name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["servables"]


def test_symlinks_pointing_outside_are_refused(package, tmp_path):
    servables, outside = tmp_path / "servables", tmp_path / "outside"
    deploy(package, servables, "tiny")
    deploy(package, outside, "evil")
    (servables / "tiny" / "2").symlink_to(outside / "evil" / "1")
    with pytest.raises(ServableError, match=r"servable tiny version 2: .* outside the servable directory"):
        resolve(servables, "tiny")
    assert resolve(servables, "tiny", 1) == (servables / "tiny" / "1").resolve()

    (servables / "evil").symlink_to(outside / "evil")
    with pytest.raises(ServableError, match=r"servable evil: .* outside the servable directory"):
        resolve(servables, "evil", 1)
    with pytest.raises(ServableError, match=r"servable evil: .* outside the servable directory"):
        deploy(package, servables, "evil")
    assert list_versions(outside, "evil") == [1]


def test_missing_servables_and_versions_are_named_with_what_exists(package, tmp_path):
    servables = tmp_path / "servables"
    with pytest.raises(ServableError, match="servable directory .*: no such folder"):
        list_servables(servables)
    deploy(package, servables, "tiny")
    deploy(package, servables, "tiny")
    with pytest.raises(ServableError, match=r"servable small: not in .* \(it has: tiny\)"):
        resolve(servables, "small")
    with pytest.raises(ServableError, match=r"servable tiny: has no version 3 \(it has 1, 2\)"):
        resolve(servables, "tiny", 3)
    with pytest.raises(ServableError, match=r"servable tiny: version -1: expected a positive integer"):
        resolve(servables, "tiny", -1)
    write_config(servables / "empty", RECORDED)
    with pytest.raises(ServableError, match="servable empty: has no version folder"):
        resolve(servables, "empty")
    assert list_servables(servables) == ["empty", "tiny"]


# ----------------------------------------------------------------------------- deploy checks the config

def test_a_generated_config_refuses_a_package_with_other_preprocessing(package, tmp_path, writable_copy):
    servables = tmp_path / "servables"
    deploy(package, servables, "tiny")
    other = writable_copy(package, tmp_path)
    manifest = read_manifest(other)
    manifest["preprocess"]["image_size"] += 32
    manifest["labels"] = manifest["labels"][::-1]
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ServableError, match=r"servable_config\.py: generated for a package with other "
                                            r"labels, preprocess\.image_size than"):
        deploy(other, servables, "tiny")
    assert list_versions(servables, "tiny") == [1]
    assert deploy(other, servables, "tiny96") == (1, (servables / "tiny96" / "1").resolve())


def test_a_hand_written_config_must_fit_the_package(package, tmp_path):
    servables = tmp_path / "servables"
    write_config(servables / "mine", '''
from mindspore_serving.server import register

image = register.declare_model(model_file="image_embed.mindir", model_format="MindIR")


def twice(x):
    return x, x


@register.register_method(output_names=["embedding"])
def embed(x):
    a, b = register.add_stage(twice, x, outputs_count=2)
    return register.add_stage(image, a, b, outputs_count=1)
''')
    with pytest.raises(ServableError, match=r"method embed: stage 2 \(image_embed\.mindir\) has 2 inputs but graph "
                                            r"image_embed has 1 \(image\)"):
        deploy(package, servables, "mine")
    write_config(servables / "lacking", PRELUDE + '''
@register.register_method(output_names=["y"])
def run(x):
    return register.add_stage(net, x, outputs_count=1)
''')
    with pytest.raises(ServableError, match=r"declares model net\.mindir, which .* lacks \(it has image_embed\.mindir\)"):
        deploy(package, servables, "lacking")
    assert not (servables / "mine" / "1").exists() and not (servables / "lacking" / "1").exists()


# ----------------------------------------------------------------------------- the generated servable_config.py

def test_the_generated_config_serves_the_graphs_the_package_has(package, tmp_path):
    servables = tmp_path / "servables"
    deploy(package, servables, "tiny")
    definition = load_servable_config(servable_folder(servables, "tiny") / CONFIG_FILE)
    assert [(m.files, m.model_format, m.with_batch_dim) for m in definition.models] == \
        [(("image_embed.mindir",), "MindIR", True)]
    assert list(definition.methods) == ["embed_image"]
    method = definition.methods["embed_image"]
    assert (method.inputs, method.output_names) == (("image",), ("embedding",))
    assert [(s.name, s.is_model) for s in method.stages] == [("pixels", False), ("image_embed.mindir", True)]
    assert "from mindspore_serving.server import register" in (servables / "tiny" / CONFIG_FILE).read_text()


@pytest.fixture(scope="module")
def every_graph(package, source, tmp_path_factory):
    """The config generated for a package with all four graphs (their specs from the table the writer
    uses), over a deployed version folder holding the real tokenizer; -> (definition, specs)."""
    cfg = source[0]
    manifest = read_manifest(package)
    specs = graph_specs(cfg.preprocess, cfg.model.embed_dim, len(manifest["labels"]), load_tokenizer(cfg.data.root))
    manifest["graphs"] = {name: {"file": f"{name}.mindir", "inputs": [t.to_dict() for t in spec.inputs],
                                 "outputs": [t.to_dict() for t in spec.outputs]} for name, spec in specs.items()}
    servables = tmp_path_factory.mktemp("servables")
    deploy(package, servables, "tiny")
    config = servables / "tiny" / CONFIG_FILE
    config.write_text(config_text(manifest, "tiny"))
    return load_servable_config(config), manifest["graphs"]


def test_the_generated_methods_for_every_graph(every_graph):
    definition, graphs = every_graph
    assert [m.files[0] for m in definition.models] == [f"{g}.mindir" for g in ("vqa", "image_embed", "text_embed",
                                                                              "audio_embed")]
    signatures = {name: (m.inputs, m.output_names, [s.name for s in m.stages]) for name, m in
                  definition.methods.items()}
    assert signatures == {
        "predict": (("image", "question", "audio"), ("answer", "confidence", "answer_text"),
                    ["pixels", "question_input", "audio_input", "vqa.mindir", "vqa_answer"]),
        "embed_image": (("image",), ("embedding",), ["pixels", "image_embed.mindir"]),
        "embed_text": (("text",), ("embedding",), ["text_input", "text_embed.mindir"]),
        "embed_audio": (("audio",), ("embedding",), ["audio_embed_input", "audio_embed.mindir"])}
    for method in definition.methods.values():  # every model stage takes all that preprocessing made
        model = next(stage for stage in method.stages if stage.is_model)
        graph = graphs[model.target.files[0][:-len(".mindir")]]
        before = [output for stage in method.stages[:method.stages.index(model)] for output in stage.outputs]
        assert set(model.args) == set(before) and len(model.args) == len(graph["inputs"])


def model_inputs(method, *inputs):
    """The method's Python stages before its model stage run on one instance; -> the model stage's inputs."""
    values = {Placeholder(method.name, 0, i): value for i, value in enumerate(inputs)}
    for stage in method.stages:
        if stage.is_model:
            return [values[arg] for arg in stage.args]
        result = stage.target(*(values[arg] for arg in stage.args))
        values.update(zip(stage.outputs, result if len(stage.outputs) > 1 else (result,)))
    raise AssertionError(f"method {method.name} has no model stage")


def matches(arrays, specs):
    """Arrays of one instance against the manifest's tensor specs: same dtypes, shapes without the batch dim."""
    assert len(arrays) == len(specs)
    for array, spec in zip(arrays, specs):
        array = np.asarray(array)
        assert (str(array.dtype), list(array.shape)) == (spec["dtype"], spec["shape"][1:]), spec["name"]


def test_the_generated_stages_give_the_graphs_what_the_data_loader_gives_the_model(every_graph, source):
    """From raw bytes (test images, questions, spoken clips as WAV) the Python stages produce exactly the
    arrays evaluation feeds the model, typed and shaped as the manifest's graph inputs."""
    definition, graphs = every_graph
    cfg = source[0]
    root, pre = cfg.data.root, cfg.preprocess
    stage = {name: functools.partial(model_inputs, m) for name, m in definition.methods.items()}
    rows = read_split(root, "test", ["image", "question_id"])
    questions = load_meta(root)["questions"]
    clips = {int(r["question_id"]): r["pcm"] for r in read_table(os.path.join(root, "speech.mindrecord"))
             if r["split"] == "test"}
    batch = next(create_dataset(cfg, "test", question_modality="both", shard_id=0, num_shards=1)
                 .create_dict_iterator(num_epochs=1, output_numpy=True))
    for i, row in enumerate(rows[:3]):
        image, question = bytes(row["image"]), questions[int(row["question_id"])]
        audio = wav_bytes(clips[int(row["question_id"])], pre.sample_rate)
        inputs = stage["predict"](image, question, audio)
        matches(inputs, graphs["vqa"]["inputs"])
        for name, value in zip(("image", "question_ids", "question_mask", "audio_mel", "audio_mask"), inputs):
            np.testing.assert_allclose(value, batch[name][i], atol=1e-6, err_msg=name)
        assert (inputs[5], inputs[6]) == (1.0, 1.0)
        matches(stage["embed_image"](image), graphs["image_embed"]["inputs"])
        matches(stage["embed_text"](question), graphs["text_embed"]["inputs"])
        matches(stage["embed_audio"](audio), graphs["audio_embed"]["inputs"])
        np.testing.assert_array_equal(stage["embed_text"](question)[0], batch["question_ids"][i])
        np.testing.assert_allclose(stage["embed_audio"](audio)[0], batch["audio_mel"][i], atol=1e-6)

    typed = stage["predict"](image, question, b"")  # one modality: the other is empty and switched off
    spoken = stage["predict"](image, "", audio)
    assert (typed[5], typed[6], spoken[5], spoken[6]) == (1.0, 0.0, 0.0, 1.0)
    assert not typed[4].any() and not spoken[2].any()
    matches(typed, graphs["vqa"]["inputs"])
    with pytest.raises(ValueError, match="predict: question and audio are both empty"):
        stage["predict"](image, "", b"")
    with pytest.raises(ValueError, match="image: cannot decode the image"):
        stage["embed_image"](b"not an image")
    with pytest.raises(ValueError, match=r"question: expected str \(a JSON string\), got ndarray"):
        stage["predict"](image, np.array([1, 2], np.int32), b"")  # a tensor where the question goes
    with pytest.raises(ValueError, match=r"audio: expected bytes \(base64 as \{\"b64\""):
        stage["embed_audio"]("a string")


def test_the_generated_answer_stage_names_the_label_and_decodes_the_generated_text(every_graph, source):
    definition, graphs = every_graph
    cfg = source[0]
    answer_stage = definition.methods["predict"].stages[-1].target
    labels, tokenizer = load_meta(cfg.data.root)["answers"], load_tokenizer(cfg.data.root)
    logits = np.linspace(-1.0, 1.0, len(labels)).astype(np.float32)[::-1].copy()  # label 0 the most probable
    ids = tokenizer.encode_answer(labels[0], cfg.preprocess.max_answer_length)[1:]  # what the graph generates
    matches([logits, ids], graphs["vqa"]["outputs"])
    answer, confidence, text = answer_stage(logits, ids)
    expected = np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum()
    assert (answer, text) == (labels[0], labels[0])
    assert confidence.dtype == np.float32 and confidence == pytest.approx(expected[0], rel=1e-6)
