"""`mindvl deploy`, `mindvl serve` and `mindvl query`: a package deployed and served by the real command in a
subprocess, queried over REST and gRPC; wrong flags, missing files and bad settings end with a message and
exit status 2 before anything is sent or served."""
import base64
import dataclasses
import json
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import yaml

from mindvl.cli import serving
from mindvl.cli.main import build_parser, main
from mindvl.data import load_meta
from mindvl.data.reading.examples import query_examples
from mindvl.serving import Client
from mindvl.serving.serve_config import ServeConfig

STARTED = re.compile(r"mindvl serve: REST (http://\S+), gRPC (\S+);")


def run(capsys, *argv):
    """mindvl.cli.main in this process -> (exit status, stdout, stderr)."""
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def wait_for_start(process, log, timeout=180.0):
    """The line `mindvl serve` prints once its versions are loaded (it has no other stdout)."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and process.poll() is None:
            if selector.select(timeout=1.0):
                return process.stdout.readline()
    pytest.fail(f"mindvl serve did not start (exit {process.poll()}):\n{log.read_text()[-3000:]}")


def test_deploy_serve_and_query_from_the_command_line(fresh_servables, vqa_package, tmp_path, capsys):
    """The deployed version 2 is what the served process answers with; YAML settings apply under the flags
    that override them; the query output matches the Client's; SIGTERM ends the server cleanly."""
    cfg, package = vqa_package
    status, out, _ = run(capsys, "deploy", package, "--servable-dir", fresh_servables, "--name", "vqa")
    assert status == 0 and re.match(rf"deployed {re.escape(str(package))} as vqa version 2 in \S+/vqa/2\n", out)
    assert (fresh_servables / "vqa" / "2" / "manifest.json").is_file()

    settings = tmp_path / "serve.yaml"  # --grpc-port 0 below turns the file's "no gRPC" into any free port
    settings.write_text(yaml.safe_dump({"servable_dir": str(fresh_servables), "grpc_port": -1, "poll_s": 0}))
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "mindvl.cli", "serve", "--config", settings, "--port", "0",
                                    "--grpc-port", "0", "--no-batching", "--cascade-edge", package],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        started = STARTED.match(wait_for_start(process, log))
        assert started, log.read_text()[-3000:]
        rest, grpc_address = started.groups()
        assert "loaded servable vqa version 2" in log.read_text()  # INFO logging shows loading
        # the demo page, with the cascade of --cascade-edge (its cloud: the only servable, this server's vqa)
        assert process.stdout.readline() == f"mindvl serve: demo page {rest}/ (edge-cloud cascade: {package.name})\n"

        example, = query_examples(cfg.data.root, 1)
        image, question, audio = example.image, example.question, example.audio
        (tmp_path / "image.png").write_bytes(image)
        (tmp_path / "question.wav").write_bytes(audio)
        labels = load_meta(cfg.data.root)["answers"]
        expected = Client(rest, "vqa", "predict").infer({"image": image, "question": question, "audio": b""})[0]
        status, out, _ = run(capsys, "query", rest, "--servable", "vqa", "--image", tmp_path / "image.png",
                             "--question", question)
        cascade = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"{rest}/cascade", json.dumps({"instances": [{"image": {"b64": base64.b64encode(image).decode()},
                                                          "question": question}]}).encode()), timeout=120).read())
        assert cascade["source"] in ("edge", "cloud") and cascade["edge_answer"] in labels
        lines = dict(line.split(None, 1) for line in out.splitlines())
        assert status == 0 and lines["answer"] == expected["answer"] and lines["answer"] in labels
        assert float(lines["confidence"]) == pytest.approx(expected["confidence"], abs=5e-5)

        status, out, _ = run(capsys, "query", grpc_address, "--servable", "vqa", "--image", tmp_path / "image.png",
                             "--audio", tmp_path / "question.wav", "--json")
        spoken = json.loads(out)
        assert status == 0 and spoken["answer"] in labels and 0 < spoken["confidence"] <= 1

        status, out, _ = run(capsys, "query", f"grpc://{grpc_address}", "--servable", "vqa", "--method",
                             "embed_image", "--input", f"image=@{tmp_path / 'image.png'}", "--json")
        embedding = Client(rest, "vqa", "embed_image").infer({"image": image})[0]["embedding"]
        np.testing.assert_allclose(json.loads(out)["embedding"], embedding, atol=1e-6)
        status, out, _ = run(capsys, "query", rest, "--servable", "vqa", "--method", "embed_text", "--text", question)
        described = rf"embedding  float32 \[{cfg.model.embed_dim}\], norm 1\.0000, first \[.*\]\n"
        assert status == 0 and re.fullmatch(described, out)

        (tmp_path / "broken.png").write_bytes(b"not an image")
        for argv, message in (
                (["--method", "embed_image", "--image", tmp_path / "broken.png"], "vqa embed_image: .*cannot decode"),
                (["--method", "embed_text", "--text", "hi", "--version", "1"], "version 1 is not loaded"),
                (["--method", "embed_text", "--text", "hi", "--input", "extra=1"],
                 "input 'extra' is not an input of the method; method embed_text takes text")):
            status, _, err = run(capsys, "query", rest, "--servable", "vqa", *argv)
            assert status == 2 and re.match(rf"mindvl: error: .*{message}", err), err
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=60)
    assert status == 0, log.read_text()[-3000:]


def test_query_refuses_wrong_flags_missing_files_and_an_unreachable_server_with_exit_2(tmp_path, capsys):
    """Each mistake is named with what to pass instead, before anything is sent."""
    address = "http://127.0.0.1:9"  # never contacted
    for argv, message in (
            (["--image", tmp_path / "missing.png", "--question", "what?"],
             f"--image {tmp_path}/missing.png: no such file"),
            (["--text", "hello"], "--text: predict takes --image, --question, --audio"),
            (["--question", "what?"], "predict: give --image"),
            (["--method", "mine", "--input", "novalue"], "--input 'novalue': expected NAME=VALUE"),
            (["--method", "mine", "--input", f"blob=@{tmp_path}/none.bin"],
             f"--input blob=@{tmp_path}/none.bin: no such file")):
        status, _, err = run(capsys, "query", address, "--servable", "vqa", *argv)
        assert status == 2 and err.startswith(f"mindvl: error: {message}"), err
    with pytest.raises(SystemExit) as exit_info:
        main(["query", address, "--image", "x.png"])
    assert exit_info.value.code == 2 and "the following arguments are required: --servable" in capsys.readouterr().err

    with socket.socket() as refusing:  # bound, not listening: connections to it are refused
        refusing.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        status, _, err = run(capsys, "query", address, "--servable", "vqa", "--method", "embed_text", "--text", "hi")
    assert status == 2 and err.startswith(f"mindvl: error: cannot reach {address}: ") and "`mindvl serve`" in err


def test_deploy_refuses_a_folder_that_is_no_package_and_an_unsafe_name(vqa_package, tmp_path, capsys):
    status, _, err = run(capsys, "deploy", tmp_path, "--servable-dir", tmp_path / "servables", "--name", "vqa")
    assert status == 2 and f"mindvl: error: {tmp_path}/manifest.json: missing" in err
    status, _, err = run(capsys, "deploy", vqa_package[1], "--servable-dir", tmp_path / "servables", "--name", "..")
    assert status == 2 and "mindvl: error: servable name '..': expected letters" in err
    assert not (tmp_path / "servables").exists() or not any((tmp_path / "servables").iterdir())


def test_a_misplaced_folder_is_one_clear_line_and_exit_2(vqa_package, tmp_path, capsys):
    """deploy into a file, serve a package, serve one servable's folder, serve an empty folder that is never
    polled: each a mistake named with its fix, never a traceback or a server serving nothing."""
    package = vqa_package[1]
    (tmp_path / "a_file").write_text("")
    status, _, err = run(capsys, "deploy", package, "--servable-dir", tmp_path / "a_file", "--name", "vqa")
    assert status == 2 and f"servable directory {tmp_path / 'a_file'}: a file, not a folder" in err
    status, _, err = run(capsys, "serve", "--servable-dir", package)
    assert status == 2 and f"servable_dir: {package} is a model package; deploy it" in err
    assert run(capsys, "deploy", package, "--servable-dir", tmp_path / "servables", "--name", "vqa")[0] == 0
    status, _, err = run(capsys, "serve", "--servable-dir", tmp_path / "servables" / "vqa")
    assert status == 2 and f"servable's folder (it holds servable_config.py); serve the directory of servables " \
                           f"above it: --servable-dir {(tmp_path / 'servables').resolve()}" in err
    (tmp_path / "empty").mkdir()
    status, _, err = run(capsys, "serve", "--servable-dir", tmp_path / "empty", "--poll-s", "0")
    assert status == 2 and "holds no servable (no <name>/servable_config.py) and poll_s is 0" in err
    assert "Traceback" not in err


def test_serve_refuses_a_config_with_an_unknown_key_naming_it(tmp_path, capsys):
    settings = tmp_path / "serve.yaml"
    settings.write_text("servable_dir: .\nmax_batch: 8\n")
    status, _, err = run(capsys, "serve", "--config", settings)
    assert status == 2 and f"mindvl: error: serve config {settings}: max_batch: unknown key; valid keys" in err
    assert "max_batch_size" in err
    status, _, err = run(capsys, "serve", "--servable-dir", tmp_path / "absent")
    assert status == 2 and f"servable_dir: {tmp_path / 'absent'} is not a folder" in err


def test_cascade_flags_are_checked_before_serving(deployed, vqa_package, tmp_path, capsys):
    for argv, message in (
            (["--cascade-threshold", "0.3"], "--cascade-threshold: needs --cascade-edge PKG"),
            (["--cascade-edge", tmp_path], f"--cascade-edge {tmp_path}: not a model package (no manifest.json)")):
        status, _, err = run(capsys, "serve", "--servable-dir", deployed, *argv)
        assert status == 2 and f"mindvl: error: {message}" in err and "Traceback" not in err
    two = tmp_path / "two"
    shutil.copytree(deployed, two)
    shutil.copytree(deployed / "vqa", two / "other")
    status, _, err = run(capsys, "serve", "--servable-dir", two, "--cascade-edge", vqa_package[1])
    assert status == 2 and "--cascade-servable: " in err and "holds 2 servables (other, vqa)" in err


def test_every_serve_setting_is_a_flag_that_overrides_the_file(tmp_path):
    """A ServeConfig field without a flag would be settable only from YAML; flags beat the file's values."""
    assert set(serving.SERVE_FLAGS) == {field.name for field in dataclasses.fields(ServeConfig)}
    settings = tmp_path / "serve.yaml"
    settings.write_text(yaml.safe_dump({"servable_dir": "from-file", "port": 1, "workers": 3, "strict_http": False}))
    args = build_parser().parse_args([
        "serve", "--config", str(settings), "--servable-dir", "d", "--host", "0.0.0.0", "--port", "0",
        "--grpc-port", "-1", "--max-batch-size", "4", "--max-wait-ms", "1.5", "--no-batching", "--max-request-mb",
        "2", "--max-instances", "5", "--timeout-s", "7", "--strict-http", "--poll-s", "0.5", "--key-env", "KEY"])
    assert serving._serve_config(args) == ServeConfig(
        servable_dir="d", host="0.0.0.0", port=0, grpc_port=-1, batching=False, max_batch_size=4, max_wait_ms=1.5,
        workers=3, max_request_mb=2.0, max_instances=5, timeout_s=7.0, strict_http=True, poll_s=0.5, key_env="KEY")
