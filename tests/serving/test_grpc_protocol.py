"""The gRPC protocol: ms_service.proto's wire format, the tensor codec, request/reply layout and a real Predict call."""
import asyncio
import struct
from concurrent import futures

import grpc
import numpy as np
import pytest

from mindvl.serving.grpc_protocol import (
    PREDICT_METHOD, POOL, WIRE_TYPES, DataType, ErrorCode, ErrorMsg, Instance, PredictReply, PredictRequest,
    RequestFailed, ServableSpec, Tensor, TensorShape, add_predict_handler, instances_to_request, predict_stub,
    reply_from_error, reply_from_results, request_to_instances, results_from_reply, tensor_from_proto,
    tensor_to_proto)
from mindvl.serving.protocol import MAX_VERSION, InstanceError, ProtocolError


def _over_the_wire(message):
    return type(message).FromString(message.SerializeToString())


def _sample(dtype: np.dtype, shape, rng) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


# ---- tensors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4)], ids=["0d", "1d", "3d"])
@pytest.mark.parametrize("data_type", list(WIRE_TYPES), ids=lambda data_type: data_type.name)
def test_numeric_tensor_round_trips_little_endian_row_major(data_type, shape):
    wire = WIRE_TYPES[data_type]
    array = _sample(wire.newbyteorder("="), shape, np.random.default_rng(int(data_type)))

    tensor = _over_the_wire(tensor_to_proto(array))
    decoded = tensor_from_proto(tensor)

    assert tensor.dtype == data_type and list(tensor.shape.dims) == list(shape)
    assert tensor.data == array.astype(wire).tobytes(order="C")
    assert decoded.dtype == array.dtype and decoded.shape == shape and decoded.flags.writeable
    np.testing.assert_array_equal(decoded, array)


def test_big_endian_transposed_array_is_sent_little_endian_row_major():
    array = np.arange(6, dtype=">u2").reshape(2, 3).T  # (3, 2): rows [0, 3], [1, 4], [2, 5]

    tensor = tensor_to_proto(array)

    assert tensor.dtype == DataType.MS_UINT16 and list(tensor.shape.dims) == [3, 2]
    assert tensor.data == struct.pack("<6H", 0, 3, 1, 4, 2, 5)
    np.testing.assert_array_equal(tensor_from_proto(tensor), array)


@pytest.mark.parametrize("value, data_type, dtype", [
    (True, DataType.MS_BOOL, np.bool_), (7, DataType.MS_INT64, np.int64), (0.5, DataType.MS_FLOAT64, np.float64),
    (np.float16(1.5), DataType.MS_FLOAT16, np.float16), (np.bool_(False), DataType.MS_BOOL, np.bool_)])
def test_scalars_travel_as_0d_tensors(value, data_type, dtype):
    tensor = tensor_to_proto(value)
    decoded = tensor_from_proto(tensor)

    assert tensor.dtype == data_type and list(tensor.shape.dims) == []
    assert decoded.shape == () and decoded.dtype == dtype and decoded == value


def test_bool_data_reads_any_nonzero_byte_as_true():
    tensor = Tensor(shape=TensorShape(dims=[3]), dtype=DataType.MS_BOOL, data=b"\x00\x02\xff")

    np.testing.assert_array_equal(tensor_from_proto(tensor), [False, True, True])


@pytest.mark.parametrize("value, data_type", [("héllo ✓", DataType.MS_STRING), ("", DataType.MS_STRING),
                                              (b"\x00\xff\x89PNG", DataType.MS_BYTES), (b"", DataType.MS_BYTES)])
def test_str_and_bytes_travel_as_one_item(value, data_type):
    tensor = _over_the_wire(tensor_to_proto(value))

    assert tensor.dtype == data_type and list(tensor.shape.dims) == [] and len(tensor.bytes_val) == 1
    assert tensor.bytes_val[0] == (value.encode("utf-8") if isinstance(value, str) else value)
    assert tensor_from_proto(tensor) == value and type(tensor_from_proto(tensor)) is type(value)


def test_string_with_shape_1_as_mindspore_client_sends_is_accepted():
    tensor = Tensor(shape=TensorShape(dims=[1]), dtype=DataType.MS_STRING, bytes_val=["hi".encode()])

    assert tensor_from_proto(tensor) == "hi"


@pytest.mark.parametrize("fields, phrase", [
    ({"dtype": DataType.MS_UNKNOWN}, "input data type MS_UNKNOWN invalid"),
    ({"dtype": 99}, "input data type 99 invalid"),
    ({"dtype": DataType.MS_INT32, "shape": {"dims": [2]}, "data": b"\0" * 7},
     "input data size 7 invalid: shape [2] of MS_INT32 needs 8 bytes"),
    ({"dtype": DataType.MS_FLOAT16, "shape": {"dims": [2, 2]}, "data": b"\0" * 10}, "needs 8 bytes"),
    ({"dtype": DataType.MS_UINT8, "shape": {"dims": [2, -1]}, "data": b""}, "input shape [2, -1] invalid"),
    ({"dtype": DataType.MS_UINT8, "shape": {"dims": [1] * 33}, "data": b"\0"}, "at most 32 dims"),
    ({"dtype": DataType.MS_STRING}, "batch size can only be 1, got 0 items"),
    ({"dtype": DataType.MS_BYTES, "bytes_val": [b"a", b"b"]}, "batch size can only be 1, got 2 items"),
    ({"dtype": DataType.MS_STRING, "bytes_val": [b"a"], "shape": {"dims": [2]}},
     "shape can only be (1,) or empty, but given shape is [2]"),
    ({"dtype": DataType.MS_STRING, "bytes_val": [b"\xff\xfe"]}, "string type input is not UTF-8 text"),
])
def test_malformed_tensor_is_a_protocol_error(fields, phrase):
    with pytest.raises(ProtocolError, match="check failed") as error:
        tensor_from_proto(Tensor(**fields))
    assert phrase in str(error.value)


@pytest.mark.parametrize("value, phrase", [
    (np.ones(2, np.complex64), "dtype complex64 cannot be sent"), (np.array(["a"]), "dtype <U1 cannot be sent"),
    (2 ** 70, "dtype object cannot be sent"), ([1, 2], "type list cannot be sent"), (None, "type NoneType")])
def test_value_without_a_wire_type_is_a_protocol_error(value, phrase):
    with pytest.raises(ProtocolError, match=phrase):
        tensor_to_proto(value)


# ---- wire format -------------------------------------------------------------------------------------

def _varint(number: int) -> bytes:
    out = b""
    while number >= 0x80:
        out += bytes([number & 0x7F | 0x80])
        number >>= 7
    return out + bytes([number])


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_request_bytes_match_ms_service_proto_field_numbers():
    spec = _bytes_field(1, b"add") + _bytes_field(2, b"add_cast") + _varint_field(3, 2)
    image = _bytes_field(1, _bytes_field(1, b"\x02\x03")) + _varint_field(2, 3) + _bytes_field(3, bytes(range(6)))
    text = _varint_field(2, 13) + _bytes_field(4, b"hi")
    instance = _bytes_field(1, _bytes_field(1, b"image") + _bytes_field(2, image)) \
        + _bytes_field(1, _bytes_field(1, b"text") + _bytes_field(2, text))
    wire = _bytes_field(1, spec) + _bytes_field(2, instance)  # built by hand from ms_service.proto's numbers

    request = instances_to_request("add", "add_cast", 2, [{"image": np.arange(6, dtype=np.uint8).reshape(2, 3),
                                                           "text": "hi"}])
    servable, method, version, instances = request_to_instances(PredictRequest.FromString(wire))

    assert request.SerializeToString(deterministic=True) == wire
    assert (servable, method, version, instances[0]["text"]) == ("add", "add_cast", 2, "hi")
    np.testing.assert_array_equal(instances[0]["image"], np.arange(6).reshape(2, 3))


def test_reply_bytes_match_ms_service_proto_field_numbers():
    spec = _bytes_field(1, b"add") + _bytes_field(2, b"add_cast")
    answer = _bytes_field(1, _bytes_field(1, b"y") + _bytes_field(2, _varint_field(2, 13) + _bytes_field(4, b"ok")))
    wire = (_bytes_field(1, spec) + _bytes_field(3, answer) + _bytes_field(3, b"")
            + _bytes_field(4, b"") + _bytes_field(4, _varint_field(1, 1) + _bytes_field(2, b"boom")))

    reply = reply_from_results(ServableSpec(name="add", method_name="add_cast"), [{"y": "ok"}, InstanceError("boom")])
    results = results_from_reply(PredictReply.FromString(wire))

    assert reply.SerializeToString(deterministic=True) == wire
    assert results[0] == {"y": "ok"} and isinstance(results[1], InstanceError) and str(results[1]) == "boom"


def test_service_descriptor_declares_predict():
    method = POOL.FindMethodByName("mindspore.serving.proto.MSService.Predict")

    assert PREDICT_METHOD == "/mindspore.serving.proto.MSService/Predict"
    assert (method.input_type.name, method.output_type.name) == ("PredictRequest", "PredictReply")
    assert POOL.FindMessageTypeByName("mindspore.serving.proto.Instance.ItemsEntry").GetOptions().map_entry


# ---- requests ----------------------------------------------------------------------------------------

def test_request_round_trips_instances():
    instances = [{"x": np.arange(4, dtype=np.float32).reshape(2, 2), "label": "cat", "raw": b"\x01"},
                 {"x": np.float32(3.5), "label": "", "raw": b""}]

    servable, method, version, decoded = request_to_instances(
        _over_the_wire(instances_to_request("vqa", "answer", 3, instances)))

    assert (servable, method, version) == ("vqa", "answer", 3)
    assert [sorted(item) for item in decoded] == [["label", "raw", "x"]] * 2
    for sent, received in zip(instances, decoded):
        assert received["label"] == sent["label"] and received["raw"] == sent["raw"]
        np.testing.assert_array_equal(received["x"], sent["x"])
        assert received["x"].dtype == np.float32


@pytest.mark.parametrize("spec, phrase", [
    ({"name": "../etc", "method_name": "m"}, "invalid servable name '../etc'"),
    ({"name": "..", "method_name": "m"}, "invalid servable name '..'"),
    ({"name": "s", "method_name": ""}, "invalid method name ''"),
    ({"name": "s", "method_name": "m", "version_number": MAX_VERSION + 1}, "version number range failed"),
])
def test_request_with_bad_spec_is_a_protocol_error(spec, phrase):
    request = PredictRequest(servable_spec=ServableSpec(**spec), instances=[Instance()])

    with pytest.raises(ProtocolError, match=phrase.replace(".", r"\.")):
        request_to_instances(request)


def test_request_without_instances_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="Instances count of request cannot be 0, servable: s, method: m"):
        request_to_instances(PredictRequest(servable_spec=ServableSpec(name="s", method_name="m")))


def test_request_error_names_instance_and_input():
    request = instances_to_request("s", "m", 0, [{"x": np.zeros(2)}, {"x": np.zeros(2)}])
    request.instances[1].items["x"].data = b"\0"

    with pytest.raises(ProtocolError, match=r"^instance 1, input 'x': Tensor check failed: input data size 1"):
        request_to_instances(request)


@pytest.mark.parametrize("instances, phrase", [
    ([{"x": 1}, ["x"]], r"^instance 1: instance should be a map"),
    ([{"x": None}], r"^instance 0, input 'x': type NoneType cannot be sent"),
    ([{1: 1}], r"^instance 0, input name 1 is not a string"),
])
def test_request_builder_names_instance_and_input(instances, phrase):
    with pytest.raises(ProtocolError, match=phrase):
        instances_to_request("s", "m", 0, instances)


# ---- replies -----------------------------------------------------------------------------------------

SPEC = ServableSpec(name="vqa", method_name="answer", version_number=1)


def test_reply_with_every_instance_answered_has_no_error_msg():
    outputs = [{"answer": "red", "score": np.float32(0.9)}, {"answer": "blue", "score": np.float32(0.4)}]

    reply = _over_the_wire(reply_from_results(SPEC, outputs))

    assert reply.servable_spec == SPEC and len(reply.instances) == 2 and not reply.error_msg
    assert results_from_reply(reply) == outputs


def test_reply_with_failed_instances_has_one_error_per_instance_in_order():
    results = [{"y": np.int32(1)}, InstanceError("image is not RGB"), ProtocolError("input 'x' missing"),
               RuntimeError("boom"), {"y": np.ones(2, np.complex64)}, {}, "not a dict"]

    reply = _over_the_wire(reply_from_results(SPEC, results))
    decoded = results_from_reply(reply)

    assert [error.error_code for error in reply.error_msg] == [
        ErrorCode.SUCCESS, ErrorCode.FAILED, ErrorCode.INVALID_INPUTS, ErrorCode.FAILED, ErrorCode.FAILED,
        ErrorCode.FAILED, ErrorCode.FAILED]
    assert reply.error_msg[0] == ErrorMsg() and len(reply.instances) == len(results)
    assert [len(instance.items) for instance in reply.instances] == [1, 0, 0, 0, 0, 0, 0]
    assert decoded[0] == {"y": 1} and all(isinstance(result, InstanceError) for result in decoded[1:])
    assert [str(result) for result in decoded[1:]] == [
        "image is not RGB", "input 'x' missing", "RuntimeError: boom",
        "output 'y': dtype complex64 cannot be sent as a tensor: expected bool, (u)int8-64 or float16-64",
        "reply instance items is empty", "reply instance is str, not a dict of outputs"]


def test_whole_request_error_is_one_entry_without_instances():
    reply = _over_the_wire(reply_from_error(SPEC, ProtocolError("servable vqa is not available")))

    assert not reply.instances and len(reply.error_msg) == 1
    with pytest.raises(RequestFailed, match="^servable vqa is not available$") as error:
        results_from_reply(reply)
    assert error.value.code == ErrorCode.INVALID_INPUTS


@pytest.mark.parametrize("reply, phrase", [
    (PredictReply(), "The instance or error count of reply cannot be 0"),
    (PredictReply(error_msg=[ErrorMsg()]), "reply holds no instances and no error"),
    (PredictReply(instances=[Instance()] * 3, error_msg=[ErrorMsg()] * 2),
     "error msg result size 2 not be 0, 1 or length of instances 3"),
])
def test_reply_breaking_the_layout_is_a_protocol_error(reply, phrase):
    with pytest.raises(ProtocolError, match=phrase):
        results_from_reply(reply)


# ---- a real Predict call -----------------------------------------------------------------------------

def _echo(request, context):
    """Doubles `x` and upper-cases `text`; an instance holding `fail` fails; servables other than 'echo' are unknown."""
    try:
        servable, _, _, instances = request_to_instances(request)
        if servable != "echo":
            raise ProtocolError(f"servable {servable} is not available")
    except ProtocolError as error:
        return reply_from_error(request.servable_spec, error)
    return reply_from_results(request.servable_spec, [
        InstanceError(f"asked to fail: {inputs['fail']}") if "fail" in inputs
        else {"y": inputs["x"] * 2, "text": inputs["text"].upper()} for inputs in instances])


ECHO_INSTANCES = [{"x": np.arange(6, dtype=np.int16).reshape(1, 2, 3), "text": "abc"}, {"fail": "on purpose"},
                  {"x": np.float64(1.25), "text": "ü"}]


def _check_echo_replies(answered, unknown):
    results = results_from_reply(answered)
    np.testing.assert_array_equal(results[0]["y"], ECHO_INSTANCES[0]["x"] * 2)
    assert results[0]["y"].dtype == np.int16 and results[0]["text"] == "ABC"
    assert isinstance(results[1], InstanceError) and str(results[1]) == "asked to fail: on purpose"
    assert results[2] == {"y": 2.5, "text": "Ü"}
    with pytest.raises(RequestFailed, match="servable nope is not available"):
        results_from_reply(unknown)


def test_grpc_aio_server_answers_predict_from_a_real_client():
    async def predict(request, context):
        return _echo(request, context)

    async def serve_and_call():
        server = grpc.aio.server()
        add_predict_handler(server, predict)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = predict_stub(channel)
                answered = await stub(instances_to_request("echo", "run", 0, ECHO_INSTANCES), timeout=10)
                unknown = await stub(instances_to_request("nope", "run", 0, ECHO_INSTANCES[:1]), timeout=10)
        finally:
            await server.stop(grace=None)
        return answered, unknown, await server.wait_for_termination(timeout=5)

    answered, unknown, timed_out = asyncio.run(serve_and_call())

    _check_echo_replies(answered, unknown)
    assert answered.servable_spec == ServableSpec(name="echo", method_name="run")
    assert not timed_out


def test_sync_grpc_server_answers_predict_from_a_real_client():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    add_predict_handler(server, _echo)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = predict_stub(channel)
            answered = stub(instances_to_request("echo", "run", 0, ECHO_INSTANCES), timeout=10)
            unknown = stub(instances_to_request("nope", "run", 0, ECHO_INSTANCES[:1]), timeout=10)
    finally:
        server.stop(grace=None).wait(5)

    _check_echo_replies(answered, unknown)
