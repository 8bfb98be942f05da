"""Versions on a live server: a package with other weights deployed and loaded while requests run takes
over atomically with no failed request, pinned requests keep their version until it is unloaded, versions
that cannot load (tampered, broken servable_config.py, encrypted without the key) leave the serving one in
place with the reason in /servables, /ready follows the loads, and nothing outside the directory is served."""
import asyncio
import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest
from conftest import small_classifier_config, untrained_model
from live import ADMIN_ENV, admin, b64, call, config, grpc_predict, predict, rest_inputs, vqa_inputs

from mindvl.data.reading.examples import query_examples
from mindvl.export.package_writer import write_package
from mindvl.package_reader import read_manifest
from mindvl.serving import grpc_protocol as G
from mindvl.serving.catalog import Catalog
from mindvl.serving.servable import CONFIG_FILE, config_text, deploy
from mindvl.serving.server import BackgroundServer

KEY = bytes(range(32))
FLOAT_TOLERANCE = 1e-5  # the same version answers within this whatever batch a request ran in
PATIENCE_S = 120  # how long a wait for the server may last before the test fails instead of hanging


@pytest.fixture(scope="module")
def examples(vqa_package):
    return query_examples(vqa_package[0].data.root)


@pytest.fixture(scope="module")
def reseeded_package(small_model, tmp_path_factory):
    """The vqa graph of the same small model built from another seed: other weights than the session package,
    the same preprocessing, tokenizer and labels, so it deploys as another version of the same servable."""
    cfg, model, record = untrained_model(small_classifier_config(small_model[0].data.root, "train.seed=1"))
    return write_package(cfg, model, tmp_path_factory.mktemp("pkg") / "reseeded", record, progress=False,
                         graphs=["vqa"])


@pytest.fixture
def servables(vqa_package, reseeded_package, tmp_path):
    """Servable vqa with the config generated for a vqa-only package (predict only, one graph to load),
    version 1 being the session package."""
    folder = tmp_path / "servables"
    (folder / "vqa").mkdir(parents=True)
    (folder / "vqa" / CONFIG_FILE).write_text(config_text(read_manifest(reseeded_package), "vqa"))
    deploy(vqa_package[1], folder, "vqa")
    return folder


def wait_until(condition, what):
    """Poll `condition` until it holds; fail (rather than hang) after PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def servables_page(server):
    status, page = call(f"{server.rest_url}/servables", method="GET")
    assert status == 200
    return page["servables"]


def same_answers(got, reference):
    """Predict outputs (REST JSON or gRPC values) equal to `reference`: labels and texts exactly."""
    return len(got) == len(reference) and all(
        g["answer"] == r["answer"] and g["answer_text"] == r["answer_text"]
        and abs(float(g["confidence"]) - r["confidence"]) <= FLOAT_TOLERANCE for g, r in zip(got, reference))


def ask_until_stopped(server, protocol, version, instances, stop, phase, answers):
    """Send predict again and again; record (phase when sent, version that answered (gRPC; None over REST),
    outputs, the first failure or None) per answer."""
    while not stop.is_set():
        sent_in = phase[0]
        if protocol == "rest":
            path = f"/model/vqa/version/{version}:predict" if version else "/model/vqa:predict"
            _, answer = call(server.rest_url + path, {"instances": [rest_inputs(i) for i in instances]})
            outputs = answer.get("instances", [])
            failure = answer.get("error_msg") or next((r["error_msg"] for r in outputs if "error_msg" in r), None)
            answers.append((sent_in, None, outputs, failure))
        else:
            reply = grpc_predict(server, "vqa", "predict", instances, version)
            try:
                outputs = G.results_from_reply(reply)
            except G.RequestFailed as error:
                outputs = [error]
            failure = next((str(r) for r in outputs if isinstance(r, Exception)), None)
            answers.append((sent_in, reply.servable_spec.version_number, outputs, failure))


def test_a_new_version_takes_over_under_load_without_a_failed_request(servables, reseeded_package, examples):
    """Version 2 (other weights) is deployed and loaded while clients hammer the server: the default switches
    to it at once and for good, requests pinned to version 1 keep getting version 1 until it is unloaded,
    then read "not available"; no request fails on the way."""
    instances = [vqa_inputs(example, "typed") for example in examples[:2]]
    body = [rest_inputs(i) for i in instances]
    with BackgroundServer(config(servables, max_batch_size=4, admin_token_env=ADMIN_ENV)) as server:
        first = predict(server, "vqa/version/1:predict", body)
        phase, answers = ["v1 only"], {(protocol, version): [] for protocol in ("rest", "grpc") for version in (0, 1)}
        stops = {0: threading.Event(), 1: threading.Event()}
        threads = {key: threading.Thread(target=ask_until_stopped, args=(server, *key, instances, stops[key[1]],
                                                                          phase, answers[key]), daemon=True)
                   for key in answers}
        for thread in threads.values():
            thread.start()

        def answered(keys, sent_in):
            return all(sum(a[0] == sent_in for a in answers[key]) >= 3 for key in keys)

        try:
            wait_until(lambda: answered(answers, "v1 only"), "answers from version 1")
            deploy(reseeded_package, servables, "vqa")
            phase[0] = "loading 2"
            status, loaded = admin(server, "/servables/vqa/version/2:load")
            phase[0] = "2 loaded"
            assert status == 200 and loaded["state"]["default_version"] == 2
            second = predict(server, "vqa/version/2:predict", body)
            wait_until(lambda: answered(answers, "2 loaded"), "answers after the switch")
            stops[1].set()
            for key in [key for key in threads if key[1] == 1]:
                threads[key].join()
            phase[0] = "unloading 1"
            assert admin(server, "/servables/vqa/version/1:unload")[0] == 200
            phase[0] = "1 unloaded"
            wait_until(lambda: answered([key for key in answers if key[1] == 0], "1 unloaded"),
                       "answers after the unload")
        finally:
            for stop in stops.values():
                stop.set()
            for thread in threads.values():
                thread.join()
        pinned_rest = call(f"{server.rest_url}/model/vqa/version/1:predict", {"instances": body})
        pinned_grpc = grpc_predict(server, "vqa", "predict", instances, 1)
        state = servables_page(server)

    assert not same_answers(first, second)  # other weights: the switch is visible in the answers
    # the server answered while it loaded version 2 (not necessarily each client: on a loaded 2-core machine a
    # client's one request can outlast the load, which failed this test once)
    assert any(a[0] == "loading 2" for got in answers.values() for a in got)
    assert [a[3] for key in answers for a in answers[key] if a[3] is not None] == []
    for (protocol, version), got in answers.items():
        sent = [a[0] for a in got]
        if version == 1:
            assert all(same_answers(a[2], first) for a in got) and set(sent) <= {"v1 only", "loading 2", "2 loaded"}
        else:
            assert all(same_answers(a[2], second) for a in got if a[0] not in ("v1 only", "loading 2"))
            assert all(same_answers(a[2], first) or same_answers(a[2], second) for a in got)
        if protocol == "grpc":
            versions = [a[1] for a in got]
            assert versions == sorted(versions)  # never back to 1 once 2 answered
            assert {a[1] for a in got if a[0] == "v1 only"} == {1}
            assert {a[1] for a in got if a[0] not in ("v1 only", "loading 2")} == {version or 2}
    assert pinned_rest == (200, {"error_msg": "servable is not available: servable vqa version 1 is not loaded "
                                              "(loaded: 2)"})
    with pytest.raises(G.RequestFailed, match=r"servable vqa version 1 is not loaded \(loaded: 2\)"):
        G.results_from_reply(pinned_grpc)
    assert state == {"vqa": {"default_version": 2, "versions": {
        "1": {"status": "unloaded"}, "2": {"status": "loaded", "methods": ["predict"]}}}}


def install(package, folder):
    """Put a package's files at `folder` in one rename, as deploy does, without deploy's checks."""
    incoming = folder.with_name(f".incoming-{folder.name}")
    shutil.copytree(package, incoming)
    os.rename(incoming, folder)


def test_a_version_that_cannot_load_leaves_the_serving_one_in_place(servables, reseeded_package, examples,
                                                                    writable_copy, tmp_path):
    """The poller loads each new version folder (one asked for before it existed too): a tampered file or a
    broken servable_config.py fails that version with the reason in /servables while version 1 keeps
    answering; a good version then takes over."""
    body = [rest_inputs(vqa_inputs(example, "typed")) for example in examples[:2]]
    folder = servables / "vqa"
    with BackgroundServer(config(servables, max_batch_size=1, poll_s=0.05, admin_token_env=ADMIN_ENV)) as server:
        first = predict(server, "vqa:predict", body)
        status, answer = admin(server, "/servables/vqa/version/2:load")  # asked for too early
        assert status == 404 and "servable vqa: has no version 2 (it has 1)" in answer["error_msg"]
        # in the default (MindSpore Serving) mode too, an admin refusal carries its status: scripts can trust it
        status, answer = call(server.rest_url + "/servables/vqa/version/1:unload")
        assert status == 401 and "Authorization: Bearer" in answer["error_msg"]
        assert call(server.rest_url + "/model/nothere:generate", {"instances": [{"prompt": "hi"}]})[0] == 404
        assert call(server.rest_url + "/model/nothere:predict", {"instances": [{"question": "hi"}]})[0] == 200

        tampered = writable_copy(reseeded_package, tmp_path)
        graph = bytearray((tampered / "vqa.mindir").read_bytes())
        graph[len(graph) // 2] ^= 0xFF
        (tampered / "vqa.mindir").write_bytes(bytes(graph))
        install(tampered, folder / "2")
        wait_until(lambda: servables_page(server)["vqa"]["versions"].get("2", {}).get("status") == "failed",
                   "version 2 to fail")
        assert "vqa.mindir: sha256 differs from the manifest" in servables_page(server)["vqa"]["versions"]["2"]["error"]
        assert same_answers(predict(server, "vqa:predict", body), first)
        status, answer = admin(server, "/servables/vqa/version/2:load")
        assert status == 400 and "load servable vqa version 2: " in answer["error_msg"] and \
            "sha256 differs" in answer["error_msg"]

        good_config = (folder / CONFIG_FILE).read_text()
        (folder / CONFIG_FILE).write_text(good_config + "\ndef broken(:\n")
        install(reseeded_package, folder / "3")
        wait_until(lambda: servables_page(server)["vqa"]["versions"].get("3", {}).get("status") == "failed",
                   "version 3 to fail")
        assert "servable_config.py: SyntaxError" in servables_page(server)["vqa"]["versions"]["3"]["error"]
        assert same_answers(predict(server, "vqa:predict", body), first)

        (folder / CONFIG_FILE).write_text(good_config)
        deploy(reseeded_package, servables, "vqa")
        wait_until(lambda: servables_page(server)["vqa"]["default_version"] == 4, "version 4 to load")
        assert same_answers(predict(server, "vqa:predict", body), predict(server, "vqa/version/4:predict", body))
        assert not same_answers(predict(server, "vqa:predict", body), first)
        assert {version: entry["status"] for version, entry in servables_page(server)["vqa"]["versions"].items()} \
            == {"1": "loaded", "2": "failed", "3": "failed", "4": "loaded"}


def test_a_newest_version_that_cannot_load_at_start_leaves_the_newest_that_does_serving(
        vqa_package, writable_copy, tmp_path, caplog):
    """At start the newest version is tampered with: the server serves the version below it, says so, and
    reports the newest as failed, with no operator's :load needed."""
    folder = tmp_path / "servables"
    deploy(vqa_package[1], folder, "vqa")
    tampered = writable_copy(vqa_package[1], tmp_path)
    graph = bytearray((tampered / "vqa.mindir").read_bytes())
    graph[len(graph) // 2] ^= 0xFF
    (tampered / "vqa.mindir").write_bytes(bytes(graph))
    install(tampered, folder / "vqa" / "2")
    with caplog.at_level(logging.WARNING, logger="mindvl.serving"), \
            BackgroundServer(config(folder, max_batch_size=1, poll_s=0)) as server:
        page = servables_page(server)["vqa"]
        assert page["default_version"] == 1 and page["versions"]["1"]["status"] == "loaded"
        assert page["versions"]["2"]["status"] == "failed" and "sha256 differs" in page["versions"]["2"]["error"]
        assert len(predict(server, "vqa:embed_text", [{"text": "what shape is it"}])) == 1
    assert any("servable vqa: serving version 1, the newest that loads (version 2 did not: " in r.getMessage()
               for r in caplog.records)


def test_ready_answers_503_until_every_servable_on_disk_has_a_loaded_version(vqa_package, reseeded_package, tmp_path):
    """A load balancer sends nothing to a server that has nothing loaded, or not yet all it should serve."""
    folder = tmp_path / "servables"
    folder.mkdir()
    with BackgroundServer(config(folder, max_batch_size=1, admin_token_env=ADMIN_ENV)) as server:
        ready = f"{server.rest_url}/ready"
        assert call(f"{server.rest_url}/health", method="GET") == (200, {"status": "alive"})
        assert call(ready, method="GET") == (503, {"ready": False, "not_loaded": []})  # nothing to serve yet
        (folder / "vqa").mkdir()
        (folder / "vqa" / CONFIG_FILE).write_text(config_text(read_manifest(reseeded_package), "vqa"))
        deploy(vqa_package[1], folder, "vqa")
        assert call(ready, method="GET") == (503, {"ready": False, "not_loaded": ["vqa"]})
        assert admin(server, "/servables/vqa/version/1:load")[0] == 200
        assert call(ready, method="GET") == (200, {"ready": True, "not_loaded": []})


def test_only_servables_inside_the_directory_are_served(servables, deployed, vqa_package):
    """A servable folder that is a symlink to a servable elsewhere is neither loaded nor loadable, names with
    .. are refused, and the servables inside are listed and served as usual."""
    (servables / "outside").symlink_to(deployed / "vqa")
    with BackgroundServer(config(servables, max_batch_size=1, strict_http=True, admin_token_env=ADMIN_ENV)) as server:
        deploy(vqa_package[1], servables, "vqa")  # version 2 on disk, not loaded (no polling)
        url = server.rest_url
        text = {"instances": [{"text": "what shape is it"}]}
        assert call(f"{url}/model/outside:embed_text", text) == (404, {
            "error_msg": "servable is not available: servable 'outside' is not loaded (loaded: vqa)"})
        status, answer = admin(server, "/servables/outside/version/1:load")
        assert status == 400 and "outside the servable directory" in answer["error_msg"]
        for path in ("/model/..:predict", "/model/..%2Foutside:predict", "/model/vqa%2F..%2F..%2Foutside:predict"):
            status, answer = call(url + path, text)
            assert status in (400, 404) and "please check url" in answer["error_msg"], path
        status, answer = admin(server, "/servables/%2E%2E/version/1:load")
        assert status == 400 and "servable name '..': expected letters, digits" in answer["error_msg"]
        assert servables_page(server) == {"vqa": {"default_version": 1, "versions": {
            "1": {"status": "loaded", "methods": ["predict"]}, "2": {"status": "available"}}}}


@pytest.fixture(scope="module")
def encrypted_servables(small_model, vqa_package, tmp_path_factory):
    """enc: the image graph of the session model encrypted with KEY; plain: the same graph, unencrypted,
    from the session package (so both embed an image alike)."""
    cfg, model, record = small_model
    package = write_package(cfg, model, tmp_path_factory.mktemp("pkg") / "enc", record, key=KEY, progress=False,
                            graphs=["image_embed"])
    folder = tmp_path_factory.mktemp("servables")
    deploy(package, folder, "enc")
    (folder / "plain").mkdir()
    (folder / "plain" / CONFIG_FILE).write_text(config_text(read_manifest(package), "plain"))
    deploy(vqa_package[1], folder, "plain")
    return folder


def test_an_encrypted_package_is_served_with_its_key_from_a_file_or_the_environment(
        encrypted_servables, examples, tmp_path, monkeypatch):
    """Without the key (or with a wrong one) the version fails to load and says why; with it, from a file or an
    environment variable, the encrypted graph embeds as the unencrypted one does."""
    image = [{"image": b64(examples[0].image)}]
    (tmp_path / "key.hex").write_text(KEY.hex())
    monkeypatch.setenv("MINDVL_TEST_SERVING_KEY", KEY.hex())
    monkeypatch.setenv("MINDVL_TEST_WRONG_KEY", bytes(32).hex())
    with BackgroundServer(config(encrypted_servables, batching=False)) as keyless:
        plain = predict(keyless, "plain:embed_image", image)
        refused = call(f"{keyless.rest_url}/model/enc:embed_image", {"instances": image})
        enc = servables_page(keyless)["enc"]
    assert enc["default_version"] is None and enc["versions"]["1"]["status"] == "failed"
    assert "the package is encrypted (AES-GCM); pass the key with --key-file PATH or --key-env VAR" in \
        enc["versions"]["1"]["error"]
    assert refused == (200, {"error_msg": "servable is not available: servable 'enc' is not loaded (loaded: plain)"})

    with BackgroundServer(config(encrypted_servables, batching=False, key_env="MINDVL_TEST_WRONG_KEY")) as wrong:
        assert "wrong key?" in servables_page(wrong)["enc"]["versions"]["1"]["error"]
    for settings in ({"key_file": str(tmp_path / "key.hex")}, {"key_env": "MINDVL_TEST_SERVING_KEY"}):
        with BackgroundServer(config(encrypted_servables, batching=False, **settings)) as keyed:
            (embedded,) = predict(keyed, "enc:embed_image", image)
        np.testing.assert_allclose(embedded["embedding"], plain[0]["embedding"], atol=1e-6)


def test_a_refused_servable_is_warned_once_while_it_stays_refused(deployed, tmp_path, caplog):
    """Every poll finds a servable symlinked from outside the directory refused; the log says so when it
    appears (again after it went away and came back), not every poll_s seconds."""
    servables = tmp_path / "servables"
    servables.mkdir()
    link = servables / "outside"
    catalog = Catalog(servables, None, 1)

    async def polls(count: int) -> None:
        for _ in range(count):
            assert await catalog.refresh() == []

    with caplog.at_level(logging.WARNING, logger="mindvl.serving"):
        link.symlink_to(deployed / "vqa")
        asyncio.run(polls(3))
        link.unlink()
        asyncio.run(polls(1))
        link.symlink_to(deployed / "vqa")
        asyncio.run(polls(2))
    warned = [r.getMessage() for r in caplog.records if r.name == "mindvl.serving"]
    assert len(warned) == 2 and all("outside the servable directory" in message for message in warned)
    asyncio.run(catalog.close())
