"""The server's generation savings, live on 127.0.0.1: with --prefix-cache-mb and --speculative-tokens a
conversation's later turns, the same image asked again and repeating answers are generated from reused cache rows
and verified drafts, every answer token for token the plain server's (the session's generative_server), counted in
/metrics; the settings refused by name."""
import base64

import openai
import pytest
from live import b64, call, config, metrics, total

from mindvl.data.reading.examples import query_examples
from mindvl.errors import ConfigError
from mindvl.serving.server import BackgroundServer
from mindvl.serving.servable import deploy


@pytest.fixture(scope="module")
def saving_server(generative_package, tmp_path_factory):
    servables = tmp_path_factory.mktemp("reuse_servables")
    deploy(generative_package[1], servables, "vlm")
    with BackgroundServer(config(servables, max_batch_size=4, prefix_cache_mb=64, speculative_tokens=5)) as server:
        yield server


def _answers(server, requests):
    client = openai.OpenAI(base_url=f"{server.rest_url}/v1", api_key="unused", max_retries=0, timeout=120)
    return [client.chat.completions.create(model="vlm", **request).choices[0] for request in requests]


def _image(example):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(example.image).decode()}}


def test_reused_prefixes_and_verified_drafts_give_the_plain_servers_answers(saving_server, generative_server,
                                                                             generative_package):
    examples = query_examples(generative_package[0].data.root)[:3]
    system = {"role": "system", "content": "Answer about the picture in a few words."}
    first = [system, {"role": "user", "content": [_image(examples[0]), {"type": "text", "text": examples[0].question}]}]
    requests = [{"messages": first},
                {"messages": first + [{"role": "assistant", "content": "a picture"},
                                      {"role": "user", "content": "and what else?"}]},  # the earlier turn reused
                {"messages": [system, {"role": "user", "content": [_image(examples[0]), {"type": "text",
                                                                                         "text": "what is it?"}]}]},
                {"messages": [system, {"role": "user", "content": [_image(examples[1]), {"type": "text",
                                                                                         "text": "what is it?"}]}]},
                {"messages": first, "temperature": 0.9, "seed": 5}]
    requests = [{"max_tokens": 20, "extra_body": {"ignore_eos": True}, **r} for r in requests]
    plain = _answers(generative_server, requests)
    saved = _answers(saving_server, requests)
    assert [c.message.content for c in saved] == [c.message.content for c in plain]
    rest = [{"image": b64(examples[2].image), "text": examples[2].question, "max_tokens": 20, "ignore_eos": True}] * 2
    answers = [call(f"{server.rest_url}/model/vlm:generate", {"instances": rest})[1]["instances"]
               for server in (generative_server, saving_server)]
    assert [a["tokens"] for a in answers[1]] == [a["tokens"] for a in answers[0]]
    counted = metrics(saving_server)
    labels = {"servable": "vlm", "version": "1"}
    assert total(counted, "mindvl_generation_prefix_cache_hits_total", **labels) >= 4
    assert total(counted, "mindvl_generation_prefix_reused_tokens_total", **labels) > 4 * 8
    accepted = total(counted, "mindvl_generation_speculative_accepted_tokens_total", **labels)
    assert total(counted, "mindvl_generation_speculative_drafted_tokens_total", **labels) >= accepted > 0
    assert total(metrics(generative_server), "mindvl_generation_prefix_cache_hits_total") == 0  # off by default


@pytest.mark.parametrize("setting, value, match", [
    ("prefix_cache_mb", -1, "prefix_cache_mb: expected a number >= 0"),
    ("speculative_tokens", -2, "speculative_tokens: expected a number >= 0")])
def test_a_bad_setting_is_refused_by_name(tmp_path, setting, value, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, **{setting: value}).validate()


def test_more_drafts_than_the_packages_step_holds_fail_the_version_by_name(generative_package, tmp_path):
    deploy(generative_package[1], tmp_path, "vlm")
    with BackgroundServer(config(tmp_path, speculative_tokens=8)) as server:
        reason = server.catalog.failed[("vlm", 1)]
    assert "speculative_tokens: expected 1..7" in reason
