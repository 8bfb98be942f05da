"""A client for `mindvl serve` and MindSpore Serving 2.0, over REST or gRPC, shaped like MindSpore Serving's.

    client = Client("http://127.0.0.1:1500", "vqa", "predict")      # REST
    client = Client("127.0.0.1:5500", "vqa", "predict")             # gRPC (also "grpc://127.0.0.1:5500")
    client.infer({"image": png_bytes, "question": "what shape is it?", "audio": b""})
    -> [{"answer": "circle", "confidence": 0.87, "answer_text": "circle"}]

    generator = Client("127.0.0.1:5500", "vlm", "generate")         # a generative servable
    for delta in generator.stream({"image": png_bytes, "text": "what shape is it?", "max_tokens": 32}):
        print(delta["text"], end="")                                # as each token comes

Inputs: str, bytes, numpy arrays and numpy or Python scalars (and, over REST, nested lists). Outputs: numpy
arrays, Python scalars (0-d tensors), str and bytes; an instance the server failed is {"error": message} in
its place, as MindSpore Serving's client returns it. A request the server refuses as a whole, or one that
cannot reach it, raises ServingError.

Dtypes: gRPC carries them; JSON does not. Over REST the server reads JSON ints as int32 and floats as float32
(MindSpore Serving's rule; send a numpy array for another dtype), and this client reads a reply's lists of
floats back as float32 and of ints as int32 whenever that loses nothing (every mindvl output), else as
float64 / int64. A Python int or float goes over gRPC as int64 / float64, as MindSpore's client sends it.
"""
import base64
import http.client
import json
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Mapping, Sequence, Union
from urllib.parse import urlsplit

import grpc
import numpy as np

from mindvl.errors import MindvlError
from mindvl.serving import grpc_protocol as G
from mindvl.serving.protocol import MAX_VERSION, TENSOR_TYPES, InstanceError, ProtocolError, is_safe_name
from mindvl.serving.register import GENERATE

Instances = Union[Mapping[str, Any], Sequence[Mapping[str, Any]]]
Delta = Dict[str, Any]  # {"text": str, "token": int, "logprob": float, "finish_reason": str}
WIRE_NAMES = {np.dtype(code).newbyteorder("="): name for name, code in TENSOR_TYPES.items()}  # <f4 -> "float32"
ADDRESS_FORMS = "http://host:port (REST), grpc://host:port or host:port (gRPC)"


class ServingError(MindvlError, RuntimeError):
    """The request failed as a whole (the server's error_msg), could not reach the server, or could not be
    encoded; the message says which and what to do."""


def _parse_address(address: str):
    """-> ("rest", base URL) or ("grpc", host:port); ServingError names the accepted forms."""
    if not isinstance(address, str) or not address.strip():
        raise ServingError(f"address {address!r}: expected {ADDRESS_FORMS}")
    address = address.strip().rstrip("/")
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "http", "https", "grpc"):
        raise ServingError(f"address {address!r}: scheme {scheme!r} is not served; expected {ADDRESS_FORMS}")
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port
    except ValueError as error:
        raise ServingError(f"address {address!r}: {error}; expected {ADDRESS_FORMS}") from None
    if not parts.hostname or parts.path or parts.query or parts.fragment or (port is None and scheme in ("", "grpc")):
        raise ServingError(f"address {address!r}: expected {ADDRESS_FORMS}")
    return ("rest", f"{scheme}://{rest}") if scheme.startswith("http") else ("grpc", rest)


def rest_value(value: Any) -> Any:
    """An input value as the REST protocol sends it: str and JSON scalars or lists as they are, bytes as
    {"b64"}, numpy arrays and scalars as {"b64", "type", "shape"} (little-endian, as the server reads them)."""
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, str):  # numpy's str_ too
        return str(value)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        name = WIRE_NAMES.get(array.dtype.newbyteorder("="))
        if name is None:
            raise ProtocolError(f"dtype {array.dtype} cannot be sent: expected bool, (u)int8-64 or float16-64")
        data = np.ascontiguousarray(array, np.uint8 if name == "bool" else TENSOR_TYPES[name]).tobytes()
        return {"b64": base64.b64encode(data).decode("ascii"), "type": name, "shape": list(array.shape)}
    if isinstance(value, (bool, int, float, list)):
        return value
    raise ProtocolError(f"type {type(value).__name__} cannot be sent: expected str, bytes, a numpy array or "
                        f"scalar, bool, int, float or a nested list")


def _rest_instance(index: int, inputs: Mapping[str, Any]) -> Dict[str, Any]:
    encoded = {}
    for name, value in inputs.items():
        try:
            encoded[name] = rest_value(value)
        except ProtocolError as error:
            raise ProtocolError(f"instance {index}, input {name!r}: {error}") from None
    return encoded


def _narrow(array: np.ndarray) -> np.ndarray:
    """float64 / int64 decoded from JSON -> float32 / int32 when every value survives the round trip."""
    narrow = {"f": np.float32, "i": np.int32}.get(array.dtype.kind)
    if narrow is None:
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        candidate = array.astype(narrow)
    return candidate if np.array_equal(candidate, array, equal_nan=array.dtype.kind == "f") else array


def _rest_output(value: Any) -> Any:
    """A reply's JSON value -> bytes ({"b64"}), str, a Python scalar, or a numpy array (a nested list of
    numbers; null, which the server sends for a non-finite float, reads as nan)."""
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise ProtocolError(f"reply holds an object with keys {sorted(value)}, expected only 'b64'")
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (TypeError, ValueError):  # binascii.Error is a ValueError
            raise ProtocolError(f"reply holds an illegal b64 string {str(value['b64'])[:64]!r}") from None
    if value is None:
        return float("nan")
    if not isinstance(value, list):
        return value
    try:
        array = np.array(value)
    except ValueError:  # ragged
        array = None
    if array is not None and array.dtype.kind in "biuf":
        return _narrow(array)
    if array is not None and array.dtype.kind == "O" and \
            all(item is None or type(item) in (int, float) for item in array.ravel()):
        return _narrow(np.array(value, dtype=np.float64))  # numbers and nulls
    return [_rest_output(item) for item in value]  # strings or bytes inside a list stay a list


def _grpc_output(value: Any) -> Any:
    """A decoded tensor: 0-d arrays as Python scalars (as REST sends them), anything else as it is."""
    return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value


class _Rest:
    """POST /model/<servable>[/version/<n>]:<method>, one connection per request (urllib)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout

    def infer(self, path: str, instances: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        with self._post(path, instances, "application/json") as response:
            reply = self._reply(path, response)
        answered = reply["instances"]
        if not isinstance(answered, list) or len(answered) != len(instances) or \
                not all(isinstance(item, dict) for item in answered):
            raise ServingError(f"{self.url}{path}: the reply's 'instances' is not one object per request instance "
                               f"({len(instances)})")
        return [{"error": item["error_msg"]} if set(item) == {"error_msg"} else
                {name: _rest_output(value) for name, value in item.items()} for item in answered]

    def stream(self, path: str, instance: Mapping[str, Any]) -> Iterator[Delta]:
        """`generate` asked with `Accept: text/event-stream`: its Server-Sent Events (`data: {json}`, then
        `data: [DONE]`) as deltas; a refusal comes as an ordinary JSON reply, a failure mid-stream as an event."""
        with self._post(path, [instance], "text/event-stream") as response:
            if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                self._reply(path, response)  # raises its error_msg
                raise ServingError(f"{self.url}{path}: the server answered without streaming; streaming needs "
                                   f"`mindvl serve` and a generative servable")
            try:
                for line in response:
                    data = line[len(b"data: "):].strip() if line.startswith(b"data: ") else None
                    if data == b"[DONE]":
                        return
                    if data:
                        yield _event_delta(json.loads(data), f"{self.url}{path}")
            except (OSError, http.client.HTTPException) as error:  # timeouts and resets while reading
                raise self._failed(error) from None
            except ValueError:
                raise ServingError(f"{self.url}{path}: an event is not JSON; is this `mindvl serve`?") from None
        raise ServingError(f"{self.url}{path}: the stream ended before `data: [DONE]` (the server stopped?)")

    def _post(self, path: str, instances: List[Mapping[str, Any]], accept: str):
        """The open response to POSTing `instances`; an error status's response too (a server in strict mode
        answers errors with 4xx/5xx and a JSON body)."""
        try:
            body = json.dumps({"instances": [_rest_instance(i, inputs) for i, inputs in enumerate(instances)]},
                              allow_nan=False)
        except (TypeError, ValueError) as error:  # a list holding numpy values, nan or inf
            raise ProtocolError(f"an input cannot be sent as JSON: {error}; send it as a numpy array") from None
        request = urllib.request.Request(self.url + path, body.encode("utf-8"),
                                         {"Content-Type": "application/json", "Accept": accept}, method="POST")
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            return error
        except urllib.error.URLError as error:
            raise self._failed(error.reason) from None
        except (OSError, http.client.HTTPException) as error:  # timeouts and resets
            raise self._failed(error) from None

    def _reply(self, path: str, response) -> Dict[str, Any]:
        """A JSON reply holding 'instances'; ServingError for its error_msg or a reply that is not the protocol's."""
        try:
            payload = response.read()
        except (OSError, http.client.HTTPException) as error:  # timeouts and resets while reading
            raise self._failed(error) from None
        if isinstance(response, urllib.error.HTTPError) and not payload.lstrip().startswith(b"{"):
            raise ServingError(f"{self.url}{path}: HTTP {response.code} {response.reason}; is this the REST address "
                               f"of `mindvl serve` or MindSpore Serving?")
        try:
            reply = json.loads(payload)
        except ValueError:
            raise ServingError(f"{self.url}{path}: the reply is not JSON; is this the REST address of `mindvl "
                               f"serve` or MindSpore Serving?") from None
        if not isinstance(reply, dict) or ("error_msg" in reply) == ("instances" in reply):
            raise ServingError(f"{self.url}{path}: the reply holds neither 'instances' nor 'error_msg'")
        if "error_msg" in reply:
            raise ServingError(str(reply["error_msg"]))
        return reply

    def _failed(self, reason: Any) -> ServingError:
        if isinstance(reason, TimeoutError):
            return ServingError(f"{self.url}: no reply within {self.timeout:g} s (the Client's timeout)")
        return _unreachable(self.url, reason)

    def close(self) -> None:
        """Nothing to release: every request opens its own connection."""


class _Grpc:
    """MSService/Predict and PredictStream over one channel."""

    def __init__(self, target: str, timeout: float) -> None:
        self.target, self.timeout = target, timeout
        # the server enforces its own request limit (--max-request-mb); replies of any size are read
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1),
                                                              ("grpc.max_send_message_length", -1)])
        self.stub = G.predict_stub(self.channel)
        self.stream_stub = G.predict_stream_stub(self.channel)

    def infer(self, spec: G.ServableSpec, instances: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        request = G.instances_to_request(spec.name, spec.method_name, spec.version_number, _arrays(instances))
        try:
            reply = self.stub(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise self._failed(error) from None
        try:
            results = G.results_from_reply(reply)
        except G.RequestFailed as error:
            raise ServingError(str(error)) from None
        if len(results) != len(instances):
            raise ServingError(f"grpc://{self.target}: the reply answers {len(results)} instances, the request "
                               f"held {len(instances)}")
        return [{"error": str(result)} if isinstance(result, InstanceError) else
                {name: _grpc_output(value) for name, value in result.items()} for result in results]

    def stream(self, spec: G.ServableSpec, instance: Mapping[str, Any]) -> Iterator[Delta]:
        request = G.instances_to_request(spec.name, spec.method_name, spec.version_number, _arrays([instance]))
        call = self.stream_stub(request, timeout=self.timeout)
        try:
            for reply in call:
                yield G.delta_from_reply(reply)
        except grpc.RpcError as error:
            raise self._failed(error) from None
        finally:
            call.cancel()  # a caller that stops reading ends the call, and the server cancels the generation

    def _failed(self, error: grpc.RpcError) -> ServingError:
        code, details = error.code(), error.details()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ServingError(f"grpc://{self.target}: no reply within {self.timeout:g} s (the Client's timeout)")
        if code == grpc.StatusCode.UNAVAILABLE:
            return _unreachable(f"grpc://{self.target}", details)
        return ServingError(f"grpc://{self.target}: gRPC {code.name}: {details}")

    def close(self) -> None:
        self.channel.close()


def _arrays(instances: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Lists as numpy arrays: the tensor codec takes numpy arrays, not lists."""
    return [{name: np.asarray(v) if isinstance(v, list) else v for name, v in inputs.items()} for inputs in instances]


def _event_delta(event: Any, where: str) -> Delta:
    """A Server-Sent Event of a streamed generate as a delta; its {"error": {"message"}} as ServingError."""
    if isinstance(event, dict) and "error" in event:  # {"error": {"message": ..., "type": "server_error"}}
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise ServingError(f"{where}: the generation failed: {message}")
    if not isinstance(event, dict) or not set(G.STREAM_OUTPUTS) <= set(event):
        raise ServingError(f"{where}: an event holds {event!r:.80}, expected {', '.join(G.STREAM_OUTPUTS)}")
    return {"text": event["text"], "token": event["token"], "logprob": event["logprob"],
            "finish_reason": event["finish_reason"] or ""}


def _unreachable(address: str, reason: Any) -> ServingError:
    return ServingError(f"cannot reach {address}: {reason}; is `mindvl serve` running there (it prints its REST "
                        f"and gRPC addresses when it starts)?")


class Client:
    """Calls one method of one servable: `Client(address, servable_name, method_name, version_number=0,
    timeout=60.0).infer(instances)`.

    address: "http://host:port" for REST, "grpc://host:port" or "host:port" for gRPC (MindSpore Serving's
    client takes the latter). version_number 0 asks for the newest loaded version. timeout in seconds, per
    request. Close a gRPC client's channel with `close()` or a `with` block.
    """

    def __init__(self, address: str, servable_name: str, method_name: str, version_number: int = 0,
                 timeout: float = 60.0) -> None:
        for kind, name in (("servable_name", servable_name), ("method_name", method_name)):
            if not is_safe_name(name):
                raise ServingError(f"{kind} {name!r}: expected letters, digits and '_.-', not '.' or '..'")
        if isinstance(version_number, bool) or not isinstance(version_number, int) or \
                not 0 <= version_number <= MAX_VERSION:
            raise ServingError(f"version_number {version_number!r}: expected an integer 0..{MAX_VERSION} "
                               f"(0: the newest)")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ServingError(f"timeout {timeout!r}: expected seconds > 0")
        self.address = address
        self.servable_name, self.method_name, self.version_number = servable_name, method_name, version_number
        self.protocol, target = _parse_address(address)
        self._transport = _Rest(target, timeout) if self.protocol == "rest" else _Grpc(target, timeout)

    def infer(self, instances: Instances) -> List[Dict[str, Any]]:
        """One dict of outputs per instance, in order, or {"error": message} for an instance that failed;
        raises ServingError when the request fails as a whole."""
        if isinstance(instances, Mapping):
            instances = [instances]
        if not isinstance(instances, (list, tuple)) or not instances:
            raise ServingError(f"instances: expected a dict of input values or a non-empty list of them, got "
                               f"{instances!r:.80}")
        for index, inputs in enumerate(instances):
            if not isinstance(inputs, Mapping) or not inputs:
                raise ServingError(f"instance {index}: expected a non-empty dict of input names to values, got "
                                   f"{inputs!r:.80}")
        try:
            return self._transport.infer(self._target, list(instances))
        except ProtocolError as error:  # an input this client cannot encode, or a reply that breaks the protocol
            raise ServingError(f"{self.servable_name}.{self.method_name}: {error}") from None

    def stream(self, instance: Mapping[str, Any]) -> Iterator[Delta]:
        """The deltas of one `generate` instance as the server makes them, each {"text": str, "token": int,
        "logprob": float, "finish_reason": str} ("" until the last delta's "stop" or "length"): their texts
        concatenate to infer's "text", their tokens to its "tokens". gRPC calls MSService/PredictStream, REST asks
        for Server-Sent Events. The Client's timeout bounds the whole stream over gRPC and each wait for the next
        delta over REST. Leaving the loop early (or closing the iterator) cancels the generation on the server.

        Raises ServingError at once for a client of another method or a bad instance, and while iterating when
        the server refuses the request or the stream fails."""
        if self.method_name != GENERATE:
            raise ServingError(f"stream: only method {GENERATE} streams; this client calls {self.servable_name}."
                               f"{self.method_name}, use infer")
        if not isinstance(instance, Mapping) or not instance:
            raise ServingError(f"instance: expected a non-empty dict of input names to values, got {instance!r:.80}")
        return self._deltas(instance)

    def _deltas(self, instance: Mapping[str, Any]) -> Iterator[Delta]:
        try:
            yield from self._transport.stream(self._target, instance)
        except ProtocolError as error:  # as in infer
            raise ServingError(f"{self.servable_name}.{self.method_name}: {error}") from None

    @property
    def _target(self) -> Union[str, G.ServableSpec]:
        """What the transport calls: the REST path, or the gRPC servable_spec."""
        if self.protocol == "rest":
            version = f"/version/{self.version_number}" if self.version_number else ""
            return f"/model/{self.servable_name}{version}:{self.method_name}"
        return G.ServableSpec(name=self.servable_name, method_name=self.method_name, version_number=self.version_number)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
