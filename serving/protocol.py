"""The MindSpore Serving 2.0 REST codec: URL, request body and reply, as pure functions (no server, numpy only).

Clients written for MindSpore Serving match on its error phrases, so every message here keeps that phrase
verbatim and adds where it happened (`instance 1, input 'image': json array, elements type is not equal`).
MindSpore Serving prefixes whole-request parse failures with "Parser request failed, "; that is the
server's to add, not this module's.

Decoded input values:
  JSON int -> int32 array of shape (), float -> float32, bool -> bool_, string -> str;
  a rectangular nested list of one element type -> int32 / float32 / bool_ array of its shape
  (a list holding one string, or one {"b64"} of type str/bytes, -> that str/bytes);
  {"b64": ..., "type": ..., "shape": [...]} -> an array of that dtype and shape (little-endian on the
  wire, native in memory), or str / bytes for the types "str" / "bytes" (the default).
"""
import base64
import binascii
import json
import math
import re
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.errors import MindvlError

Value = Union[np.ndarray, str, bytes]

MAX_VERSION = 2 ** 32 - 2  # MindSpore Serving rejects version >= UINT32_MAX
MAX_DIMS = 32  # numpy's limit on ndim
MAX_DIM_SIZE = 2 ** 31 - 1  # MindSpore Serving reads shape dims as int32
NAME = re.compile(r"[A-Za-z0-9_.-]+")


def is_safe_name(name) -> bool:
    """Whether `name` may name a servable or method: `NAME`, never '.' or '..' (so it cannot walk a folder)."""
    return isinstance(name, str) and bool(NAME.fullmatch(name)) and name not in (".", "..")
URL_FORM = "/model/<servable>[/version/<n>]:<method>"
TENSOR_TYPES = {
    "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "fp16": "<f2", "float16": "<f2", "fp32": "<f4", "float32": "<f4", "fp64": "<f8", "float64": "<f8",
    "bool": "|b1",
}
TEXT_TYPES = ("str", "bytes")
OBJECT_KEYS = ("b64", "type", "shape")
INT32 = np.iinfo(np.int32)


class ProtocolError(MindvlError, ValueError):
    """A request the REST protocol rejects; the message is what the client reads in `error_msg`."""


class InstanceError(Exception):
    """One instance failed; its message replaces that instance's outputs in the reply."""


class _JsonObject(dict):
    """A JSON object that remembers keys given more than once (a plain dict keeps only the last).

    Slotted, with no Counter unless a key repeats: 32 MB of `{},{},...` took 5.4 GB and 21 s to parse while every
    object carried an instance dict and an empty Counter of its own; now 1.0 GB and 7 s (and `parse_cost`
    refuses such a body unparsed)."""

    __slots__ = ("repeats",)

    def __init__(self, pairs: List[Tuple[str, Any]]):
        super().__init__(pairs)
        self.repeats = Counter(key for key, _ in pairs) if len(pairs) != len(self) else None

    def count(self, key: str) -> int:
        return self.repeats[key] if self.repeats is not None else int(key in self)


def _show(text: str, limit: int = 64) -> str:
    """`text` quoted and cut short: messages echo user input without echoing megabytes of it."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


# ---- URL ---------------------------------------------------------------------------------------------

def parse_url(path: str) -> Tuple[str, int, str]:
    """`/model/<servable>[/version/<n>]:<method>` -> (servable, version, method); version 0 means the newest.

    Stricter than MindSpore Serving's keyword search (which finds `version` anywhere, even inside a
    servable name): names are `[A-Za-z0-9_.-]+` and never `.` or `..`, so none can walk the servable folder.
    """
    rest = path[1:] if path.startswith("/") else path
    if not rest.startswith("model/") or rest[len("model/"):][:1] in ("", "/", ":"):
        raise ProtocolError(f"please check url, the keyword:[model] must contain. Expected {URL_FORM}, "
                            f"got {_show(path)}")
    head, colon, method = rest[len("model/"):].partition(":")
    if not colon or not method:
        raise ProtocolError(f"please check url, the keyword:[service method] must contain. Expected {URL_FORM}, "
                            f"got {_show(path)}")
    servable, slash, version_part = head.partition("/")
    version = 0
    if slash:
        keyword, slash, number = version_part.partition("/")
        if keyword != "version" or not slash:
            raise ProtocolError(f"please check url, expected {URL_FORM}, got {_show(path)}")
        if not re.fullmatch(r"[0-9]+", number):
            raise ProtocolError(f"please check url, the keyword:[version] value invalid, request version number "
                                f"{_show(number)}: expected a non-negative integer")
        if len(number.lstrip("0")) > 10 or int(number) > MAX_VERSION:
            raise ProtocolError(f"please check url, version number range failed, request version number "
                                f"{_show(number)}: at most {MAX_VERSION}")
        version = int(number)
    for kind, name in (("servable", servable), ("method", method)):
        if not is_safe_name(name):
            raise ProtocolError(f"please check url, invalid {kind} name {_show(name)}: expected letters, digits "
                                f"and '_.-', not '.' or '..'")
    return servable, version, method


# ---- request -----------------------------------------------------------------------------------------

def parse_request(body: bytes, max_instances: int, max_parse_bytes: Optional[int] = None) -> List[Dict[str, Value]]:
    """The body's instances, each {input name: value}; raises ProtocolError naming what and where.

    Two checks read the bytes before any parsing, so a hostile body costs milliseconds: more instances than
    `max_instances` (a scan that stops at the first one too many), and JSON whose parsed form would take more
    than `max_parse_bytes` of memory (`parse_cost`; None: no such limit).
    """
    if more_instances_than(body, max_instances):
        raise too_many_instances(max_instances)
    if max_parse_bytes is not None and (cost := parse_cost(body)) > max_parse_bytes:
        raise ProtocolError(f"the body's JSON would take about {cost / 2 ** 20:.0f} MB of memory to parse (many small "
                            f"values), more than {max_parse_bytes / 2 ** 20:.0f} MB; send large tensors as "
                            f'{{"b64": ..., "type": ..., "shape": [...]}}')
    message = _load_json(body)
    count = message.count("instances") if isinstance(message, _JsonObject) else 0
    if count != 1:
        raise ProtocolError(f"key 'instances' expects to exist once, but actually {count} times")
    instances = message["instances"]
    if isinstance(instances, _JsonObject):
        if not instances:
            raise ProtocolError("json object, value is empty: 'instances' holds no inputs")
        instances = [instances]
    elif not isinstance(instances, list) or (instances and not isinstance(instances[0], _JsonObject)):
        raise ProtocolError(f"instances no key mode is not supported: expected 'instances' to hold an object of "
                            f"inputs or a list of them, got {_json_kind(instances)}")
    if not instances:
        raise ProtocolError("instances value is array type, but no value")
    if len(instances) > max_instances:  # the scan gave up (a huge first instance) or met an escaped key
        raise too_many_instances(max_instances, len(instances))
    return [_parse_instance(index, instance) for index, instance in enumerate(instances)]


def too_many_instances(limit: int, count: Optional[int] = None) -> ProtocolError:
    """The refusal of a request over the instance limit (REST and gRPC); `count` when it is known exactly."""
    held = f"{count} instances, more than the limit of {limit}" if count is not None else \
        f"more than the limit of {limit} instances"
    return ProtocolError(f"the request holds {held} (--max-instances)")


_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_SHALLOW = re.compile(_STRING + rb"|[][{},:]")  # where keys and elements are told apart
_DEEP = re.compile(_STRING + rb"|[][{}]")  # inside an element: only its extent matters, numbers and commas skipped
SCAN_TOKENS = 10_000  # tokens one scan looks at before it leaves the count to the parse (~5 ms)


def more_instances_than(body: bytes, limit: int) -> bool:
    """Whether the body's top-level "instances" array holds more than `limit` elements, judged from its bytes
    without parsing: strings are skipped whole and brackets counted, and the scan stops at the element one
    past the limit, so 170,000 instances cost what 65 do (the parse of all of them took 0.4 s and 5 MB).

    False when the array holds at most `limit`, when the body is no JSON object, or when the scan gives up
    after SCAN_TOKENS tokens (a huge first instance): the parse then decides.
    """
    depth, pos, commas = 0, 0, 0
    string = key = None  # the root's last string, and the key whose value is being scanned
    inside = False  # within the root's "instances" array
    for _ in range(SCAN_TOKENS):
        match = (_SHALLOW if depth <= 1 or (inside and depth == 2) else _DEEP).search(body, pos)
        if match is None:
            return False
        token, pos = match.group(), match.end()
        if token in (b"[", b"{"):
            inside = inside or (depth == 1 and token == b"[" and key == "instances")
            depth += 1
        elif token in (b"]", b"}"):
            depth -= 1
            inside = inside and depth > 1
        elif depth == 1:
            if token == b",":
                key = None
            elif token == b":":
                key = string
            else:
                string = _text(token)
        elif inside and depth == 2 and token == b",":
            commas += 1
            if commas >= limit:  # the element after this comma is the (limit + 1)-th
                return True
    return False


def _text(token: bytes) -> Optional[str]:
    """A JSON string token's text (escapes resolved); None when it is not valid."""
    if b"\\" not in token:
        return token[1:-1].decode("utf-8", "replace")
    try:
        return json.loads(token)
    except ValueError:
        return None


# Bytes a parsed JSON body takes, an upper bound per character counted (CPython 3.11, measured with tracemalloc
# over 4 MB bodies of each shape): each '{' an object (with its first key, up to 200 B), each '[' a list (80 B),
# each ',' a value's object and slot (40 B; floats take 32), each '"' half a short string (56 B a string).
PARSE_COSTS = ((b"{", 200), (b"[", 80), (b",", 40), (b'"', 28))


def parse_cost(body: bytes) -> int:
    """An upper bound on the bytes `json.loads` takes for `body`, from character counts alone (C speed, a few
    ms for 32 MB): the decoded text and the strings' contents (2x the body) plus PARSE_COSTS. A body of base64
    images costs about 2x its size, one of `[],[],...` 40x (measured 22x), of `{},{},...` 80x (measured 28x)."""
    return 2 * len(body) + sum(body.count(char) * cost for char, cost in PARSE_COSTS)


def _load_json(body: bytes) -> Any:
    """The body as JSON, strict as MindSpore Serving's parser: UTF-8, no NaN/Infinity (1e400 parses as inf
    and is rejected with the other float32 overflows)."""
    if not body:
        raise ProtocolError("http message invalid: the body is empty")
    try:
        return json.loads(body.decode("utf-8-sig"), object_pairs_hook=_JsonObject,
                          parse_constant=_reject_constant)
    except UnicodeDecodeError as error:
        raise ProtocolError(f"Illegal JSON format. The body is not UTF-8: {error}") from None
    except RecursionError:
        raise ProtocolError("Illegal JSON format. The body nests too deeply") from None
    except ValueError as error:  # JSONDecodeError, or a number with too many digits
        raise ProtocolError(f"Illegal JSON format. {error}") from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if isinstance(value, _JsonObject):
        return "an object"
    kinds = {list: "an array", str: "a string", bool: "a bool", int: "an integer", float: "a float"}
    return kinds.get(type(value), "null")


def _parse_instance(index: int, instance: Any) -> Dict[str, Value]:
    where = f"instance {index}"
    if not isinstance(instance, _JsonObject):
        raise ProtocolError(f"{where}: json array, instance is not object type, got {_json_kind(instance)}")
    if not instance:
        raise ProtocolError(f"{where}: json array, instance is object type, but no value")
    inputs = {}
    for name, value in instance.items():
        if not name:
            raise ProtocolError(f"{where}: string key is empty")
        if instance.count(name) != 1:
            raise ProtocolError(f"{where}: key {_show(name)} expects to exist once, but actually "
                                f"{instance.count(name)} times")
        try:
            inputs[name] = _parse_value(value)
        except ProtocolError as error:
            raise ProtocolError(f"{where}, input {_show(name)}: {error}") from None
    return inputs


def _parse_value(value: Any) -> Value:
    if isinstance(value, _JsonObject):
        return _parse_object(value)
    if isinstance(value, list):
        return _parse_array(value)
    return _parse_scalar(value)


def _parse_scalar(value: Any) -> Value:
    if value is None:
        raise ProtocolError("json value is null, it is not supported")
    if isinstance(value, str):
        return value
    return _numbers(value, type(value))


def _numbers(values: Any, kind: type) -> np.ndarray:
    """A JSON number / bool or a rectangular list of them (all of type `kind`) as int32, float32 or bool_."""
    if kind is bool:
        return np.array(values, np.bool_)
    if kind is float:
        with np.errstate(over="ignore"):
            array = np.array(values, np.float32)
        if not np.isfinite(array).all():
            raise ProtocolError('json value is out of the float32 range; send it as {"b64": ..., "type": "fp64"}')
        return array
    array = np.array(values)  # int64, or uint64 / float64 / object once a value leaves int64
    if array.dtype.kind != "i" or array.min() < INT32.min or array.max() > INT32.max:
        raise ProtocolError('json value is out of the int32 range; send it as {"b64": ..., "type": "int64"}')
    return array.astype(np.int32)


def _parse_array(array: list) -> Value:
    """A nested list: its shape follows first elements (as MindSpore Serving's does), then every row must fit."""
    shape, first = [], array
    while isinstance(first, list) and first:
        shape.append(len(first))
        first = first[0]
    if not shape:
        raise ProtocolError("json array, shape is empty")
    if len(shape) > MAX_DIMS:
        raise ProtocolError(f"json array, shape has {len(shape)} dims, more than the {MAX_DIMS} supported")
    kind = type(first)
    if kind not in (int, float, bool, str, _JsonObject):
        raise ProtocolError(f"json array, data type is unknown: the first element is "
                            f"{'an empty array' if isinstance(first, list) else _json_kind(first)}")
    count = math.prod(shape)
    if kind is _JsonObject and first.get("type", "bytes") not in TEXT_TYPES:
        raise ProtocolError("json array, item is object type, object only support string or bytes type")
    if kind in (str, _JsonObject) and count != 1:
        raise ProtocolError(f"json array, string or bytes type only support one item, got shape {shape}")
    rows = [array]
    for depth, size in enumerate(shape):
        for row in rows:
            if not isinstance(row, list):
                raise ProtocolError("invalid json array: json type is not array")
            if len(row) != size:
                raise ProtocolError(f"invalid json array: json size is {len(row)}, the dim {depth} expected to be "
                                    f"{size}")
        if depth + 1 < len(shape):
            rows = [item for row in rows for item in row]
    kinds = {type(item) for row in rows for item in row}
    if kinds - {int, float, bool, str, _JsonObject}:
        raise ProtocolError("json array, data should be number, bool, string or bytes")
    if kinds != {kind}:
        raise ProtocolError(f"json array, elements type is not equal: expected every element to be "
                            f"{_json_kind(first)}, like the first")
    if kind is _JsonObject:
        return _parse_object(first)
    if kind is str:
        return first
    return _numbers(array, kind)


def _parse_object(obj: _JsonObject) -> Value:
    """{"b64": ..., "type": ..., "shape": [...]}, checked in MindSpore Serving's order."""
    if not obj:
        raise ProtocolError("json object, value is empty")
    if len(obj) > len(OBJECT_KEYS):
        raise ProtocolError("json object, items size is more than 3, only support specified ['b64', 'type', 'shape']")
    for key, value in obj.items():
        if key == "type":
            if not isinstance(value, str):
                raise ProtocolError("json object, key is 'type', value should be string type")
            if value not in TENSOR_TYPES and value not in TEXT_TYPES:
                raise ProtocolError(f"json object, specified type:{_show(value)} is illegal; expected one of "
                                    f"{', '.join(list(TENSOR_TYPES) + list(TEXT_TYPES))}")
        elif key == "shape":
            _check_shape(value)
        elif key != "b64":
            raise ProtocolError(f"json object, key is not ['b64', 'type', 'shape'], fail key:{_show(key)}")
    if obj.count("b64") != 1:
        raise ProtocolError(f"json object, 'b64' should be specified only one time, got {obj.count('b64')}")
    for key in ("type", "shape"):
        if obj.count(key) > 1:
            raise ProtocolError(f"json object, '{key}' should be specified no more than one time")
    type_name, shape = obj.get("type", "bytes"), obj.get("shape", [])
    count = math.prod(shape)
    if type_name in TEXT_TYPES and count != 1:
        raise ProtocolError(f"json object, only support scalar when data type is string or bytes, please check "
                            f"'type' or 'shape': shape {shape}")
    raw = _b64decode(obj["b64"])
    if type_name == "bytes":
        return raw
    if type_name == "str":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("json object, type is 'str' but the decoded 'b64' is not UTF-8 text") from None
    dtype = np.dtype(TENSOR_TYPES[type_name])
    if len(raw) != dtype.itemsize * count:
        raise ProtocolError(f"size is not matched, decode base64 size:{len(raw)}; Given info: type:{type_name}; "
                            f"type size:{dtype.itemsize}; element nums:{count}")
    if dtype.kind == "b":  # any nonzero byte is true; numpy would keep the raw byte
        return (np.frombuffer(raw, np.uint8) != 0).reshape(shape)
    return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _check_shape(shape: Any) -> None:
    if not isinstance(shape, list):
        raise ProtocolError(f"json object, key is 'shape', invalid shape value {_show(json.dumps(shape))}: "
                            f"value should be array type")
    bad = [dim for dim in shape if type(dim) is not int or not 0 <= dim <= MAX_DIM_SIZE]
    if bad or len(shape) > MAX_DIMS:
        raise ProtocolError(f"json object, key is 'shape', invalid shape value {_show(json.dumps(shape))}: "
                            f"expected at most {MAX_DIMS} integers in [0, {MAX_DIM_SIZE}]")


def _b64decode(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError(f"get scalar data failed, type is string, but json is not string type: 'b64' holds "
                            f"{_json_kind(text)}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{_show(text)} is illegal b64 encode string") from None


# ---- reply -------------------------------------------------------------------------------------------

def encode_reply(results: Sequence[Union[Mapping[str, Any], BaseException]]) -> bytes:
    """{"instances": [...]}: one entry per result, an exception becoming {"error_msg": ...} in its place.

    An output that JSON cannot carry (complex, None, a non-str name) fails only its own instance, so one
    servable bug never hides the other instances' answers.
    """
    return _dump({"instances": [_encode_instance(result) for result in results]})


def encode_error(message: str) -> bytes:
    """{"error_msg": message}: the whole request failed (still answered with HTTP 200, as MindSpore Serving does)."""
    return _dump({"error_msg": message})


def _dump(reply: Dict[str, Any]) -> bytes:
    return json.dumps(reply, ensure_ascii=False, separators=(",", ":"), allow_nan=False) \
        .encode("utf-8", errors="replace")


def _encode_instance(result: Union[Mapping[str, Any], BaseException]) -> Dict[str, Any]:
    if isinstance(result, InstanceError):
        return {"error_msg": str(result) or "the instance failed"}
    if isinstance(result, BaseException):
        return {"error_msg": f"{type(result).__name__}: {result}"}
    if not isinstance(result, Mapping):
        return {"error_msg": f"reply instance is {type(result).__name__}, not a dict of outputs"}
    if not result:
        return {"error_msg": "reply instance items is empty"}
    outputs = {}
    for name, value in result.items():
        if not isinstance(name, str):
            return {"error_msg": f"reply output name {name!r} is not a string"}
        try:
            outputs[name] = _encode_value(value)
        except TypeError as error:
            return {"error_msg": f"output {_show(name)}: {error}"}
    return outputs


def _encode_value(value: Any) -> Any:
    """Tensors as nested lists, 0-d as bare scalars, bytes as {"b64"}, non-finite floats as null (as nlohmann)."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind in "biuU" or (value.dtype.kind == "f" and np.isfinite(value).all()):
            return value.tolist()
        if value.dtype.kind not in "fSO":
            raise TypeError(f"dtype {value.dtype} cannot be sent in a reply")
        return _encode_items(value.tolist())
    return _encode_items(value)


def _encode_items(value: Any) -> Any:
    if isinstance(value, list):
        return [_encode_items(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):  # inside an object array or a list
        return _encode_value(value)
    raise TypeError(f"type {type(value).__name__} cannot be sent in a reply")
