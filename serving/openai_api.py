"""The OpenAI chat API's requests and bodies: a `POST /v1/chat/completions` body read as a generate instance, and
the answers (whole, as chunks, the models list, errors) written as OpenAI's JSON (openai_routes.py serves them).

The request's `model` names a servable (its newest version; `name@N` a version). The whole conversation is read:
system (or developer) messages first, then user and assistant turns, the last message the user's question; the
model's chat template lays every message out (Gemma's folds the system text into the first user turn), and when
the conversation does not fit the largest prompt bucket with the new tokens the oldest exchanges are left out,
never the system message or the last user turn (the answer's `dropped_turns` counts them, consecutive messages of one
role being one turn; `prompt_tokens` counts what the model read). Attachments sit in any user message: images (`image_url` with a `data:` URL; remote URLs are
refused, the server fetches nothing; a native-resolution VLM takes several, in order, the others one per
conversation), one clip (`input_audio`, base64 WAV) and, for a native-resolution VLM, one video: a file
(`video_url`, vLLM's part, a data: URL of an MP4, WebM, ...) or its frames (`{"type": "video", "video": [data:
URLs of images]}`, taken 0.5 s apart). The
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
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from mindvl.errors import InputError, plain, shown
from mindvl.preprocess.request import expect

SETTINGS = ("max_tokens", "temperature", "top_p", "stop", "seed", "top_k", "repetition_penalty", "ignore_eos",
            "presence_penalty", "frequency_penalty")
MAX_CHOICES = 8  # n: the choices one request may ask for (each is a stream of the batch)
# every other field a request may hold: honoured (read below), informational (changes no reply), or OpenAI's fields
# this server does not do, accepted only at the value that asks for nothing (None always), else refused by name
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice"}  # vLLM's extra fields
HONOURED = {"model", "messages", "max_completion_tokens", "n", "stream", "stream_options", "logprobs", "top_logprobs",
            "response_format", *GUIDED, *SETTINGS}
INFORMATIONAL = {"user", "metadata", "service_tier"}
NOT_DONE = {"modalities": (["text"],), "tools": ([],), "tool_choice": ("none",),
            "parallel_tool_calls": (), "functions": ([],), "function_call": ("none",), "logit_bias": ({},),
            "audio": (), "prediction": (), "store": (False,), "reasoning_effort": (), "web_search_options": (),
            "guided_grammar": ()}
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
    """The whole conversation as a generate instance: the last message (the user's) as its text, every earlier
    one as its `history` (chat.history_turns' form, each attachment a marker where it sat), the attachments of
    every message in order as its image(s), clip and video."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages: expected a non-empty list of messages", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
            raise OpenAIError(f"messages[{index}]: expected an object with role system, developer, user or "
                              f"assistant (tools are not supported)", param=f"messages[{index}]")
        if message["role"] in ("system", "developer") and any(m["role"] not in ("system", "developer")
                                                               for m in messages[:index]):
            raise OpenAIError(f"messages[{index}]: a {message['role']} message after the conversation started; put "
                              f"the instructions first", param=f"messages[{index}]")
    if messages[-1]["role"] != "user":
        raise OpenAIError(f"messages[{len(messages) - 1}]: the last message must be the user's (the question the "
                          f"model answers)", param=f"messages[{len(messages) - 1}]")
    instance: Dict[str, Any] = {}
    images: List[bytes] = []
    history = [{"role": message["role"], "content": _parts(message, index, instance, images)}
               for index, message in enumerate(messages)]
    last = history.pop()["content"]
    instance["text"] = " ".join(part["text"] for part in last if part["type"] == "text").strip()
    if history:
        instance["history"] = history
    if len(images) == 1:
        instance["image"] = images[0]
    elif images:
        instance["images"] = images  # a native-resolution VLM's; another model refuses them by name
    return instance


def _parts(message: dict, index: int, instance: Dict[str, Any], images: List[bytes]) -> List[Dict[str, str]]:
    """A message's content as history parts (text, and a marker per attachment: {"type": "image" | "audio" |
    "video"}), its attachments' bytes appended to `images` or set on `instance` (one clip and one video per
    conversation)."""
    content = message.get("content")
    if content is None and message["role"] == "assistant":
        content = ""  # an assistant turn that only called tools (not supported, but harmless as an empty answer)
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise OpenAIError(f"messages[{index}].content: expected a string or a list of parts",
                          param=f"messages[{index}].content")
    read: List[Dict[str, str]] = []
    for number, part in enumerate(parts):
        param = f"messages[{index}].content[{number}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            try:
                expect(part[kind], str, param)
            except InputError as error:
                raise OpenAIError(str(error), param=param, code="invalid_value") from None
            read.append({"type": "text", "text": part[kind]})
            continue
        if message["role"] != "user":
            raise OpenAIError(f"{param}: a {message['role']} message holds text only, got a part of type {kind!r}",
                              param=param, code="unsupported_content_part")
        if kind == "image_url":
            images.append(_image(part, param))
            read.append({"type": "image"})
        elif kind in ("input_audio", "video_url", "video"):
            key = "audio" if kind == "input_audio" else "video"
            if key in instance:
                raise OpenAIError(f"{param}: a second {'clip' if key == 'audio' else 'video'}; a conversation takes "
                                  f"one", param=param, code="too_many_attachments")
            instance[key] = (_audio(part, param) if kind == "input_audio" else _image(part, param, kind)
                             if kind == "video_url" else _frames(part, param))
            read.append({"type": key})
        else:
            raise OpenAIError(f"{param}: unsupported content part type {kind!r}; use text, image_url, input_audio, "
                              f"video_url or video", param=param, code="unsupported_content_part")
    return read


class ChatRequest(NamedTuple):
    model: str
    instance: Dict[str, Any]  # the generate instance (serving/runtime.py)
    stream: bool
    include_usage: bool
    n: int  # choices
    logprobs: bool  # each choice lists its tokens' log-probabilities (and instance["top_logprobs"] alternatives)
    grammar_field: Optional[str]  # the field that asked for structured output (response_format, guided_*)
    user: Optional[str]  # OpenAI's end-user id: a gray release's client key when no X-Client-Key header is sent


def parse_chat(body: bytes) -> ChatRequest:
    """A chat completions request, read and checked."""
    request = _json_object(body)
    _check_fields(request)
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model: required; GET /v1/models lists the served models", param="model")
    n = 1 if request.get("n") is None else request["n"]
    if type(n) is not int or not 1 <= n <= MAX_CHOICES:
        raise OpenAIError(f"n: expected an integer in [1, {MAX_CHOICES}] (the choices generated), got {shown(n)}",
                          param="n", code="invalid_value")
    logprobs = _flag(request, "logprobs")
    top = request.get("top_logprobs")
    if top is not None and not logprobs:
        raise OpenAIError("top_logprobs: needs logprobs set to true", param="top_logprobs", code="invalid_value")
    instance = question(request.get("messages"))
    if top is not None:
        instance["top_logprobs"] = top
    grammar_field, grammar = _grammar(request)
    if grammar is not None:
        instance["grammar"] = grammar
    if request.get("max_completion_tokens") is not None and request.get("max_tokens") is None:
        request["max_tokens"] = request["max_completion_tokens"]
    for name in SETTINGS:
        if request.get(name) is not None:
            instance[name] = request[name]
    stream = _flag(request, "stream")
    options = request.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError("stream_options: expected an object", param="stream_options")
    return ChatRequest(model, instance, stream, _flag(options, "include_usage", "stream_options.include_usage"), n,
                       logprobs, grammar_field, _user(request))


def _json_object(body: bytes) -> dict:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(f"the body is not valid JSON ({exc})") from None
    except RecursionError:
        raise OpenAIError("the body nests its JSON deeper than the parser allows; a request is a few levels "
                          "deep") from None
    if not isinstance(request, dict):
        raise OpenAIError("the body must be a JSON object")
    return request


def _grammar(request: dict) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """(the field, what the answer must be): response_format json_object or json_schema (its `schema`; strict or
    not, it is enforced), or one of vLLM's guided_json / guided_regex / guided_choice; at most one of them."""
    asked = [name for name in ("response_format", *GUIDED) if request.get(name) is not None
             and request.get(name) != {"type": "text"}]
    if len(asked) > 1:
        raise OpenAIError(f"{asked[1]}: one structured output per request; {asked[0]} is given too", param=asked[1],
                          code="invalid_value")
    if not asked:
        return None, None
    name, value = asked[0], request[asked[0]]
    if name in GUIDED:
        if name == "guided_json" and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise OpenAIError("guided_json: not a JSON schema (invalid JSON)", param=name) from None
        return name, {"type": GUIDED[name], "value": value}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return name, {"type": "json_object"}
    if kind == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
            raise OpenAIError("response_format: json_schema needs {\"name\": ..., \"schema\": {...}}",
                              param="response_format", code="invalid_value")
        return name, {"type": "json_schema", "value": schema["schema"]}
    raise OpenAIError(f"response_format: type {shown(kind)} is not supported; use text, json_object or json_schema",
                      param="response_format", code="invalid_value")


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
    """The ids and bodies of one chat completion's answer, whole or as chunks. `token_text`: a token id's text (the
    package's tokenizer), for the log-probabilities."""

    def __init__(self, model: str, token_text: Callable[[int], str] = str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.token_text = token_text

    def _head(self, kind: str) -> Dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def usage(prompt: int, completion: int) -> Dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _token(self, token: int, logprob: float) -> Dict[str, Any]:
        text = self.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    def logprobs(self, tokens: Sequence[int], logprobs: Sequence[float], tops: Sequence[tuple]) -> Dict[str, Any]:
        """OpenAI's logprobs object: each token's text, log-probability and bytes, and its top alternatives."""
        return {"content": [{**self._token(token, logprob), "top_logprobs": [self._token(*pair) for pair in top]}
                            for token, logprob, top in zip(tokens, logprobs, tops)], "refusal": None}

    def whole(self, results: Sequence, logprobs: bool = False) -> bytes:
        """The chat.completion of finished generations (engine.sampling.Generation, one per choice)."""
        first = results[0]
        return json.dumps({**self._head("chat.completion"), "choices": [
            {"index": index, "message": {"role": "assistant", "content": result.text},
             "logprobs": self.logprobs(result.tokens, result.logprobs, result.tops) if logprobs else None,
             "finish_reason": result.finish} for index, result in enumerate(results)],
            "usage": self.usage(first.prompt_tokens, sum(len(r.tokens) for r in results)),
            "dropped_turns": first.dropped_turns}).encode()

    def chunk(self, delta: Dict[str, Any], finish: Optional[str] = None, index: int = 0,
              logprobs: Optional[Dict[str, Any]] = None, **extra: Any) -> bytes:
        """One chat.completion.chunk event of choice `index`; `extra`: top-level fields (the first chunk's
        dropped_turns)."""
        return self.event({**self._head("chat.completion.chunk"), "choices": [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}], **extra})

    def delta_chunks(self, index: int, delta, logprobs: bool) -> bytes:
        """The chunks of one engine Delta of choice `index`: its text (with its token's log-probabilities when
        asked), then its finish."""
        listed = self.logprobs([delta.token], [delta.logprob], [delta.top]) if logprobs else None
        text = self.chunk({"content": delta.text}, index=index, logprobs=listed) if delta.text or listed else b""
        return text + (self.chunk({}, delta.finish, index=index) if delta.finish else b"")

    def usage_chunk(self, prompt: int, completion: int) -> bytes:
        return self.event({**self._head("chat.completion.chunk"), "choices": [],
                           "usage": self.usage(prompt, completion)})

    @staticmethod
    def event(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_EMBEDDING_INPUTS = 256  # strings one embeddings request may hold (each an instance of the embed_text method)


class EmbeddingRequest(NamedTuple):
    model: str
    texts: List[str]
    base64: bool  # encoding_format "base64": each embedding as little-endian float32 bytes, base64
    user: Optional[str]


def parse_embeddings(body: bytes) -> EmbeddingRequest:
    """A `POST /v1/embeddings` body, read and checked: text inputs only (token-id arrays refused by name), `dimensions`
    refused (the package's embeddings are not truncatable), every unknown field refused."""
    request = _json_object(body)
    for name in request:
        if name not in EMBEDDING_FIELDS:
            raise OpenAIError(f"{name}: not a field of the embeddings API this server knows; leave it out", param=name,
                              code="unknown_parameter")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model: required; a servable with an embed_text method", param="model")
    texts = request.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise OpenAIError("input: expected a string or a non-empty list of strings (token ids are not taken; send the "
                          "text)", param="input", code="invalid_value")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise OpenAIError(f"input: {len(texts)} strings, more than the {MAX_EMBEDDING_INPUTS} one request embeds",
                          param="input", code="invalid_value")
    if request.get("dimensions") is not None:
        raise OpenAIError("dimensions: this server's embeddings keep their trained width; leave it out",
                          param="dimensions", code="unsupported_parameter")
    encoding = request.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIError(f"encoding_format: expected float or base64, got {shown(encoding)}", param="encoding_format",
                          code="invalid_value")
    return EmbeddingRequest(model, texts, encoding == "base64", _user(request))


def _user(request: dict) -> Optional[str]:
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        raise OpenAIError(f"user: expected a string, got {shown(user)}", param="user", code="invalid_type")
    return user


def embeddings_body(model: str, embeddings: Sequence[Any], tokens: int, as_base64: bool) -> bytes:
    """OpenAI's embeddings list: each embedding as floats or base64 of little-endian float32."""
    import numpy as np

    def encoded(vector):
        vector = np.asarray(vector, "<f4").reshape(-1)
        return base64.b64encode(vector.tobytes()).decode() if as_base64 else vector.tolist()

    return json.dumps({"object": "list", "model": model, "data": [
        {"object": "embedding", "index": index, "embedding": encoded(vector)} for index, vector in enumerate(embeddings)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()


def models_list(names: List[str]) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                   "owned_by": "mindvl"} for name in names]}).encode()
