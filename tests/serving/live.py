"""Helpers of the live-server tests (test_server, test_versions, test_fuzz, test_hostile): settings on free ports,
a urllib REST call that returns a 4xx/5xx answer instead of raising it, an admin call with the test token, a raw
gRPC predict, the request values of a test example, and /metrics as numbers."""
import base64
import json
import os
import secrets
import urllib.error
import urllib.request

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from mindvl.serving import grpc_protocol as G
from mindvl.serving.serve_config import ServeConfig

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, never through a proxy
ADMIN_ENV = "MINDVL_TEST_ADMIN_TOKEN"  # config(..., admin_token_env=ADMIN_ENV) turns the admin endpoints on
os.environ.setdefault(ADMIN_ENV, secrets.token_hex(16))


def config(servable_dir, **settings) -> ServeConfig:
    """Free ports on 127.0.0.1 and no directory polling unless asked: tests decide when versions change."""
    return ServeConfig(servable_dir=str(servable_dir), port=0, grpc_port=0, poll_s=settings.pop("poll_s", 0),
                       **settings)


def call(url, body=None, method="POST", headers=None):
    """(HTTP status, decoded JSON answer); `body`: bytes as they are, anything else as JSON."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    try:
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        with OPENER.open(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def admin(server, path):
    """POST the admin URL `path` with the test token (the server's config names ADMIN_ENV)."""
    return call(server.rest_url + path, headers={"Authorization": f"Bearer {os.environ[ADMIN_ENV]}"})


def predict(server, path, instances):
    """POST {"instances": instances} to /model/<path> of a server that must answer it; -> the reply's instances."""
    status, answer = call(f"{server.rest_url}/model/{path}", {"instances": instances})
    assert status == 200 and "instances" in answer, answer
    return answer["instances"]


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode("ascii")}


def grpc_predict(server, servable, method, instances, version=0, metadata=()):
    """The PredictReply to a PredictRequest built from `instances` ({name: numpy / str / bytes} each)."""
    return grpc_raw(server, G.instances_to_request(servable, method, version, instances), metadata)


def grpc_raw(server, request, metadata=()):
    """The PredictReply to `request` as it is (malformed ones included); `metadata`: the call's (key, value)s."""
    with grpc.insecure_channel(server.grpc_target) as channel:
        return G.predict_stub(channel)(request, timeout=120, metadata=metadata or None)


QUESTION_MODES = ("typed", "spoken", "both")


def vqa_inputs(example, mode):
    """predict's inputs for a test example, as gRPC values: the question typed, spoken (WAV) or both."""
    return {"image": example.image, "question": "" if mode == "spoken" else example.question,
            "audio": b"" if mode == "typed" else example.audio}


def rest_inputs(inputs):
    """gRPC-style values as REST JSON: bytes as {"b64"}, arrays as nested lists, str as they are."""
    return {name: b64(value) if isinstance(value, bytes) else value.tolist() if isinstance(value, np.ndarray)
            else value for name, value in inputs.items()}


def metrics(server):
    """Every sample of /metrics: {(sample name, ((label, value), ...)): value}."""
    with OPENER.open(f"{server.rest_url}/metrics", timeout=60) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def total(samples, name, **labels):
    """The sum of the /metrics samples called `name` whose labels include `labels`."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and set(labels.items()) <= set(sample_labels))
