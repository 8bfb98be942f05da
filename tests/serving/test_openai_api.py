"""The OpenAI chat request's reading, without a server: every OpenAI field the server does not do is refused by
name unless at the value that asks for nothing, the conversation becomes a generate instance (history with
markers where the attachments sat), and structured output maps to one grammar."""
import base64
import json

import pytest

from mindvl.serving import openai_api as O

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode()


def body(**fields):
    return json.dumps({"model": "vlm", "messages": [{"role": "user", "content": "q"}], **fields}).encode()


@pytest.mark.parametrize("name", sorted(O.NOT_DONE))
def test_every_field_the_server_does_not_do_is_refused_by_name_unless_neutral(name):
    with pytest.raises(O.OpenAIError) as raised:
        O.parse_chat(body(**{name: {"asks": "something"}}))
    assert raised.value.param == name and raised.value.code == "unsupported_parameter"
    for neutral in O.NOT_DONE[name]:
        O.parse_chat(body(**{name: neutral}))
    O.parse_chat(body(**{name: None}))


def test_a_conversation_becomes_history_and_attachments_in_order():
    chat = O.parse_chat(body(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}, {"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "c"}, {"type": "image_url", "image_url": {"url": PNG}}]}]))
    assert chat.instance["history"] == [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]}]
    assert chat.instance["text"] == "c" and len(chat.instance["images"]) == 2


@pytest.mark.parametrize("fields, grammar, field", [
    ({"response_format": {"type": "json_object"}}, {"type": "json_object"}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}},
     {"type": "json_schema", "value": {"type": "integer"}}, "response_format"),
    ({"guided_json": '{"type": "integer"}'}, {"type": "json_schema", "value": {"type": "integer"}}, "guided_json"),
    ({"guided_regex": "[0-9]+"}, {"type": "regex", "value": "[0-9]+"}, "guided_regex"),
    ({"guided_choice": ["a", "b"]}, {"type": "choice", "value": ["a", "b"]}, "guided_choice"),
    ({"response_format": {"type": "text"}}, None, None),
])
def test_structured_output_maps_to_one_grammar(fields, grammar, field):
    chat = O.parse_chat(body(**fields))
    assert chat.instance.get("grammar") == grammar and chat.grammar_field == field


@pytest.mark.parametrize("fields, match", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "x"}, "guided_regex: one structured output"),
    ({"response_format": {"type": "json_schema"}}, "json_schema needs"),
    ({"response_format": {"type": "yaml"}}, "type 'yaml' is not supported"),
    ({"top_logprobs": 3}, "top_logprobs: needs logprobs"),
    ({"n": 0}, r"n: expected an integer in \[1, 8\]"),
    ({"logprobs": "yes"}, "logprobs: expected true or false"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "the last message must be the user's"),
])
def test_what_cannot_be_read_is_refused_by_name(fields, match):
    with pytest.raises(O.OpenAIError, match=match):
        O.parse_chat(body(**fields))
