"""A gray release on a live server: a servable's two loaded versions share its default traffic by weight (the
split within a tolerance over many requests, each version counted in /metrics), a client key (the X-Client-Key
header, gRPC's x-client-key metadata, OpenAI's `user`) stays on one version, switching the weights while clients
run loses no request, and the admin route refuses what it cannot do by name."""
import concurrent.futures
import os
import threading

import openai
import pytest
from live import ADMIN_ENV, admin, call, config, grpc_predict, metrics, rest_inputs, total, vqa_inputs

from mindvl.data.reading.examples import query_examples
from mindvl.serving.servable import deploy
from mindvl.serving.server import BackgroundServer

REQUESTS = 400
TOLERANCE = 0.07  # 3.5 standard deviations of a 20% share over 400 draws


@pytest.fixture(scope="module")
def server(vqa_package, tmp_path_factory):
    """`vqa` deployed twice (versions 1 and 2, the same package), both loaded, admin endpoints on."""
    servables = tmp_path_factory.mktemp("gray")
    for _ in range(2):
        deploy(vqa_package[1], servables, "vqa")
    with BackgroundServer(config(servables, admin_token_env=ADMIN_ENV)) as running:
        status, answer = admin(running, "/servables/vqa/version/1:load")  # the server loads the newest only
        assert status == 200, answer
        yield running


@pytest.fixture(scope="module")
def body(vqa_package):
    example = query_examples(vqa_package[0].data.root)[0]
    return {"instances": [rest_inputs(vqa_inputs(example, "typed"))]}


def traffic(server, weights, token=None):
    token = os.environ[ADMIN_ENV] if token is None else token
    return call(f"{server.rest_url}/servables/vqa:traffic", {"weights": weights},
                headers={"Authorization": f"Bearer {token}"})


def routed(server):
    samples = metrics(server)
    return {version: total(samples, "mindvl_version_requests_total", servable="vqa", version=version)
            for version in ("1", "2")}


def ask(server, body, key=None):
    status, answer = call(f"{server.rest_url}/model/vqa:predict", body, headers={"X-Client-Key": key} if key else {})
    assert status == 200 and "error_msg" not in answer["instances"][0], answer
    return answer


def test_the_default_traffic_splits_by_weight_and_each_version_is_counted(server, body):
    before = routed(server)
    ask(server, body)
    after = routed(server)
    assert (after["1"] - before["1"], after["2"] - before["2"]) == (0, 1)  # no split: the newest takes it all
    status, answer = traffic(server, {"1": 80, "2": 20})
    assert status == 200 and answer["traffic"] == {"1": 80, "2": 20}
    assert call(f"{server.rest_url}/servables", method="GET")[1]["servables"]["vqa"]["traffic"] == {"1": 80, "2": 20}
    before = routed(server)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: ask(server, body), range(REQUESTS)))
    after = routed(server)
    counts = {version: after[version] - before[version] for version in after}
    assert sum(counts.values()) == REQUESTS
    assert abs(counts["2"] / REQUESTS - 0.2) < TOLERANCE, counts
    assert call(f"{server.rest_url}/model/vqa/version/2:predict", body)[0] == 200  # a pinned version is its own
    assert traffic(server, {})[1]["traffic"] is None


def test_a_client_key_stays_on_one_version_on_every_door(server, body, vqa_package):
    assert traffic(server, {"1": 50, "2": 50})[0] == 200
    drawn = {key: {server.catalog.get("vqa", 0, key).version for _ in range(5)} for key in map(str, range(200))}
    assert all(len(versions) == 1 for versions in drawn.values())
    share = sum(versions == {2} for versions in drawn.values()) / len(drawn)
    assert abs(share - 0.5) < 0.15, share
    # raising the new version's weight only moves clients onto it
    assert traffic(server, {"1": 20, "2": 80})[0] == 200
    assert all(server.catalog.get("vqa", 0, key).version == 2 for key, versions in drawn.items() if versions == {2})
    for door in ("rest", "grpc", "openai"):
        before = routed(server)
        for _ in range(6):
            if door == "rest":
                ask(server, body, key="client-17")
            elif door == "grpc":
                example = query_examples(vqa_package[0].data.root)[0]
                reply = grpc_predict(server, "vqa", "predict", [vqa_inputs(example, "typed")],
                                     metadata=(("x-client-key", "client-17"),))
                assert not reply.error_msg, reply.error_msg
            else:
                client = openai.OpenAI(base_url=f"{server.rest_url}/v1", api_key="unused", max_retries=0)
                client.embeddings.create(model="vqa", input="a red circle", user="client-17")
        after = routed(server)
        assert sorted(after[v] - before[v] for v in after) == [0, 6], (door, before, after)
    assert traffic(server, {})[0] == 200


def test_switching_the_weights_under_load_loses_no_request(server, body):
    failures, answered, stop = [], [0], threading.Event()

    def client():
        while not stop.is_set():
            status, answer = call(f"{server.rest_url}/model/vqa:predict", body)
            if status != 200 or "error_msg" in answer["instances"][0]:
                failures.append(answer)
            answered[0] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for weights in ({"1": 100}, {"2": 100}, {"1": 50, "2": 50}, {}, {"1": 1, "2": 3}, {}) * 2:
            assert traffic(server, weights)[0] == 200
            threading.Event().wait(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures and answered[0] > 20


@pytest.mark.parametrize("weights, token, status, message", [
    ({"3": 10}, None, 404, "version 3 is not loaded"),
    ({"1": -1}, None, 400, "weight must be a finite number >= 0"),
    ({"1": 0, "2": 0}, None, 400, "every weight is 0"),
    ({"x": 1}, None, 400, "version 'x': expected 1.."),
    ({"1": 1}, "wrong", 401, "Authorization: Bearer"),
])
def test_what_the_traffic_route_cannot_do_is_refused_by_name(server, weights, token, status, message):
    code, answer = traffic(server, weights, token)
    assert code == status and message in answer["error_msg"], answer
    assert server.catalog.traffic.get("vqa") is None  # nothing half set
