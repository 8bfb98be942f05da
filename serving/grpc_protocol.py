"""The MindSpore Serving 2.0 gRPC protocol: ms_service.proto's messages, the tensor codec, the Predict rpc and
mindvl's server-streaming PredictStream beside it.

The messages are built at import from a descriptor written here (no protoc, no generated code) with
the field numbers of MindSpore Serving's `ms_service.proto`, so its clients and ours interoperate. Only
the fields SERVING.md lists are declared; MindSpore's shared-memory fields (`Tensor.shm_data = 5`,
`Instance.output_buffers = 2`) are parsed as unknown fields and ignored.

Errors in a reply (MindSpore Serving's layout, from its `proto_tensor.cc` and its Python client):
  * every instance answered: `error_msg` is empty, `instances` holds one entry per request instance;
  * some instances failed: `error_msg` holds one entry per instance, in request order, `error_code` 0
    and no message where that instance succeeded; a failed instance's `instances` entry is empty;
  * the whole request failed: one `error_msg` entry and no `instances`.
`error_code` is MindSpore's status code (`ErrorCode`), not a position. MindSpore's master also folds
"every instance failed with the same message" into the whole-request form; this module keeps the
per-instance entries it is given, and predict.py folds them for MindSpore Serving servables.

PredictStream (mindvl's; MindSpore Serving has no streaming rpc and answers it UNIMPLEMENTED) takes the same
PredictRequest with exactly one instance of a generative servable's `generate` and answers a PredictReply per
generated token, its one instance holding STREAM_OUTPUTS. A refused request ends with a gRPC status (no reply
holds an error_msg): the stream has no request-wide reply to put one in.
"""
import enum
import math
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .protocol import MAX_DIMS, MAX_VERSION, InstanceError, ProtocolError, is_safe_name

Value = Union[np.ndarray, str, bytes]
Result = Union[Mapping[str, Any], BaseException]

PACKAGE = "mindspore.serving.proto"


class DataType(enum.IntEnum):
    """`Tensor.dtype` on the wire."""
    MS_UNKNOWN = 0
    MS_BOOL = 1
    MS_INT8 = 2
    MS_UINT8 = 3
    MS_INT16 = 4
    MS_UINT16 = 5
    MS_INT32 = 6
    MS_UINT32 = 7
    MS_INT64 = 8
    MS_UINT64 = 9
    MS_FLOAT16 = 10
    MS_FLOAT32 = 11
    MS_FLOAT64 = 12
    MS_STRING = 13
    MS_BYTES = 14


class ErrorCode(enum.IntEnum):
    """`ErrorMsg.error_code`: MindSpore Serving's StatusCode (ccsrc/common/status.h)."""
    SUCCESS = 0
    FAILED = 1
    INVALID_INPUTS = 2
    SYSTEM_ERROR = 3
    WORKER_UNAVAILABLE = 4
    SERVABLE_UNAVAILABLE = 5


class RequestFailed(Exception):
    """The server failed the whole request (a reply with one error and no instances)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


# ---- messages ----------------------------------------------------------------------------------------

# ms_service.proto, field by field: (name, number, type) where type is a scalar, a message or enum of
# this file, "repeated <type>" or "map<string, <message>>".
MESSAGES = {
    "ServableSpec": [("name", 1, "string"), ("method_name", 2, "string"), ("version_number", 3, "uint64")],
    "TensorShape": [("dims", 1, "repeated int64")],
    "Tensor": [("shape", 1, "TensorShape"), ("dtype", 2, "DataType"), ("data", 3, "bytes"),
               ("bytes_val", 4, "repeated bytes")],
    "Instance": [("items", 1, "map<string, Tensor>")],
    "ErrorMsg": [("error_code", 1, "int64"), ("error_msg", 2, "bytes")],
    "PredictRequest": [("servable_spec", 1, "ServableSpec"), ("instances", 2, "repeated Instance")],
    "PredictReply": [("servable_spec", 1, "ServableSpec"), ("instances", 3, "repeated Instance"),
                     ("error_msg", 4, "repeated ErrorMsg")],
}
_Field = descriptor_pb2.FieldDescriptorProto
SCALARS = {"string": _Field.TYPE_STRING, "bytes": _Field.TYPE_BYTES, "int64": _Field.TYPE_INT64,
           "uint64": _Field.TYPE_UINT64}


def _field(name: str, number: int, kind: str, label: int = _Field.LABEL_OPTIONAL) -> _Field:
    field = _Field(name=name, number=number, label=label)
    if kind in SCALARS:
        field.type = SCALARS[kind]
    else:
        field.type = _Field.TYPE_ENUM if kind == DataType.__name__ else _Field.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{kind}"
    return field


def _message_proto(name: str, fields: List[Tuple[str, int, str]]) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind in fields:
        if kind.startswith("map<"):  # a repeated nested `<Name>Entry {key = 1; value = 2}` marked map_entry
            key, value = (part.strip() for part in kind[len("map<"):-1].split(","))
            entry = message.nested_type.add(name="".join(map(str.capitalize, field_name.split("_"))) + "Entry")
            entry.options.map_entry = True
            entry.field.extend([_field("key", 1, key), _field("value", 2, value)])
            message.field.append(_field(field_name, number, f"{name}.{entry.name}", _Field.LABEL_REPEATED))
        elif kind.startswith("repeated "):
            message.field.append(_field(field_name, number, kind[len("repeated "):], _Field.LABEL_REPEATED))
        else:
            message.field.append(_field(field_name, number, kind))
    return message


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="ms_service.proto", package=PACKAGE, syntax="proto3")
    file.enum_type.add(name=DataType.__name__).value.extend(
        descriptor_pb2.EnumValueDescriptorProto(name=item.name, number=item.value) for item in DataType)
    file.message_type.extend(_message_proto(name, fields) for name, fields in MESSAGES.items())
    service = file.service.add(name="MSService")
    service.method.add(name="Predict", input_type=f".{PACKAGE}.PredictRequest",
                       output_type=f".{PACKAGE}.PredictReply")
    service.method.add(name="PredictStream", input_type=f".{PACKAGE}.PredictRequest",
                       output_type=f".{PACKAGE}.PredictReply", server_streaming=True)
    return file


POOL = descriptor_pool.DescriptorPool()  # our own, not the default pool: no clash with an installed mindspore_serving
POOL.Add(_file_proto())


def _message_class(name: str) -> type:
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServableSpec = _message_class("ServableSpec")
TensorShape = _message_class("TensorShape")
Tensor = _message_class("Tensor")
Instance = _message_class("Instance")
ErrorMsg = _message_class("ErrorMsg")
PredictRequest = _message_class("PredictRequest")
PredictReply = _message_class("PredictReply")

_PREDICT = POOL.FindMethodByName(f"{PACKAGE}.MSService.Predict")
_PREDICT_STREAM = POOL.FindMethodByName(f"{PACKAGE}.MSService.PredictStream")
SERVICE = _PREDICT.containing_service.full_name  # "mindspore.serving.proto.MSService"
PREDICT_METHOD = f"/{SERVICE}/{_PREDICT.name}"  # the HTTP/2 path clients call
PREDICT_STREAM_METHOD = f"/{SERVICE}/{_PREDICT_STREAM.name}"
STREAM_OUTPUTS = ("text", "token", "logprob", "finish_reason")  # each streamed reply's instance


# ---- tensors -----------------------------------------------------------------------------------------

WIRE_TYPES = {  # numeric tensors travel little-endian, row-major, in `data`
    DataType.MS_BOOL: np.dtype("|b1"),
    DataType.MS_INT8: np.dtype("<i1"), DataType.MS_UINT8: np.dtype("<u1"),
    DataType.MS_INT16: np.dtype("<i2"), DataType.MS_UINT16: np.dtype("<u2"),
    DataType.MS_INT32: np.dtype("<i4"), DataType.MS_UINT32: np.dtype("<u4"),
    DataType.MS_INT64: np.dtype("<i8"), DataType.MS_UINT64: np.dtype("<u8"),
    DataType.MS_FLOAT16: np.dtype("<f2"), DataType.MS_FLOAT32: np.dtype("<f4"), DataType.MS_FLOAT64: np.dtype("<f8"),
}
DATA_TYPES = {dtype.newbyteorder("="): data_type for data_type, dtype in WIRE_TYPES.items()}
TEXT_TYPES = (DataType.MS_STRING, DataType.MS_BYTES)


TYPE_NAMES = {item.value: item.name for item in DataType}


def tensor_to_proto(value: Any) -> Tensor:
    """A numpy array or scalar (Python bool/int/float become bool/int64/float64, as MindSpore's worker
    converts them), a `str` (MS_STRING, utf-8) or `bytes` (MS_BYTES) as a Tensor.

    Strings and bytes go out with shape () as MindSpore Serving's own replies do; raises ProtocolError
    for values the protocol has no type for (complex, object or unicode arrays, lists, None).
    """
    if isinstance(value, (str, bytes)):
        text = isinstance(value, str)
        return Tensor(dtype=DataType.MS_STRING if text else DataType.MS_BYTES,
                      bytes_val=[value.encode("utf-8") if text else bytes(value)])
    if not isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        raise ProtocolError(f"type {type(value).__name__} cannot be sent as a tensor: expected a numpy array or "
                            f"scalar, bool, int, float, str or bytes")
    array = np.asarray(value)
    data_type = DATA_TYPES.get(array.dtype.newbyteorder("="))
    if data_type is None:
        raise ProtocolError(f"dtype {array.dtype} cannot be sent as a tensor: expected bool, (u)int8-64 or "
                            f"float16-64")
    return Tensor(shape=TensorShape(dims=array.shape), dtype=data_type,
                  data=np.ascontiguousarray(array, WIRE_TYPES[data_type]).tobytes())


def tensor_from_proto(tensor: Tensor) -> Value:
    """A Tensor as a writable native-order numpy array, a `str` (MS_STRING) or `bytes` (MS_BYTES).

    Checks what MindSpore Serving's CheckRequestTensor checks, in its words: one item (shape () or
    (1,)) for strings and bytes, a known dtype, dims >= 0, and `data` exactly shape x itemsize bytes.
    """
    if len(tensor.shape.dims) > MAX_DIMS:  # before the dims become a list, or a message, of millions of numbers
        raise ProtocolError(f"Tensor check failed: input shape of {len(tensor.shape.dims)} dims invalid: expected at "
                            f"most {MAX_DIMS} dims, each >= 0")
    dims = list(tensor.shape.dims)
    if tensor.dtype in TEXT_TYPES:
        if len(tensor.bytes_val) != 1:
            raise ProtocolError(f"Instance tensor check failed: bytes or string type shape batch size can only be "
                                f"1, got {len(tensor.bytes_val)} items")
        if dims not in ([], [1]):
            raise ProtocolError(f"Instance tensor check failed: bytes or string type input shape can only be (1,) "
                                f"or empty, but given shape is {dims}")
        raw = tensor.bytes_val[0]
        if tensor.dtype == DataType.MS_BYTES:
            return raw
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("Instance tensor check failed: string type input is not UTF-8 text") from None
    wire, type_name = WIRE_TYPES.get(tensor.dtype), TYPE_NAMES.get(tensor.dtype, tensor.dtype)
    if wire is None:
        raise ProtocolError(f"Tensor check failed: input data type {type_name} invalid; expected one of "
                            f"{', '.join(item.name for item in DataType if item != DataType.MS_UNKNOWN)}")
    if any(dim < 0 for dim in dims):
        raise ProtocolError(f"Tensor check failed: input shape {dims} invalid: expected at most {MAX_DIMS} dims, "
                            f"each >= 0")
    data = tensor.data
    expected = math.prod(dims) * wire.itemsize
    if len(data) != expected:
        raise ProtocolError(f"Tensor check failed: input data size {len(data)} invalid: shape {dims} of "
                            f"{type_name} needs {expected} bytes")
    try:
        if tensor.dtype == DataType.MS_BOOL:  # any nonzero byte is true; numpy would keep the raw byte
            return (np.frombuffer(data, np.uint8) != 0).reshape(dims)
        return np.frombuffer(data, wire).reshape(dims).astype(wire.newbyteorder("="))
    except ValueError as error:  # a shape numpy cannot hold, such as (0, 2**62)
        raise ProtocolError(f"Tensor check failed: input shape {dims} invalid: {error}") from None


def _encode_items(values: Mapping[str, Any], kind: str) -> Instance:
    """{name: value} as an Instance; errors name the `kind` ('input' / 'output') and its name."""
    instance = Instance()
    for name, value in values.items():
        if not isinstance(name, str):
            raise ProtocolError(f"{kind} name {name!r} is not a string")
        try:
            instance.items[name].CopyFrom(tensor_to_proto(value))
        except ProtocolError as error:
            raise ProtocolError(f"{kind} {name!r}: {error}") from None
    return instance


def _decode_items(instance: Instance, kind: str) -> Dict[str, Value]:
    values = {}
    for name, tensor in instance.items.items():
        try:
            values[name] = tensor_from_proto(tensor)
        except ProtocolError as error:
            raise ProtocolError(f"{kind} {name!r}: {error}") from None
    return values


# ---- requests ----------------------------------------------------------------------------------------

def instances_to_request(servable: str, method: str, version: int,
                         instances: Sequence[Mapping[str, Any]]) -> PredictRequest:
    """A PredictRequest for `instances` ({input name: value} each); version 0 asks for the newest."""
    request = PredictRequest(servable_spec=ServableSpec(name=servable, method_name=method, version_number=version))
    for index, inputs in enumerate(instances):
        if not isinstance(inputs, Mapping):
            raise ProtocolError(f"instance {index}: instance should be a map of input names to values, got "
                                f"{type(inputs).__name__}")
        try:
            request.instances.append(_encode_items(inputs, "input"))
        except ProtocolError as error:
            raise ProtocolError(f"instance {index}, {error}") from None
    return request


def request_to_instances(request: PredictRequest) -> Tuple[str, str, int, List[Dict[str, Value]]]:
    """(servable, method, version, instances) of a request, checked as the REST URL and body are.

    Names follow the REST rule (`[A-Za-z0-9_.-]+`, never '.' or '..') so none can walk the servable
    folder; version 0 means the newest. Raises ProtocolError naming the instance and input at fault.
    """
    spec = request.servable_spec
    for kind, name in (("servable", spec.name), ("method", spec.method_name)):
        if not is_safe_name(name):
            raise ProtocolError(f"invalid {kind} name {name[:64]!r} in servable_spec: expected letters, digits "
                                f"and '_.-', not '.' or '..'")
    if spec.version_number > MAX_VERSION:
        raise ProtocolError(f"version number range failed, request version number {spec.version_number}: at most "
                            f"{MAX_VERSION}")
    if not request.instances:
        raise ProtocolError(f"Instances count of request cannot be 0, servable: {spec.name}, method: "
                            f"{spec.method_name}")
    instances = []
    for index, instance in enumerate(request.instances):
        try:
            instances.append(_decode_items(instance, "input"))
        except ProtocolError as error:
            raise ProtocolError(f"instance {index}, {error}") from None
    return spec.name, spec.method_name, spec.version_number, instances


def stream_request_to_instance(request: PredictRequest) -> Tuple[str, str, int, Dict[str, Value]]:
    """(servable, method, version, the one instance) of a PredictStream request, checked as request_to_instances
    checks a Predict request; a stream answers one instance, so more are refused before a tensor is decoded."""
    if len(request.instances) > 1:
        raise ProtocolError(f"PredictStream streams one instance, got {len(request.instances)}; send each instance "
                            f"in a call of its own")
    servable, method, version, instances = request_to_instances(request)
    return servable, method, version, instances[0]


# ---- replies -----------------------------------------------------------------------------------------

def _error_msg(error: BaseException) -> ErrorMsg:
    """ProtocolError -> INVALID_INPUTS with its message; anything else -> FAILED (named unless an InstanceError)."""
    if isinstance(error, ProtocolError):
        code, message = ErrorCode.INVALID_INPUTS, str(error)
    elif isinstance(error, InstanceError):
        code, message = ErrorCode.FAILED, str(error) or "the instance failed"
    else:
        code, message = ErrorCode.FAILED, f"{type(error).__name__}: {error}"
    return ErrorMsg(error_code=code, error_msg=message.encode("utf-8", errors="replace"))


def _encode_result(result: Result) -> Tuple[Instance, ErrorMsg]:
    """One result as (its Instance, its ErrorMsg); an output that cannot be sent fails only its instance."""
    if isinstance(result, BaseException):
        return Instance(), _error_msg(result)
    if not isinstance(result, Mapping):
        problem = f"reply instance is {type(result).__name__}, not a dict of outputs"
        return Instance(), _error_msg(InstanceError(problem))
    if not result:
        return Instance(), _error_msg(InstanceError("reply instance items is empty"))
    try:
        return _encode_items(result, "output"), ErrorMsg()
    except ProtocolError as error:
        return Instance(), _error_msg(InstanceError(str(error)))


def reply_from_results(spec: ServableSpec, results: Sequence[Result]) -> PredictReply:
    """The reply to a request whose servable_spec is `spec`: one result per instance, in request order,
    each a dict of outputs or the exception that failed it (see the module docstring for the layout)."""
    reply = PredictReply(servable_spec=spec)
    errors = []
    for result in results:
        instance, error = _encode_result(result)
        reply.instances.append(instance)
        errors.append(error)
    if any(error.error_code != ErrorCode.SUCCESS for error in errors):
        reply.error_msg.extend(errors)
    return reply


def reply_from_error(spec: ServableSpec, error: BaseException) -> PredictReply:
    """The reply when the whole request failed: one error entry, no instances."""
    return PredictReply(servable_spec=spec, error_msg=[_error_msg(error)])


def results_from_reply(reply: PredictReply) -> List[Union[Dict[str, Value], InstanceError]]:
    """Each instance's outputs, or an InstanceError holding its message; raises RequestFailed when the
    whole request failed and ProtocolError for a reply that breaks the layout."""
    errors, instances = reply.error_msg, reply.instances
    if len(errors) == 1 and not instances:
        if errors[0].error_code == ErrorCode.SUCCESS:
            raise ProtocolError("reply holds no instances and no error")
        raise RequestFailed(errors[0].error_msg.decode("utf-8", errors="replace"), errors[0].error_code)
    if not instances:
        raise ProtocolError("The instance or error count of reply cannot be 0")
    if len(errors) not in (0, len(instances)):
        raise ProtocolError(f"error msg result size {len(errors)} not be 0, 1 or length of instances "
                            f"{len(instances)}")
    results = []
    for index, instance in enumerate(instances):
        if errors and errors[index].error_code != ErrorCode.SUCCESS:
            results.append(InstanceError(errors[index].error_msg.decode("utf-8", errors="replace")))
            continue
        try:
            results.append(_decode_items(instance, "output"))
        except ProtocolError as error:
            raise ProtocolError(f"instance {index}, {error}") from None
    return results


def stream_reply(spec: ServableSpec, text: str, token: int, logprob: float,
                 finish_reason: Optional[str]) -> PredictReply:
    """One PredictStream reply: the `text` a token adds (empty while a character or a possible stop string is
    incomplete), the `token` id (int32), its `logprob` under the model (float32) and `finish_reason` ("stop" or
    "length" on the last reply, "" before it)."""
    values = {"text": text, "token": np.int32(token), "logprob": np.float32(logprob),
              "finish_reason": finish_reason or ""}
    return PredictReply(servable_spec=spec, instances=[_encode_items(values, "output")])


def delta_from_reply(reply: PredictReply) -> Dict[str, Any]:
    """A PredictStream reply as {"text": str, "token": int, "logprob": float, "finish_reason": str}; ProtocolError
    for a reply that is not one instance of STREAM_OUTPUTS with their types."""
    if reply.error_msg or len(reply.instances) != 1:
        raise ProtocolError(f"a PredictStream reply holds {len(reply.instances)} instances and {len(reply.error_msg)} "
                            f"error_msg entries, expected one instance and no error_msg")
    values = _decode_items(reply.instances[0], "output")
    if sorted(values) != sorted(STREAM_OUTPUTS):
        raise ProtocolError(f"a PredictStream reply holds outputs {sorted(values)}, expected {list(STREAM_OUTPUTS)}")
    text, token, logprob, finish = (values[name] for name in STREAM_OUTPUTS)
    if not (isinstance(text, str) and isinstance(finish, str) and _is_scalar(token, "iu") and _is_scalar(logprob, "f")):
        kinds = ", ".join(f"{name} {type(values[name]).__name__} {getattr(values[name], 'dtype', '')}"
                          for name in STREAM_OUTPUTS)
        raise ProtocolError(f"a PredictStream reply's outputs are {kinds}; expected text and finish_reason strings, "
                            f"token an integer scalar and logprob a float scalar")
    return {"text": text, "token": int(token), "logprob": float(logprob), "finish_reason": finish}


def _is_scalar(value: Value, kinds: str) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in kinds


# ---- service -----------------------------------------------------------------------------------------

def add_predict_handler(server: Union[grpc.Server, grpc.aio.Server],
                        predict: Callable[[PredictRequest, Any], Any]) -> None:
    """Serve MSService/Predict on `server` with `predict(request, context) -> PredictReply`.

    On a grpc.aio server `predict` may be `async def`; a plain function would block the event loop.
    """
    _add_handler(server, _PREDICT.name, grpc.unary_unary_rpc_method_handler, predict)


def predict_stub(channel: Union[grpc.Channel, grpc.aio.Channel]) -> Callable[..., Any]:
    """`stub(request, timeout=...) -> PredictReply` (awaitable on a grpc.aio channel)."""
    return channel.unary_unary(PREDICT_METHOD, request_serializer=PredictRequest.SerializeToString,
                               response_deserializer=PredictReply.FromString)


def add_predict_stream_handler(server: grpc.aio.Server,
                               predict_stream: Callable[[PredictRequest, Any], Any]) -> None:
    """Serve MSService/PredictStream on a grpc.aio `server` with `predict_stream(request, context)`, an async
    generator of PredictReply (grpc cancels it where it waits when the client cancels or goes away)."""
    _add_handler(server, _PREDICT_STREAM.name, grpc.unary_stream_rpc_method_handler, predict_stream)


def predict_stream_stub(channel: Union[grpc.Channel, grpc.aio.Channel]) -> Callable[..., Iterator[PredictReply]]:
    """`stub(request, timeout=...)` -> the call: an iterator of PredictReply (an async one on a grpc.aio channel)
    whose `cancel()` ends the stream and the server's generation; `timeout` bounds the whole stream."""
    return channel.unary_stream(PREDICT_STREAM_METHOD, request_serializer=PredictRequest.SerializeToString,
                                response_deserializer=PredictReply.FromString)


def _add_handler(server: Union[grpc.Server, grpc.aio.Server], method: str, kind: Callable[..., Any],
                 behaviour: Callable[[PredictRequest, Any], Any]) -> None:
    """Serve MSService/`method` with `behaviour`, as grpc's handler factory `kind` (unary_unary_rpc_method_handler
    ...) wraps it, taking a PredictRequest and answering PredictReply."""
    handler = kind(behaviour, request_deserializer=PredictRequest.FromString,
                   response_serializer=PredictReply.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {method: handler}),))
