"""A native-resolution VLM's package (the tiny Qwen2.5-VL, exported) served live on 127.0.0.1: the real `openai`
client asks about two images in one message, a video file and a video's frames, and gets what the framework
generates for the same attachments; concurrent requests with different image counts get their answers alone;
what the package cannot take (too many patches, audio, a broken video) is a 400 naming it, and the server stays
up."""
import base64
import concurrent.futures

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
