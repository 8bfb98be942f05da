"""The demo page of `mindvl serve`, in a real headless Chromium (the distribution's chromium and chromedriver,
driven by selenium) against a live server: a typed question to the classifier, a generative answer streamed in, a
spoken question through Chromium's fake microphone (a WAV file), the edge-cloud cascade, and the page's messages
for a server error, a too large image and a denied microphone. Each answer shown must equal the REST answer to
the same request. Screenshots at desktop and phone width are written to test-artifacts/demo/ (MINDVL_ARTIFACTS
overrides the folder).

Without a Chromium the browser tests skip, saying how to install one (`.ci/run` installs it); the server-side
tests (the page's files, --no-demo, /cascade's errors) run everywhere."""
import base64
import contextlib
import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from live import b64, call, config
from PIL import Image

from mindvl.data.reading.examples import query_examples
from mindvl.lite.cascade import Cascade
from mindvl.lite.device import DevicePipeline
from mindvl.serving.server import BackgroundServer
from mindvl.serving.servable import deploy

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("MINDVL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")) / "demo"
DESKTOP, PHONE = (1280, 900), (390, 844)  # CSS pixels: a laptop, and a phone's portrait width
REQUEST_MB = 1.0  # the server's --max-request-mb: small, so that a too large image is cheap to make
WAIT_S = 120
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no Chromium here: install the distribution's chromium and chromium-driver (`apt-get install chromium "
           "chromium-driver`; .ci/run does) to run the demo page's browser tests")


@pytest.fixture(scope="module")
def examples(vqa_package):
    return query_examples(vqa_package[0].data.root)[:3]


@pytest.fixture(scope="module")
def server(vqa_package, generative_package, tmp_path_factory):
    """A classifier (vqa) and a generative servable (vlm) served with the demo page, and the cascade whose edge
    is the vqa package on this machine and whose cloud is this server's vqa."""
    servables = tmp_path_factory.mktemp("demo_servables")
    deploy(vqa_package[1], servables, "vqa")
    deploy(generative_package[1], servables, "vlm")
    with BackgroundServer(config(servables, max_batch_size=4, max_request_mb=REQUEST_MB)) as live:
        live.attach_cascade(Cascade(DevicePipeline(vqa_package[1], "graphcell"), live.rest_url, threshold=0.5,
                                    servable="vqa"))
        yield live


@contextlib.contextmanager
def browser(*flags):
    """A headless Chromium as a test machine runs it (no network beyond the loopback, a fresh profile), quit on
    leaving the block."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--window-size={DESKTOP[0]},{DESKTOP[1]}", *flags):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """The browser most tests share: a fake microphone, whose permission is not granted unless asked."""
    profile = tmp_path_factory.mktemp("chromium")
    with browser(f"--user-data-dir={profile}", "--use-fake-device-for-media-stream") as chrome:
        yield chrome


@pytest.fixture(scope="module")
def image_file(examples, tmp_path_factory):
    path = tmp_path_factory.mktemp("demo_inputs") / "question.png"
    path.write_bytes(examples[0].image)
    return path


def by_id(driver, element_id):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def wait(driver, condition, seconds=WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, seconds, poll_frequency=0.05).until(condition)


def open_page(driver, server, servable):
    from selenium.webdriver.support.ui import Select

    driver.get(server.rest_url + "/")
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true")
    Select(by_id(driver, "servable")).select_by_value(servable)


def answered(driver):
    """Wait for the answer (or the error) -> (answer text, page's data-state)."""
    wait(driver, lambda d: by_id(d, "answer").get_attribute("data-state") in ("done", "error"))
    return by_id(driver, "answer").text, by_id(driver, "answer").get_attribute("data-state")


def percent(value):
    return f"{100 * value:.1f}%"


def screenshot(driver, name):
    """The whole page at desktop and phone width -> the two PNGs (test artifacts)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    paths = []
    for label, (width, height) in (("desktop", DESKTOP), ("phone", PHONE)):
        driver.set_window_size(width, height)
        full = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, max(height, full + 120))
        driver.execute_script("window.scrollTo(0, 0)")
        path = ARTIFACTS / f"{name}-{label}.png"
        driver.save_screenshot(str(path))
        paths.append(path)
    driver.set_window_size(*DESKTOP)
    return paths


def rest_predict(server, instance):
    status, reply = call(f"{server.rest_url}/model/vqa:predict", {"instances": [instance]})
    assert status == 200 and "error_msg" not in reply["instances"][0], reply
    return reply["instances"][0]


# ---- the page's files and switches (no browser needed) --------------------------------------------------

def test_page_files_settings_and_no_demo(server, deployed):
    status, settings = call(server.rest_url + "/demo/settings", method="GET")
    assert status == 200 and settings["max_request_mb"] == REQUEST_MB
    assert settings["cascade"] == {"edge": "vqa", "method": "predict", "servable": "vqa", "threshold": 0.5}
    import urllib.request
    for path, kind in (("/", "text/html"), ("/demo/demo.js", "application/javascript"), ("/demo/demo.css", "text/css")):
        with urllib.request.urlopen(server.rest_url + path, timeout=30) as response:
            assert response.headers["Content-Type"].startswith(kind)
            body = response.read()
        # nothing is fetched from elsewhere: no script, style, image or request names another origin
        assert body and not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//|fetch\(\s*["'`](https?:)?//|@import""",
                                      body)
    with BackgroundServer(config(deployed, demo=False)) as plain:
        status, reply = call(plain.rest_url + "/", method="GET")
        assert "is not served" in reply["error_msg"] and "demo page" not in reply["error_msg"]
        status, reply = call(plain.rest_url + "/cascade", {"instances": [{"image": b64(b"x")}]})
        assert "--cascade-edge PKG" in reply["error_msg"]


def test_cascade_endpoint_refuses_bad_instances(server, examples):
    status, reply = call(server.rest_url + "/cascade", {"instances": [{"image": b64(examples[0].image),
                                                                       "prompt": "what?"}]})
    assert "input 'prompt'" in reply["error_msg"] and "image, question, audio" in reply["error_msg"]
    status, reply = call(server.rest_url + "/cascade", {"instances": [{"image": b64(b"not an image"),
                                                                       "question": "what shape is it?"}]})
    assert "image" in reply["error_msg"] and "PNG" in reply["error_msg"]
    status, reply = call(server.rest_url + "/cascade", method="GET")
    assert "only support POST" in reply["error_msg"]


# ---- in the browser ---------------------------------------------------------------------------------

@needs_chromium
def test_typed_question_by_keyboard_equals_rest(server, driver, examples, image_file):
    from selenium.webdriver.common.keys import Keys

    open_page(driver, server, "vqa")
    unlabelled = driver.execute_script(
        "return [...document.querySelectorAll('input, select, button')].filter(e => !e.hidden && !e.closest('[hidden]')"
        " && !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim()).map(e => e.id)")
    assert unlabelled == []  # every control has a name a screen reader can say
    by_id(driver, "image").send_keys(str(image_file))
    wait(driver, lambda d: by_id(d, "image-hint").text)  # the image is read and previewed
    question = by_id(driver, "question")
    question.send_keys(examples[0].question)
    question.send_keys(Keys.ENTER)  # the form submits from the keyboard
    answer, state = answered(driver)
    rest = rest_predict(server, {"image": b64(examples[0].image), "question": examples[0].question,
                                 "audio": b64(b"")})
    assert state == "done" and answer == rest["answer"]
    assert by_id(driver, "confidence").text == percent(rest["confidence"])
    assert by_id(driver, "generated").text == rest["answer_text"]
    assert by_id(driver, "answered-model").text == "vqa, version 1"
    for path in screenshot(driver, "classifier"):
        with Image.open(path) as shot:
            assert shot.format == "PNG" and shot.width in (DESKTOP[0], PHONE[0])
    # at phone width nothing is wider than the screen
    driver.set_window_size(*PHONE)
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    driver.set_window_size(*DESKTOP)


@needs_chromium
def test_generative_answer_streams_in_and_equals_rest(server, driver, examples, image_file):
    open_page(driver, server, "vlm")
    assert not by_id(driver, "generation-settings").get_attribute("hidden")
    by_id(driver, "image").send_keys(str(image_file))
    by_id(driver, "question").send_keys(examples[0].question)
    tokens = by_id(driver, "max-tokens")
    tokens.clear()
    tokens.send_keys("12")
    by_id(driver, "ask").click()
    answer, state = answered(driver)
    status, reply = call(f"{server.rest_url}/model/vlm:generate", {"instances": [
        {"image": b64(examples[0].image), "text": examples[0].question, "max_tokens": 12}]})
    rest = reply["instances"][0]
    assert state == "done" and answer == rest["text"].strip() and answer
    # one event per token, each shown as it came; the confidence is exp(mean log-probability), as the cascade's
    assert int(by_id(driver, "answer").get_attribute("data-tokens")) == rest["completion_tokens"]
    assert by_id(driver, "confidence").text == percent(np.exp(rest["mean_logprob"]))
    screenshot(driver, "generative")


@needs_chromium
def test_a_follow_up_question_reads_the_conversation_as_rest_with_its_history(server, driver, examples, image_file):
    """The page keeps the exchanges about the chosen image and sends them as `history`: the follow-up's answer is
    REST's for the same history (the image in the first turn), the conversation is listed, a new image starts a
    new one."""
    open_page(driver, server, "vlm")
    by_id(driver, "image").send_keys(str(image_file))
    questions = [examples[0].question, "and what shape is it?"]
    answers = []
    for question in questions:
        field = by_id(driver, "question")
        field.clear()
        field.send_keys(question)
        by_id(driver, "ask").click()
        answers.append(answered(driver)[0])
    history = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": questions[0]}]},
               {"role": "assistant", "content": answers[0]}]
    status, reply = call(f"{server.rest_url}/model/vlm:generate", {"instances": [
        {"image": b64(examples[0].image), "text": questions[1], "max_tokens": 32, "history": json.dumps(history)}]})
    assert answers[1] == reply["instances"][0]["text"].strip()
    items = driver.find_elements("css selector", "#conversation li")
    assert [item.find_element("css selector", ".asked").text for item in items] == questions
    assert not by_id(driver, "conversation-section").get_attribute("hidden")
    by_id(driver, "new-conversation").click()
    assert not driver.find_elements("css selector", "#conversation li")
    assert by_id(driver, "conversation-section").get_attribute("hidden")


@needs_chromium
def test_spoken_question_from_a_fake_microphone(server, examples, image_file, tmp_path):
    """Chromium's fake capture device plays the test clip as the microphone; the page records it, trims its silent
    ends and sends it as WAV. The answer shown equals the REST answer to the WAV the page sent."""
    clip = tmp_path / "question.wav"
    clip.write_bytes(examples[0].audio)
    with browser(f"--user-data-dir={tmp_path / 'profile'}", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={clip}%noloop") as chrome:
        open_page(chrome, server, "vqa")
        by_id(chrome, "image").send_keys(str(image_file))
        by_id(chrome, "record").click()
        wait(chrome, lambda d: by_id(d, "record").get_attribute("aria-pressed") == "true")
        import soundfile
        seconds = soundfile.info(io.BytesIO(examples[0].audio)).duration
        time.sleep(seconds + 1.0)
        by_id(chrome, "record").click()
        wait(chrome, lambda d: by_id(d, "record-status").text.startswith("Recorded") or by_id(d, "error").text)
        assert by_id(chrome, "error").text == ""
        sent = base64.b64decode(chrome.execute_async_script(
            "const done = arguments[0]; fetch(document.getElementById('playback').src).then(r => r.arrayBuffer())"
            ".then(b => { let s = ''; for (const c of new Uint8Array(b)) s += String.fromCharCode(c); done(btoa(s)); })"))
        recorded = soundfile.info(io.BytesIO(sent))
        assert recorded.channels == 1 and abs(recorded.duration - seconds) < 0.5  # the speech, its silence trimmed
        by_id(chrome, "ask").click()
        answer, state = answered(chrome)
        rest = rest_predict(server, {"image": b64(examples[0].image), "question": "", "audio": b64(sent)})
        assert state == "done" and answer == rest["answer"]
        assert by_id(chrome, "confidence").text == percent(rest["confidence"])
        screenshot(chrome, "spoken")


@needs_chromium
def test_cascade_shows_who_answered(server, driver, examples, image_file):
    from selenium.webdriver.common.by import By

    open_page(driver, server, "vqa")
    assert not by_id(driver, "route-group").get_attribute("hidden")
    driver.find_element(By.CSS_SELECTOR, 'input[name="route"][value="cascade"]').click()
    by_id(driver, "image").send_keys(str(image_file))
    by_id(driver, "question").send_keys(examples[0].question)
    by_id(driver, "ask").click()
    answer, state = answered(driver)
    status, rest = call(server.rest_url + "/cascade", {"instances": [
        {"image": b64(examples[0].image), "question": examples[0].question, "audio": b64(b"")}]})
    assert state == "done" and answer == rest["answer"]
    assert rest["source"] in ("edge", "cloud")
    assert by_id(driver, "source").get_attribute("class") == f"source-{rest['source']}"
    assert by_id(driver, "confidence").text == percent(rest["confidence"])
    screenshot(driver, "cascade")


@needs_chromium
def test_a_dropped_image_is_taken_like_a_chosen_one(server, driver, examples):
    """A file dropped on the image box (the browser's drop event with the file in its DataTransfer) is read and
    asked about as a chosen one."""
    open_page(driver, server, "vqa")
    driver.execute_script(
        "const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));"
        "const transfer = new DataTransfer();"
        "transfer.items.add(new File([bytes], 'dropped.png', {type: 'image/png'}));"
        "document.getElementById('image-group').dispatchEvent(new DragEvent('drop', {dataTransfer: transfer, "
        "bubbles: true, cancelable: true}));", base64.b64encode(examples[1].image).decode())
    wait(driver, lambda d: by_id(d, "image-hint").text.startswith("dropped.png"))
    by_id(driver, "question").send_keys(examples[1].question)
    by_id(driver, "ask").click()
    answer, state = answered(driver)
    rest = rest_predict(server, {"image": b64(examples[1].image), "question": examples[1].question,
                                 "audio": b64(b"")})
    assert state == "done" and answer == rest["answer"]


@needs_chromium
def test_clear_messages_for_errors(server, driver, examples, image_file, tmp_path):
    open_page(driver, server, "vqa")
    # an image over the server's --max-request-mb, refused before it is sent
    noise = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    large = tmp_path / "large.png"
    Image.fromarray(noise).save(large)
    assert large.stat().st_size > REQUEST_MB * 2 ** 20 * 0.75
    by_id(driver, "image").send_keys(str(large))
    wait(driver, lambda d: by_id(d, "error").text)
    assert "too large" in by_id(driver, "error").text and "--max-request-mb" in by_id(driver, "error").text
    # a question the server refuses: its message shown, the page still usable
    open_page(driver, server, "vlm")
    by_id(driver, "image").send_keys(str(image_file))
    by_id(driver, "question").send_keys(examples[0].question)
    tokens = by_id(driver, "max-tokens")
    tokens.clear()
    tokens.send_keys("500")
    by_id(driver, "ask").click()
    answer, state = answered(driver)
    assert state == "error" and "The server refused the question" in by_id(driver, "error").text
    assert "max_tokens" in by_id(driver, "error").text
    assert by_id(driver, "ask").is_enabled()
    # the microphone refused by the browser's permission
    driver.execute_cdp_cmd("Browser.setPermission", {"permission": {"name": "microphone"}, "setting": "denied",
                                                     "origin": server.rest_url})
    by_id(driver, "record").click()
    wait(driver, lambda d: "Microphone" in by_id(d, "error").text)
    assert "permission was denied" in by_id(driver, "error").text
    assert by_id(driver, "record").get_attribute("aria-pressed") == "false"


@needs_chromium
def test_no_microphone_message(server, tmp_path):
    with browser(f"--user-data-dir={tmp_path / 'profile'}", "--use-fake-ui-for-media-stream") as chrome:  # no device
        open_page(chrome, server, "vqa")
        by_id(chrome, "record").click()
        wait(chrome, lambda d: by_id(d, "error").text)
        assert by_id(chrome, "error").text.startswith("No microphone was found")
