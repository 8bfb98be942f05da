"""The MindSpore Serving 2.0 REST codec: URLs, every value encoding, every rejection, replies, and a fuzz."""
import base64
import json
import random

import numpy as np
import pytest

from mindvl.serving import protocol
from mindvl.serving.protocol import (SCAN_TOKENS, InstanceError, ProtocolError, encode_error, encode_reply,
                                     more_instances_than, parse_cost, parse_request, parse_url)


def body(instances) -> bytes:
    return json.dumps({"instances": instances}).encode()


def one_input(value, name="x"):
    """The decoded value of a one-instance, one-input request."""
    [instance] = parse_request(body([{name: value}]), max_instances=8)
    return instance[name]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


# ---- URL ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, expected", [
    ("/model/add:add_common", ("add", 0, "add_common")),
    ("/model/add/version/2:predict", ("add", 2, "predict")),
    ("/model/add/version/0:predict", ("add", 0, "predict")),
    ("/model/add/version/007:predict", ("add", 7, "predict")),
    ("model/vqa-1.2_b:answer", ("vqa-1.2_b", 0, "answer")),
    ("/model/my_version/version/4294967294:m", ("my_version", 4294967294, "m")),
])
def test_parse_url_reads_servable_version_and_method(path, expected):
    assert parse_url(path) == expected


@pytest.mark.parametrize("path, phrase", [
    ("", "the keyword:[model] must contain"),
    ("/add:predict", "the keyword:[model] must contain"),
    ("/models/add:predict", "the keyword:[model] must contain"),
    ("/model/:predict", "the keyword:[model] must contain"),
    ("/model//version/1:predict", "the keyword:[model] must contain"),
    ("/model/add", "the keyword:[service method] must contain"),
    ("/model/add:", "the keyword:[service method] must contain"),
    ("/model/add/version/1", "the keyword:[service method] must contain"),
    ("/model/add/version/x:predict", "the keyword:[version] value invalid"),
    ("/model/add/version/-1:predict", "the keyword:[version] value invalid"),
    ("/model/add/version/+1:predict", "the keyword:[version] value invalid"),
    ("/model/add/version/:predict", "the keyword:[version] value invalid"),
    ("/model/add/version/1/x:predict", "the keyword:[version] value invalid"),
    ("/model/add/version/4294967295:predict", "version number range failed"),
    ("/model/add/version/" + "9" * 5000 + ":predict", "version number range failed"),
    ("/model/add/versions/1:predict", "expected /model/<servable>[/version/<n>]:<method>"),
    ("/model/add/version:predict", "expected /model/<servable>[/version/<n>]:<method>"),
    ("/model/add/extra:predict", "expected /model/<servable>[/version/<n>]:<method>"),
    ("/model/..:predict", "invalid servable name '..'"),
    ("/model/.:predict", "invalid servable name '.'"),
    ("/model/a/../b:predict", "expected /model/<servable>[/version/<n>]:<method>"),
    ("/model/../../etc/passwd:predict", "expected /model/<servable>[/version/<n>]:<method>"),
    ("/model/a%2F..:predict", "invalid servable name"),
    ("/model/a b:predict", "invalid servable name"),
    ("/model/add:..", "invalid method name '..'"),
    ("/model/add:predict/../x", "invalid method name"),
    ("/model/add:a:b", "invalid method name"),
    ("/model/add:predict?x=1", "invalid method name"),
])
def test_parse_url_rejects_bad_forms_and_traversal(path, phrase):
    with pytest.raises(ProtocolError, match="please check url") as error:
        parse_url(path)
    assert phrase in str(error.value)


# ---- request: values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, dtype, expected", [
    (3, np.int32, 3),
    (-2147483648, np.int32, -2147483648),
    (2.5, np.float32, 2.5),
    (1e-3, np.float32, np.float32(1e-3)),
    (True, np.bool_, True),
    (False, np.bool_, False),
])
def test_json_scalars_decode_to_0d_arrays(value, dtype, expected):
    decoded = one_input(value)
    assert isinstance(decoded, np.ndarray) and decoded.shape == () and decoded.dtype == dtype
    assert decoded == expected


def test_json_string_decodes_to_str():
    assert one_input("what color is the shape?") == "what color is the shape?"


@pytest.mark.parametrize("value, dtype", [
    ([1, 2, 3], np.int32),
    ([[1, -2], [3, 4], [5, 6]], np.int32),
    ([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], np.int32),
    ([0.5, 1.5], np.float32),
    ([[0.5], [1.0]], np.float32),
    ([[[0.25, 0.5, 0.75]], [[1.0, 1.25, 1.5]]], np.float32),
    ([True, False], np.bool_),
    ([[True], [False]], np.bool_),
    ([[[True, False]], [[False, True]]], np.bool_),
])
def test_nested_lists_decode_to_tensors(value, dtype):
    decoded = one_input(value)
    assert decoded.dtype == dtype
    np.testing.assert_array_equal(decoded, np.array(value, dtype))
    assert decoded.shape == np.array(value).shape


@pytest.mark.parametrize("value", [["a question"], [["a question"]], [[["a question"]]]])
def test_list_of_one_string_decodes_to_str(value):
    assert one_input(value) == "a question"


@pytest.mark.parametrize("type_name, dtype", [
    ("int8", np.int8), ("int16", np.int16), ("int32", np.int32), ("int64", np.int64),
    ("uint8", np.uint8), ("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64),
    ("fp16", np.float16), ("float16", np.float16), ("fp32", np.float32), ("float32", np.float32),
    ("fp64", np.float64), ("float64", np.float64),
])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 2)])
def test_b64_tensors_round_trip_every_dtype(type_name, dtype, shape):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    decoded = one_input({"b64": b64(array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()),
                         "type": type_name, "shape": list(shape)})
    assert decoded.dtype == dtype and decoded.shape == shape and decoded.flags.writeable
    np.testing.assert_array_equal(decoded, array)


def test_b64_without_shape_is_a_scalar():
    decoded = one_input({"b64": b64(np.int64(-5).tobytes()), "type": "int64"})
    assert decoded.shape == () and decoded == -5


def test_b64_bool_reads_any_nonzero_byte_as_true():
    decoded = one_input({"b64": b64(bytes([0, 1, 2, 255])), "type": "bool", "shape": [2, 2]})
    assert decoded.dtype == np.bool_
    np.testing.assert_array_equal(decoded, [[False, True], [True, True]])


def test_b64_with_a_zero_dim_is_an_empty_tensor():
    decoded = one_input({"b64": "", "type": "float32", "shape": [3, 0]})
    assert decoded.shape == (3, 0) and decoded.dtype == np.float32


def test_b64_defaults_to_bytes():
    assert one_input({"b64": b64(b"\x89PNG\r\n\x00")}) == b"\x89PNG\r\n\x00"


@pytest.mark.parametrize("obj, expected", [
    ({"b64": b64("héllo".encode()), "type": "str"}, "héllo"),
    ({"b64": b64(b"raw"), "type": "bytes"}, b"raw"),
    ({"b64": b64(b"raw"), "type": "bytes", "shape": [1]}, b"raw"),
    ({"b64": b64(b"raw"), "shape": [1, 1]}, b"raw"),
    ({"b64": b64(b"raw"), "type": "str", "shape": []}, "raw"),
    ({"b64": ""}, b""),
])
def test_b64_str_and_bytes_decode_to_python_values(obj, expected):
    assert one_input(obj) == expected


@pytest.mark.parametrize("value, expected", [
    ([{"b64": b64(b"img")}], b"img"),
    ([[{"b64": b64(b"text"), "type": "str"}]], "text"),
])
def test_list_of_one_b64_object_decodes_to_its_value(value, expected):
    assert one_input(value) == expected


def test_instances_may_be_one_object():
    instances = parse_request(json.dumps({"instances": {"a": 1, "b": "q"}}).encode(), max_instances=1)
    assert len(instances) == 1 and instances[0]["a"] == 1 and instances[0]["b"] == "q"


def test_several_instances_keep_order_and_other_top_level_keys_are_ignored():
    request = {"meta": {"id": 7}, "instances": [{"x": i, "y": [float(i)]} for i in range(4)]}
    instances = parse_request(json.dumps(request).encode(), max_instances=4)
    assert [int(instance["x"]) for instance in instances] == [0, 1, 2, 3]
    assert [instance["y"].tolist() for instance in instances] == [[0.0], [1.0], [2.0], [3.0]]


@pytest.fixture
def parses(monkeypatch):
    """The bodies handed to the JSON parser, in order (it still parses them)."""
    seen = []
    parse = protocol._load_json
    monkeypatch.setattr(protocol, "_load_json", lambda raw: seen.append(raw) or parse(raw))
    return seen


def test_more_instances_than_the_limit_are_refused_before_any_parsing(parses):
    """170,000 instances (4.9 MB) are refused from a scan of the first three; nothing reaches the parser."""
    with pytest.raises(ProtocolError, match=r"^the request holds more than the limit of 2 instances "
                                            r"\(--max-instances\)$"):
        parse_request(body([{"x": 1}] * 3), max_instances=2)
    with pytest.raises(ProtocolError, match="more than the limit of 64 instances"):
        parse_request(body([{"text": "what shape is it"}] * 170_000), max_instances=64)
    assert parses == []
    assert len(parse_request(body([{"x": 1}] * 2), max_instances=2)) == 2 and len(parses) == 1


@pytest.mark.parametrize("raw, limit, more", [
    (b'{"instances": [{"x": 1}, {"x": 2}, {"x": 3}]}', 2, True),
    (b'{"instances": [{"x": 1}, {"x": 2}]}', 2, False),
    (b'{"instances": []}', 1, False),
    (b'{"instances": {"x": [1, 2, 3]}}', 1, False),  # one instance given as an object
    (b'{"meta": [1, 2, 3, 4], "instances": [{"x": [1, 2, 3]}, {"y": "],[,{"}]}', 2, False),  # other keys, nesting
    (b'{"instances": [{"s": "a\\"],"}, {}, {}]}', 2, True),  # an escaped quote inside a string
    (b'{"\\u0069nstances": [1, 2, 3]}', 2, True),  # an escaped key is the same key
    (b'{"a": "instances", "b": [1, 2, 3]}', 2, False),  # a value, not a key
    (b'{"a": {"instances": [1, 2, 3]}}', 2, False),  # not the root's key
    (b'[1, 2, 3]', 2, False),
    (b'\xef\xbb\xbf {"instances" : [ {} , {} , {} ] }', 2, True),  # a BOM and spaces
])
def test_the_instance_scan_counts_the_root_instances_array_only(raw, limit, more):
    assert more_instances_than(raw, limit) is more


def test_a_scan_that_gives_up_leaves_the_exact_count_to_the_parse(parses):
    """A first instance of more than SCAN_TOKENS brackets ends the scan; the parsed list is then counted."""
    raw = body([{"x": [[]] * SCAN_TOKENS}] + [{"x": 1}] * 3)
    assert not more_instances_than(raw, 2)
    with pytest.raises(ProtocolError, match=r"^the request holds 4 instances, more than the limit of 2 "
                                            r"\(--max-instances\)$"):
        parse_request(raw, max_instances=2)
    assert parses == [raw]


def test_a_body_of_many_small_values_is_refused_before_parsing(parses):
    """`{},{},...` and `[],[],...` take 28x and 22x their size once parsed: refused from their character counts,
    while base64 bodies (2x) and float lists (5x to 9x) within the limit parse."""
    limit = 8 * 2 ** 20
    objects = b'{"instances": [{"x": [' + b"{}," * 300_000 + b'{}]}]}'
    with pytest.raises(ProtocolError, match=r"^the body's JSON would take about 70 MB of memory to parse \(many small "
                                            r"values\), more than 8 MB; send large tensors as \{\"b64\""):
        parse_request(objects, max_instances=1, max_parse_bytes=limit)
    assert parses == []
    image = body([{"x": {"b64": b64(bytes(3 * 2 ** 20 // 4 * 3))}}])
    floats = body([{"x": [0.123456] * 100_000}])
    assert parse_cost(image) < limit and parse_cost(floats) < limit
    for raw in (image, floats):
        assert len(parse_request(raw, max_instances=1, max_parse_bytes=limit)) == 1


# ---- request: rejections -----------------------------------------------------------------------------

WHOLE_REQUEST_ERRORS = [
    (b"", "http message invalid"),
    (b"{", "Illegal JSON format."),
    (b'{"instances": [{"x": 1}]', "Illegal JSON format."),
    (b'\xff\xfe{"instances": 1}', "Illegal JSON format."),
    (b'{"instances": [{"x": NaN}]}', "Illegal JSON format."),
    (b'{"instances": [{"x": -Infinity}]}', "Illegal JSON format."),
    (b'{"instances": [{"x": [1e400]}]}', "instance 0, input 'x': json value is out of the float32 range"),
    (b'{"instances": [{"x": ' + b"1" * 5000 + b"}]}", "Illegal JSON format."),
    (b'{"instances": [{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}]}", "Illegal JSON format."),
    (b"[1, 2]", "key 'instances' expects to exist once, but actually 0 times"),
    (b'"instances"', "key 'instances' expects to exist once, but actually 0 times"),
    (b"{}", "key 'instances' expects to exist once, but actually 0 times"),
    (b'{"Instances": [{"x": 1}]}', "key 'instances' expects to exist once, but actually 0 times"),
    (b'{"instances": [{"x": 1}], "instances": [{"x": 2}]}',
     "key 'instances' expects to exist once, but actually 2 times"),
    (b'{"instances": 1, "instances": 2, "instances": [{"x": 2}]}',
     "key 'instances' expects to exist once, but actually 3 times"),
    (b'{"instances": 1}', "instances no key mode is not supported"),
    (b'{"instances": "x"}', "instances no key mode is not supported"),
    (b'{"instances": null}', "instances no key mode is not supported"),
    (b'{"instances": [1, {"x": 1}]}', "instances no key mode is not supported"),
    (b'{"instances": []}', "instances value is array type, but no value"),
    (b'{"instances": {}}', "json object, value is empty"),
    (b'{"instances": [{"x": 1}, 2]}', "instance 1: json array, instance is not object type"),
    (b'{"instances": [{"x": 1}, {}]}', "instance 1: json array, instance is object type, but no value"),
    (b'{"instances": [{"": 1}]}', "instance 0: string key is empty"),
    (b'{"instances": [{"x": 1, "x": 2}]}', "instance 0: key 'x' expects to exist once, but actually 2 times"),
]


@pytest.mark.parametrize("raw, phrase", WHOLE_REQUEST_ERRORS)
def test_malformed_requests_are_rejected(raw, phrase):
    with pytest.raises(ProtocolError) as error:
        parse_request(raw, max_instances=8)
    assert phrase in str(error.value)


VALUE_ERRORS = [
    (None, "json value is null, it is not supported"),
    (2 ** 31, "out of the int32 range"),
    (-2 ** 31 - 1, "out of the int32 range"),
    ([1, 2 ** 40], "out of the int32 range"),
    ([1, 2 ** 64], "out of the int32 range"),
    (1e39, "out of the float32 range"),
    ([0.5, -1e39], "out of the float32 range"),
    ([1, 2.0], "json array, elements type is not equal"),
    ([1.0, 2], "json array, elements type is not equal"),
    ([True, 1], "json array, elements type is not equal"),
    ([1, False], "json array, elements type is not equal"),
    ([[1.5, 2.5], [3.5, True]], "json array, elements type is not equal"),
    ([1, "a"], "json array, elements type is not equal"),
    ([[1, 2], [3]], "invalid json array: json size is 1, the dim 1 expected to be 2"),
    ([[[1], [2]], [[3], [4], [5]]], "invalid json array: json size is 3, the dim 1 expected to be 2"),
    ([[[1, 2]], [[3]]], "invalid json array: json size is 1, the dim 2 expected to be 2"),
    ([[1, 2], 3], "invalid json array: json type is not array"),
    ([1, [2]], "json array, data should be number, bool, string or bytes"),
    ([1, None], "json array, data should be number, bool, string or bytes"),
    ([], "json array, shape is empty"),
    ([[]], "json array, data type is unknown"),
    ([None], "json array, data type is unknown"),
    (nested(33), "json array, shape has 33 dims"),
    (["a", "b"], "json array, string or bytes type only support one item"),
    ([["a"], ["b"]], "json array, string or bytes type only support one item"),
    ([{"b64": "YQ=="}, {"b64": "Yg=="}], "json array, string or bytes type only support one item"),
    ([{"b64": "AAAAAA==", "type": "int32"}], "json array, item is object type, object only support string or bytes"),
    ([{"b64": "YQ==", "type": "wat"}], "json array, item is object type, object only support string or bytes"),
    ([{"b64": "!!!!"}], "is illegal b64 encode string"),
    ({}, "json object, value is empty"),
    ({"b64": "", "type": "int32", "shape": [0], "extra": 1}, "json object, items size is more than 3"),
    ({"b64": "", "data": 1}, "json object, key is not ['b64', 'type', 'shape'], fail key:'data'"),
    ({"type": "int32"}, "json object, 'b64' should be specified only one time"),
    ({"type": "int32", "shape": [1]}, "json object, 'b64' should be specified only one time"),
    ({"type": 5, "b64": ""}, "json object, key is 'type', value should be string type"),
    ({"b64": "", "type": "x"}, "json object, specified type:'x' is illegal"),
    ({"b64": "", "type": "INT32"}, "json object, specified type:'INT32' is illegal"),
    ({"b64": "", "type": "bfloat16"}, "json object, specified type:'bfloat16' is illegal"),
    ({"b64": "", "shape": "3"}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "shape": 3}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": [-1]}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": [1.5]}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": [True]}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": ["2"]}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": [0, 2 ** 31]}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "", "type": "int8", "shape": [1] * 33}, "json object, key is 'shape', invalid shape value"),
    ({"b64": "AAA", "type": "int8"}, "'AAA' is illegal b64 encode string"),
    ({"b64": "AA!A", "type": "int8"}, "is illegal b64 encode string"),
    ({"b64": "AA==AA==", "type": "int8"}, "is illegal b64 encode string"),
    ({"b64": 123}, "but json is not string type"),
    ({"b64": ["AA=="]}, "but json is not string type"),
    ({"b64": b64(bytes(4)), "type": "int32", "shape": [2]}, "size is not matched"),
    ({"b64": b64(bytes(4)), "type": "int32", "shape": [2]}, "decode base64 size:4; Given info: type:int32"),
    ({"b64": b64(bytes(3)), "type": "fp16"}, "size is not matched"),
    ({"b64": b64(bytes(1)), "type": "bool", "shape": [2]}, "size is not matched"),
    ({"b64": b64(b"ab"), "type": "str", "shape": [2]}, "only support scalar when data type is string or bytes"),
    ({"b64": b64(b"ab"), "shape": [0]}, "only support scalar when data type is string or bytes"),
    ({"b64": b64(b"\xff\xfe"), "type": "str"}, "is not UTF-8 text"),
]


@pytest.mark.parametrize("value, phrase", VALUE_ERRORS)
def test_bad_values_are_rejected_naming_instance_and_input(value, phrase):
    raw = body([{"ok": 1}, {"ok": 2, "image": value}])
    with pytest.raises(ProtocolError) as error:
        parse_request(raw, max_instances=8)
    message = str(error.value)
    assert message.startswith("instance 1, input 'image': ")
    assert phrase in message


@pytest.mark.parametrize("key", ["b64", "type", "shape"])
def test_b64_object_keys_given_twice_are_rejected(key):
    fields = {"b64": '"AAAAAA=="', "type": '"int32"', "shape": "[1]"}
    pairs = [f'"{k}": {v}' for k, v in fields.items()] + [f'"{key}": {fields[key]}']
    raw = ('{"instances": [{"x": {' + ", ".join(pairs) + "}}]}").encode()
    with pytest.raises(ProtocolError) as error:
        parse_request(raw, max_instances=1)
    expected = "'b64' should be specified only one time" if key == "b64" else \
        f"'{key}' should be specified no more than one time"
    assert expected in str(error.value)


def test_long_user_text_is_cut_short_in_messages():
    with pytest.raises(ProtocolError) as error:
        one_input({"b64": "A" * 100001})
    assert len(str(error.value)) < 200 and "is illegal b64 encode string" in str(error.value)


# ---- reply -------------------------------------------------------------------------------------------

def decode(raw: bytes):
    return json.loads(raw.decode("utf-8"))


def test_reply_renders_tensors_as_nested_lists_and_0d_as_scalars():
    outputs = {
        "logits": np.array([[0.5, -1.25], [2.0, 0.0]], np.float32),
        "half": np.array([0.5, 1.5], np.float16),
        "ids": np.arange(6, dtype=np.int32).reshape(1, 2, 3),
        "pixels": np.array([0, 255], np.uint8),
        "mask": np.array([True, False]),
        "count": np.array(7, np.int64),
        "score": np.float32(0.75),
        "index": np.int64(3),
        "flag": np.bool_(True),
        "py": 1.5,
        "py_int": 4,
    }
    reply = decode(encode_reply([outputs]))
    assert reply == {"instances": [{
        "logits": [[0.5, -1.25], [2.0, 0.0]], "half": [0.5, 1.5], "ids": [[[0, 1, 2], [3, 4, 5]]],
        "pixels": [0, 255], "mask": [True, False], "count": 7, "score": 0.75, "index": 3, "flag": True,
        "py": 1.5, "py_int": 4,
    }]}
    assert isinstance(reply["instances"][0]["score"], float) and isinstance(reply["instances"][0]["count"], int)


def test_reply_renders_float32_as_json_numbers():
    reply = decode(encode_reply([{"p": np.array([0.1], np.float32)}]))
    [value] = reply["instances"][0]["p"]
    assert isinstance(value, float) and np.float32(value) == np.float32(0.1)


def test_reply_renders_strings_as_strings_and_bytes_as_b64():
    outputs = {"answer": "red", "np_answer": np.str_("blue"), "answers": np.array(["yes", "no"]),
               "png": b"\x89PNG", "blobs": np.array([b"ab", b"c"]), "objects": np.array(["x", b"y"], dtype=object)}
    reply = decode(encode_reply([outputs]))
    assert reply["instances"][0] == {
        "answer": "red", "np_answer": "blue", "answers": ["yes", "no"], "png": {"b64": b64(b"\x89PNG")},
        "blobs": [{"b64": b64(b"ab")}, {"b64": b64(b"c")}], "objects": ["x", {"b64": b64(b"y")}]}


def test_reply_puts_error_msg_in_a_failed_instances_place():
    results = [{"y": np.int32(1)}, InstanceError("image: expected (224, 224, 3), got (2, 2)"),
               ValueError("bad pixel"), {"y": np.int32(3)}]
    assert decode(encode_reply(results)) == {"instances": [
        {"y": 1}, {"error_msg": "image: expected (224, 224, 3), got (2, 2)"},
        {"error_msg": "ValueError: bad pixel"}, {"y": 3}]}


@pytest.mark.parametrize("outputs, phrase", [
    ({"z": np.array([1 + 2j])}, "dtype complex128 cannot be sent in a reply"),
    ({"z": None}, "type NoneType cannot be sent in a reply"),
    ({"z": {"nested": 1}}, "type dict cannot be sent in a reply"),
    ({"z": np.array([None], dtype=object)}, "type NoneType cannot be sent in a reply"),
    ({1: np.int32(1)}, "reply output name 1 is not a string"),
    ({}, "reply instance items is empty"),
    ([np.int32(1)], "reply instance is list, not a dict of outputs"),
])
def test_reply_fails_only_the_instance_whose_outputs_json_cannot_carry(outputs, phrase):
    reply = decode(encode_reply([outputs, {"ok": 1}]))
    assert phrase in reply["instances"][0]["error_msg"]
    assert reply["instances"][1] == {"ok": 1}


def test_reply_renders_non_finite_floats_as_null_like_nlohmann():
    reply = decode(encode_reply([{"p": np.array([1.0, np.nan, np.inf], np.float32), "q": float("-inf")}]))
    assert reply["instances"][0] == {"p": [1.0, None, None], "q": None}


def test_whole_request_error_is_a_bare_error_msg():
    assert decode(encode_error("key 'instances' expects to exist once, but actually 2 times")) == \
        {"error_msg": "key 'instances' expects to exist once, but actually 2 times"}
    assert decode(encode_error("ünïcode")) == {"error_msg": "ünïcode"}


def test_parsed_values_survive_a_reply_round_trip():
    outputs = parse_request(body([{"a": [[1, 2]], "b": 0.5, "c": "q", "d": {"b64": b64(b"z")}}]), 1)
    assert decode(encode_reply(outputs)) == {"instances": [{"a": [[1, 2]], "b": 0.5, "c": "q",
                                                            "d": {"b64": b64(b"z")}}]}


# ---- fuzz --------------------------------------------------------------------------------------------

VALID_BODIES = [
    body([{"x": 1, "y": 2.5, "z": True, "q": "what?"}]),
    body({"image": [[[0.5, 0.25]], [[1.0, 0.0]]], "ids": [[1, 2, 3]]}),
    body([{"t": {"b64": b64(np.arange(6, dtype=np.int16).tobytes()), "type": "int16", "shape": [2, 3]}},
          {"t": {"b64": b64(b"png"), "type": "bytes"}}, {"t": [{"b64": b64(b"s"), "type": "str"}]}]),
    body([{"m": [[True, False], [False, True]], "s": ["one"]}, {"m": [[False, False], [True, True]], "s": "two"}]),
]
FRAGMENTS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"null", b"true", b"-", b"1e999", b"NaN", b'"instances":',
             b'{"b64":', b'"type":"int8"', b'"shape":[-1]', b"\\u0000", b"\xff", b"[[[[", b"0.5", b"[]", b"{}"]
JSON_VALUES = [None, True, 0, -1, 2 ** 40, 0.5, 1e39, "", "x", [], [[]], [1, 2.0], [[1], [2, 3]], ["a", "b"], {},
               {"b64": "AA=="}, {"b64": "AA==", "type": "int8", "shape": [1]}, {"b64": "A", "type": "fp16"},
               {"b64": "AAAA", "type": "int16", "shape": [1, 1]}, {"shape": [2]}, {"type": "str", "b64": "/w=="}]


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(len(data) + 1)
        action = rng.randrange(5)
        if action == 0 and data:  # flip one byte
            data[min(position, len(data) - 1)] = rng.randrange(256)
        elif action == 1:  # truncate
            del data[position:]
        elif action == 2:  # insert a JSON fragment
            data[position:position] = rng.choice(FRAGMENTS)
        elif action == 3:  # delete a span
            del data[position:position + rng.randint(1, 8)]
        else:  # repeat a span
            data[position:position] = data[position:position + rng.randint(1, 16)]
    return bytes(data)


def mutate_json(rng: random.Random, raw: bytes) -> bytes:
    """The body with one random node (object member or list item) replaced by a random JSON value."""
    tree = json.loads(raw)
    containers = [tree]
    for container in containers:
        children = container.values() if isinstance(container, dict) else container
        containers.extend(child for child in children if isinstance(child, (dict, list)) and child)
    target = rng.choice(containers)
    key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
    target[key] = rng.choice(JSON_VALUES)
    return json.dumps(tree).encode()


def test_fuzzed_bodies_either_parse_or_raise_protocol_error():
    rng = random.Random(20240607)
    outcomes = {"parsed": 0, "rejected": 0}
    for index in range(1000):
        mutate = mutate_json if index % 2 else mutate_bytes
        raw = mutate(rng, rng.choice(VALID_BODIES))
        try:
            instances = parse_request(raw, max_instances=4)
        except ProtocolError:
            outcomes["rejected"] += 1
            continue
        encode_reply(instances)  # whatever parses can also be echoed back
        outcomes["parsed"] += 1
    assert outcomes["parsed"] > 100 and outcomes["rejected"] > 500, outcomes
