"""Reading MindIR files (MindSpore's protobuf graph format) without loading them into a runtime: the ops a
graph uses, its typed inputs and outputs, its format version. The Lite 2.0 converter (export) and the
device runtimes (lite) both read graphs through it."""
from typing import List, Tuple


def proto():
    """MindSpore's generated protobuf module for MindIR (imported on first use: it loads MindSpore)."""
    from mindspore.train import mind_ir_pb2

    return mind_ir_pb2


def parse(data: bytes):
    """A MindIR file's bytes as its ModelProto."""
    model = proto().ModelProto()
    model.ParseFromString(data)
    return model


def mindir_ops(data: bytes) -> List[str]:
    """The op types a MindIR file uses (for tests and `mindvl lite info`)."""
    model = parse(data)
    return sorted({p.op_type for p in model.primitives})


def mindir_io(data: bytes) -> Tuple[list, list]:
    """(inputs, outputs) of a MindIR file's main graph as [(name, numpy dtype name, shape)]; -1 marks a
    dynamic dimension, and names lose the exporter's graph prefix."""
    pb = proto()
    model = parse(data)
    dtypes = {pb.TensorProto.FLOAT: "float32", pb.TensorProto.INT32: "int32", pb.TensorProto.INT64: "int64",
              pb.TensorProto.FLOAT16: "float16", pb.TensorProto.DOUBLE: "float64", pb.TensorProto.BOOL: "bool",
              pb.TensorProto.UINT8: "uint8", pb.TensorProto.INT8: "int8", pb.TensorProto.UINT16: "uint16",
              pb.TensorProto.INT16: "int16", pb.TensorProto.UINT32: "uint32", pb.TensorProto.UINT64: "uint64"}

    def describe(name: str, tensor) -> tuple:
        if tensor.data_type not in dtypes:
            raise ValueError(f"{name}: data type {pb.TensorProto.DataType.Name(tensor.data_type)} has no numpy "
                             f"counterpart a request or a runtime could pass")
        return name.split(":")[-1], dtypes[tensor.data_type], tuple(tensor.dims)

    inputs = [describe(v.name, v.tensor[0]) for v in model.graph.input]
    outputs = []
    for value in model.graph.output:  # one tensor, or a tuple of them (in attr_info)
        tensors = [value.tensor[0]] if len(value.tensor) else [v.tensors[0] for v in value.attr_info.values]
        outputs += [describe(f"output{len(outputs) + i}", t) for i, t in enumerate(tensors)]
    return inputs, outputs


def mindir_version(data: bytes) -> int:
    return int(parse(data).mind_ir_version)
