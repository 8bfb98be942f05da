"""A native-resolution VLM's package (the tiny Qwen2.5-VL, exported) served live on 127.0.0.1: the real `openai`
client asks about two images in one message, a video file and a video's frames, and gets what the framework
generates for the same attachments; concurrent requests with different image counts get their answers alone;
what the package cannot take (too many patches, audio, a broken video) is a 400 naming it, and the server stays
up; images over a conversation's turns; structured output (JSON schema, choice, regex) on a model never trained
for it."""
import base64
import concurrent.futures
import json

import numpy as np
import openai
import pytest
from live import call

from mindvl.generation.native_generator import NativeGenerator

TOKENS = 8


@pytest.fixture(scope="module")
def served(native_package, tmp_path_factory):
    from mindvl.serving.serve_config import ServeConfig
    from mindvl.serving.servable import deploy
    from mindvl.serving.server import BackgroundServer

    folder, package = native_package
    servables = tmp_path_factory.mktemp("native_servables")
    deploy(package, servables, "qwen")
    config = ServeConfig(servable_dir=str(servables), port=0, grpc_port=0, poll_s=0, max_batch_size=8)
    with BackgroundServer(config) as server:
        client = openai.OpenAI(base_url=f"{server.rest_url}/v1", api_key="unused", max_retries=0, timeout=120)
        yield server, client, NativeGenerator.from_folder(folder, 256)


def picture(shade: int, size=(84, 112)) -> np.ndarray:
    """A picture with a square in a corner, so that each is its own."""
    pixels = np.full((*size, 3), shade, np.uint8)
    pixels[:28, :28] = 255 - shade
    return pixels


def data_url(pixels: np.ndarray) -> str:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ask(client, content, **settings):
    return client.chat.completions.create(model="qwen", max_tokens=TOKENS, extra_body={"ignore_eos": True},
                                          messages=[{"role": "user", "content": content}], **settings)


def framework(generator, question, **attachments):
    return generator.generate(generator.prompt(question, **attachments), max_new_tokens=TOKENS,
                              ignore_eos=True).text


def test_two_images_a_video_file_and_frames_answer_as_the_framework(served, video_file):
    server, client, generator = served
    first, second = picture(40), picture(200, (112, 84))
    two = ask(client, [{"type": "image_url", "image_url": {"url": data_url(first)}},
                       {"type": "image_url", "image_url": {"url": data_url(second)}},
                       {"type": "text", "text": "which differs?"}])
    assert two.choices[0].message.content == framework(generator, "which differs?", images=[first, second])
    assert two.usage.completion_tokens == TOKENS
    frames = np.stack([picture(shade) for shade in (30, 60, 90, 120, 150, 180, 210, 240)])
    path = video_file(frames, fps=4)  # 2 s, sampled at 2 fps: 4 frames, 2 temporal patches
    clip = ask(client, [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,"
                                                                   + base64.b64encode(path.read_bytes()).decode()}},
                        {"type": "text", "text": "what happens?"}])
    assert clip.choices[0].message.content == framework(generator, "what happens?", video=str(path))
    listed = ask(client, [{"type": "video", "video": [data_url(f) for f in frames[:4]]},
                          {"type": "text", "text": "what happens?"}])
    assert listed.choices[0].message.content == framework(generator, "what happens?", video=list(frames[:4]))


def test_concurrent_requests_with_different_image_counts_get_their_answers_alone(served):
    server, client, generator = served
    contents = [[{"type": "image_url", "image_url": {"url": data_url(picture(shade))}}] * count
                + [{"type": "text", "text": f"question {count}"}] for count, shade in ((0, 0), (1, 50), (2, 90), (1, 160))]
    alone = [ask(client, content).choices[0].message.content for content in contents]
    with concurrent.futures.ThreadPoolExecutor(len(contents)) as pool:
        together = list(pool.map(lambda content: ask(client, content).choices[0].message.content, contents))
    assert together == alone


@pytest.mark.parametrize("content, message", [
    ([{"type": "image_url", "image_url": {"url": data_url(np.full((196, 196, 3), 9, np.uint8))}}] * 3,
     "768 patches laid out, more than the 512"),
    ([{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, {"type": "text", "text": "q"}],
     "audio: this model reads images and video"),
    ([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}], "is not a readable video"),
    ([{"type": "image_url", "image_url": {"url": data_url(np.zeros((2, 600, 3), np.uint8))}}],
     "sides more than 200:1"),
])
def test_what_the_package_cannot_take_is_a_400_naming_it(served, content, message):
    server, client, _ = served
    with pytest.raises(openai.BadRequestError, match=message):
        ask(client, content)
    assert call(f"{server.rest_url}/health", method="GET")[0] == 200


def test_images_in_earlier_turns_bind_in_order_as_the_framework_lays_them_out(served):
    """Several images over a conversation: the first turn's and the question's, bound in order, the history's
    answer read; the server's tokens equal the framework's for the same history (the Python API's `history`)."""
    server, client, generator = served
    first, second = picture(40), picture(200, (112, 84))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(first)}},
                                             {"type": "text", "text": "what is this?"}]},
                {"role": "assistant", "content": "a square"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(second)}},
                                             {"type": "text", "text": "and this?"}]}]
    answer = client.chat.completions.create(model="qwen", max_tokens=TOKENS, extra_body={"ignore_eos": True},
                                            messages=messages)
    history = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]},
               {"role": "assistant", "content": "a square"}]
    ours = generator.generate(generator.prompt("and this?", images=[first, second], history=history),
                              max_new_tokens=TOKENS, ignore_eos=True)
    assert answer.choices[0].message.content == ours.text
    assert answer.usage.prompt_tokens == ours.prompt_tokens
    alone = ask(client, [{"type": "image_url", "image_url": {"url": data_url(second)}},
                         {"type": "text", "text": "and this?"}])
    assert alone.usage.prompt_tokens < answer.usage.prompt_tokens


SCHEMA = {"type": "object", "properties": {"shape": {"type": "string", "enum": ["circle", "square", "triangle"]},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["shape", "count"], "additionalProperties": False}


def test_structured_output_parses_and_validates_on_a_model_never_trained_for_it(served):
    """The tiny random Qwen2.5-VL writes JSON that validates against a strict schema, one of the given choices and
    text that a regex matches, sampled or greedy; the framework's generation under the same grammar gives the same
    tokens; a schema the library cannot compile is a 400 with its message."""
    import re

    import jsonschema

    from mindvl.engine.grammar import Grammar

    server, client, generator = served
    content = [{"type": "image_url", "image_url": {"url": data_url(picture(70))}},
               {"type": "text", "text": "describe it as JSON"}]
    messages = [{"role": "user", "content": content}]
    for settings in ({}, {"temperature": 1.0, "seed": 3}):
        answer = client.chat.completions.create(model="qwen", max_tokens=48, messages=messages, response_format={
            "type": "json_schema", "json_schema": {"name": "shape", "schema": SCHEMA, "strict": True}}, **settings)
        assert answer.choices[0].finish_reason == "stop", answer
        jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)
    ours = generator.generate(generator.prompt("describe it as JSON", images=[picture(70)]), max_new_tokens=48,
                              grammar=Grammar("json_schema", SCHEMA))
    greedy = client.chat.completions.create(model="qwen", max_tokens=48, messages=messages, response_format={
        "type": "json_schema", "json_schema": {"name": "shape", "schema": SCHEMA, "strict": True}})
    assert greedy.choices[0].message.content == ours.text
    anything = client.chat.completions.create(model="qwen", max_tokens=64, messages=messages,
                                              response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":  # an object the token budget could close
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    assert anything.choices[0].message.content.startswith("{")
    choice = client.chat.completions.create(model="qwen", max_tokens=8, messages=messages, temperature=1.0, seed=1,
                                            extra_body={"guided_choice": ["yes", "no", "maybe not"]})
    assert choice.choices[0].message.content in ("yes", "no", "maybe not")
    code = client.chat.completions.create(model="qwen", max_tokens=16, messages=messages,
                                          extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", code.choices[0].message.content)
    with pytest.raises(openai.BadRequestError, match="Pointer '/nope' does not exist") as raised:
        client.chat.completions.create(model="qwen", max_tokens=8, messages=messages, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}})
    assert raised.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="unclosed character class"):
        client.chat.completions.create(model="qwen", max_tokens=8, messages=messages,
                                       extra_body={"guided_regex": "[0-9"})
    assert call(f"{server.rest_url}/health", method="GET")[0] == 200
