"""The OpenAI chat API's requests and bodies: a `POST /v1/chat/completions` body read as a generate instance, and
the answers (whole, as chunks, the models list, errors) written as OpenAI's JSON (openai_routes.py serves them).

The request's `model` names a servable (its newest version; `name@N` a version). The last user message is the
question: its text parts, its images (`image_url` with a `data:` URL; remote URLs are refused, the server fetches
nothing; a native-resolution VLM takes several, in order, the others one), at most one clip (`input_audio`, base64
WAV) and, for a native-resolution VLM, one video: a file (`video_url`, vLLM's part, a data: URL of an MP4, WebM,
...) or its frames (`{"type": "video", "video": [data: URLs of images]}`, taken 0.5 s apart). System messages are accepted and not used (the
model was not trained with one); earlier turns are not replayed (the chat template holds one question). The
settings are OpenAI's: max_tokens (or max_completion_tokens), temperature, top_p, stop, seed, n = 1 (and vLLM's
extra top_k, repetition_penalty, ignore_eos, as the openai client sends them with `extra_body`); any other field
is refused by name (400, `param` naming it) unless it is informational (user, metadata, service_tier) or one of
OpenAI's that asks for nothing at its value (logprobs false, response_format text, ...: NOT_DONE); `stream`
answers with Server-Sent Events of `chat.completion.chunk` deltas and `data: [DONE]`, `stream_options.
include_usage` adds a last chunk with the token counts. Errors are OpenAI's error objects with its status codes.
"""
import base64
import binascii
import json
import re
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from mindvl.errors import InputError, plain, shown
from mindvl.preprocess.request import expect

SETTINGS = ("max_tokens", "temperature", "top_p", "stop", "seed", "top_k", "repetition_penalty", "ignore_eos")
# every other field a request may hold: honoured (read below), informational (changes no reply), or OpenAI's fields
# this server does not do, accepted only at the value that asks for nothing (None always), else refused by name
HONOURED = {"model", "messages", "max_completion_tokens", "n", "stream", "stream_options", *SETTINGS}
INFORMATIONAL = {"user", "metadata", "service_tier"}
NOT_DONE = {"logprobs": (False,), "top_logprobs": (0,), "presence_penalty": (0,), "frequency_penalty": (0,),
            "response_format": ({"type": "text"},), "modalities": (["text"],), "tools": ([],), "tool_choice": ("none",),
            "parallel_tool_calls": (), "functions": ([],), "function_call": ("none",), "logit_bias": ({},),
            "audio": (), "prediction": (), "store": (False,), "reasoning_effort": (), "web_search_options": (),
            "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": ()}
DATA_URL = re.compile(r"data:((?:image|video)/[A-Za-z0-9.+-]+)?(;[^,]*)?;base64,(.*)", re.S)


class OpenAIError(Exception):
    """An OpenAI-style error: message, HTTP status, type, param and code."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> bytes:
        return json.dumps({"error": {"message": plain(str(self)), "type": self.kind, "param": self.param,
                                     "code": self.code}}).encode()


def _b64(data: str, what: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise OpenAIError(f"{what}: not valid base64", param=param, code="invalid_base64") from None


def _image(part: dict, param: str, kind: str = "image_url") -> bytes:
    url = part.get(kind)
    url = url.get("url") if isinstance(url, dict) else url
    return _data_url(url, kind, param)


def _data_url(url: Any, what: str, param: str) -> bytes:
    """The bytes of a data: URL (an image's or a video's)."""
    media = "video" if what == "video_url" else "image"
    if not isinstance(url, str) or not url:
        raise OpenAIError(f"{what}: expected {{\"url\": \"data:{media}/...;base64,...\"}}", param=param,
                          code=f"missing_{media}_data")
    if not url.startswith("data:"):
        raise OpenAIError(f"{what}: remote URLs are not fetched by this server; send the {media} inline as a data: "
                          f"URL (data:{media}/...;base64,...)", param=param, code="remote_url_refused")
    match = DATA_URL.fullmatch(url)
    if match is None:
        raise OpenAIError(f"{what}: a malformed data: URL; expected data:{media}/<type>;base64,<data>", param=param,
                          code="invalid_data_url")
    data = _b64(match.group(3), what, param)
    if not data:
        raise OpenAIError(f"{what}: the data: URL holds no {media} data", param=param, code=f"missing_{media}_data")
    return data


def _frames(part: dict, param: str) -> List[bytes]:
    frames = part.get("video")
    if not isinstance(frames, list) or not frames:
        raise OpenAIError("video: expected a non-empty list of frames as data: URLs of images", param=param)
    return [_data_url(frame, "video", f"{param}.video[{i}]") for i, frame in enumerate(frames)]


def _audio(part: dict, param: str) -> bytes:
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise OpenAIError("input_audio: expected {\"data\": \"<base64 WAV>\", \"format\": \"wav\"}", param=param)
    if audio.get("format", "wav") != "wav":
        raise OpenAIError(f"input_audio: format {audio.get('format')!r} is not supported; send a WAV (format "
                          f"\"wav\")", param=param, code="unsupported_audio_format")
    return _b64(audio["data"], "input_audio", param)


def question(messages: Any) -> Dict[str, Any]:
    """The last user message as a generate instance's text, image and audio."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages: expected a non-empty list of messages", param="messages")
    users = [(i, m) for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
            raise OpenAIError(f"messages[{index}]: expected an object with role system, user or assistant",
                              param=f"messages[{index}]")
    if not users:
        raise OpenAIError("messages: no user message; the last user message holds the question", param="messages")
    index, message = users[-1]
    content = message.get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise OpenAIError(f"messages[{index}].content: expected a string or a list of parts",
                          param=f"messages[{index}].content")
    instance: Dict[str, Any] = {"text": ""}
    images: List[bytes] = []
    for number, part in enumerate(parts):
        param = f"messages[{index}].content[{number}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            try:
                expect(part["text"], str, param)
            except InputError as error:
                raise OpenAIError(str(error), param=param, code="invalid_value") from None
            instance["text"] = (instance["text"] + " " + part["text"]).strip()
        elif kind == "image_url":
            images.append(_image(part, param))
        elif kind in ("input_audio", "video_url", "video"):
            key = "audio" if kind == "input_audio" else "video"
            if key in instance:
                raise OpenAIError(f"{param}: a second {'clip' if key == 'audio' else 'video'}; a question takes one",
                                  param=param, code="too_many_attachments")
            instance[key] = (_audio(part, param) if kind == "input_audio" else _image(part, param, kind)
                             if kind == "video_url" else _frames(part, param))
        else:
            raise OpenAIError(f"{param}: unsupported content part type {kind!r}; use text, image_url, input_audio, "
                              f"video_url or video", param=param, code="unsupported_content_part")
    if len(images) == 1:
        instance["image"] = images[0]
    elif images:
        instance["images"] = images  # a native-resolution VLM's; another model refuses them by name
    return instance


def parse_chat(body: bytes) -> Tuple[str, Dict[str, Any], bool, bool]:
    """A chat completions request -> (model, generate instance, stream, include_usage)."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(f"the body is not valid JSON ({exc})") from None
    except RecursionError:
        raise OpenAIError("the body nests its JSON deeper than the parser allows; a chat request is a few levels "
                          "deep") from None
    if not isinstance(request, dict):
        raise OpenAIError("the body must be a JSON object")
    _check_fields(request)
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model: required; GET /v1/models lists the served models", param="model")
    if request.get("n") is not None and (type(request["n"]) is not int or request["n"] != 1):
        raise OpenAIError("n: only 1 choice per request is generated", param="n", code="unsupported_value")
    instance = question(request.get("messages"))
    if request.get("max_completion_tokens") is not None and request.get("max_tokens") is None:
        request["max_tokens"] = request["max_completion_tokens"]
    for name in SETTINGS:
        if request.get(name) is not None:
            instance[name] = request[name]
    stream = _flag(request, "stream")
    options = request.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError("stream_options: expected an object", param="stream_options")
    return model, instance, stream, _flag(options, "include_usage", "stream_options.include_usage")


def _check_fields(request: dict) -> None:
    """OpenAIError naming the first field this server would otherwise ignore: one of OpenAI's that it does not do
    (set to anything but the value that asks for nothing), or one it does not know; a client must never believe
    it got what it asked for when it did not."""
    for name, value in request.items():
        if name in HONOURED or name in INFORMATIONAL or value is None:
            continue
        if name in NOT_DONE:
            if any(_same(value, neutral) for neutral in NOT_DONE[name]):
                continue
            raise OpenAIError(f"{name}: not supported by this server yet (its value {shown(value)} asks for something "
                              f"it would not do); leave it out", param=name, code="unsupported_parameter")
        raise OpenAIError(f"{name}: not a field of the chat completions API this server knows; leave it out",
                          param=name, code="unknown_parameter")


def _same(value: Any, neutral: Any) -> bool:
    """`value` is `neutral`: a number equal to a numeric one (0 and 0.0 alike, never a bool), else equal and of its
    type (false is not 0)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if number(neutral):
        return number(value) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _flag(fields: dict, name: str, param: Optional[str] = None) -> bool:
    """A boolean field (absent or null: false); "no", 0 or 1 are refused, not read as truthy."""
    value = fields.get(name)
    if value is not None and not isinstance(value, bool):
        raise OpenAIError(f"{param or name}: expected true or false, got {shown(value)}", param=param or name,
                          code="invalid_type")
    return bool(value)


class Completion:
    """The ids and bodies of one chat completion's answer, whole or as chunks."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def _head(self, kind: str) -> Dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def usage(prompt: int, completion: int) -> Dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self, text: str, finish: str, prompt: int, completion: int) -> bytes:
        return json.dumps({**self._head("chat.completion"), "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": finish}], "usage": self.usage(prompt, completion)}).encode()

    def chunk(self, delta: Dict[str, Any], finish: Optional[str] = None) -> bytes:
        return self.event({**self._head("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    def usage_chunk(self, prompt: int, completion: int) -> bytes:
        return self.event({**self._head("chat.completion.chunk"), "choices": [],
                           "usage": self.usage(prompt, completion)})

    @staticmethod
    def event(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models_list(names: List[str]) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                   "owned_by": "mindvl"} for name in names]}).encode()
