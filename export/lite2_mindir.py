"""MindIR for the MindSpore Lite 2.0 runtime: down-convert what MindSpore 2.10 writes (MindIR version 3).

Lite 2.0 reads MindIR version 1, where a primitive carries its construction arguments as attributes.
MindSpore 2.10 exports most operators as PRIMITIVE_FUNCTION nodes whose arguments arrive as extra
constant inputs (MatMul(x, w, transpose_a, transpose_b)). `convert_mindir` moves those constants back
into attributes of a primitive of its own per node, op by op from `RULES` (every op the mindvl graphs
use, checked in tests/export/test_lite2_folder.py), renames the two 2.10-only scalar ops to their tensor
forms, and sets the version field. An op missing from RULES fails the conversion with its name, so a
new operator in a model is noticed at export, not on the device. Static shapes only (export/lite2_folder.py
traces the graphs for it).
"""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

from mindvl.errors import PackageError
from mindvl.mindir import proto

LITE2_MINDIR_VERSION = 1


@dataclass(frozen=True)
class OpRule:
    """How one 2.10 op becomes its Lite 2.0 form.

    attributes: constant input index -> the attribute name(s) it becomes (removed from the inputs).
    rename: the Lite 2.0 op name when 2.10 calls it differently (a scalar-operand variant).
    tensor_inputs: constant scalar inputs that become 0-d tensors of input 0's element type.
    strings: attribute name -> the strings its enum values stand for (BiasAdd's data format).
    unset: constant inputs dropped because the Lite 2.0 op has no such argument; each must be None (left at
    its default), else the conversion fails naming the op (SumExt's dtype).
    tensor_values: a tensor input's value when it is not the constant's own (a cast to bool's 0).
    """
    attributes: Mapping[int, Tuple[str, ...]] = field(default_factory=dict)
    rename: Optional[str] = None
    tensor_inputs: Tuple[int, ...] = ()
    strings: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    unset: Tuple[int, ...] = ()
    tensor_values: Mapping[int, float] = field(default_factory=dict)


# ops whose 2.10 form has no construction arguments (or keeps them as inputs in 1.x too: Reshape's shape,
# Transpose's perm, Tile's multiples, ExpandDims' axis, Cast's type)
PLAIN = ("Abs", "Add", "Cast", "Cos", "Div", "Equal", "Erf", "Exp", "ExpandDims", "GeLU", "Greater", "Less",
         "LessEqual", "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mul", "Neg", "OnesLike", "Pow",
         "RealDiv", "ReLU", "Reshape", "Rsqrt", "Sigmoid", "Sin", "Sqrt", "Square", "Sub", "Tanh", "Tile",
         "Transpose", "ZerosLike")
DATA_FORMATS = ("NCHW", "NHWC")

RULES: Dict[str, OpRule] = {
    **{op: OpRule() for op in PLAIN},
    "MatMul": OpRule({2: ("transpose_a",), 3: ("transpose_b",)}),
    "BatchMatMul": OpRule({2: ("transpose_a",), 3: ("transpose_b",)}),
    "BiasAdd": OpRule({2: ("format", "data_format")}, strings={"format": DATA_FORMATS, "data_format": DATA_FORMATS}),
    "Gather": OpRule({3: ("batch_dims",)}),
    "LayerNorm": OpRule({3: ("begin_norm_axis",), 4: ("begin_params_axis",), 5: ("epsilon",)}),
    "ReduceMean": OpRule({2: ("keep_dims",)}),
    "ReduceMax": OpRule({2: ("keep_dims",)}),
    "ReduceSum": OpRule({2: ("keep_dims",), 3: ("skip_mode",)}),
    "Concat": OpRule({1: ("axis",)}),
    "Softmax": OpRule({1: ("axis",)}),
    "LogSoftmax": OpRule({1: ("axis",)}),
    "Squeeze": OpRule({1: ("axis",)}),
    "Argmax": OpRule({1: ("axis",), 2: ("output_type",)}),
    "StridedSlice": OpRule({4: ("begin_mask",), 5: ("end_mask",), 6: ("ellipsis_mask",), 7: ("new_axis_mask",),
                            8: ("shrink_axis_mask",)}),
    "BroadcastTo": OpRule({1: ("shape",)}),
    "CumSum": OpRule({2: ("exclusive",), 3: ("reverse",)}),  # the axis stays an input, as in 1.x
    "Split": OpRule({1: ("axis",), 2: ("output_num",)}),
    "SumExt": OpRule({2: ("keep_dims",)}, rename="ReduceSum", unset=(3,)),  # Tensor.sum(axis, keepdims)
    "Select": OpRule(rename="Where"),  # Lite 2.0's Select is the control-flow one
    "Muls": OpRule(rename="Mul", tensor_inputs=(1,)),  # x * python float
    "LessScalar": OpRule(rename="Less", tensor_inputs=(1,)),  # int tensor < python int (attention masks)
}

# Lite 2.0's Cast kernel makes no bools ("Unsupported datatype from 34 to 30" for int32 -> bool, the generation
# graphs' masks): a cast to bool becomes x != 0, its dst_type input the 0 of x's element type
CAST_TO_BOOL = OpRule(rename="NotEqual", tensor_inputs=(1,), tensor_values={1: 0})
BOOL_TYPE_ID = 30  # MindSpore's TypeId of bool: the value of Cast's dst_type input

# what 2.10 still writes in the 1.x form: graph plumbing, and Pad (its paddings are an attribute)
AS_IS = ("TupleGetItem", "MakeTuple", "Depend", "Load", "UpdateState", "Pad")


def _scalar_tensor(pb, number: float, data_type: Optional[int]):
    """`number` as a 0-d tensor of TensorProto `data_type`."""
    dtypes = {pb.TensorProto.FLOAT: np.float32, pb.TensorProto.INT32: np.int32, pb.TensorProto.INT64: np.int64,
              pb.TensorProto.FLOAT16: np.float16, pb.TensorProto.DOUBLE: np.float64, pb.TensorProto.BOOL: np.bool_}
    if data_type not in dtypes:
        raise ValueError("element type " + (pb.TensorProto.DataType.Name(data_type) if data_type is not None
                                            else "unknown: the input is computed inside the graph"))
    attribute = pb.AttributeProto(name="value", type=pb.AttributeProto.TENSORS)
    attribute.tensors.add(data_type=data_type, name="value0", raw_data=np.asarray(number, dtypes[data_type]).tobytes())
    return attribute


class _Graph:
    """One graph of the model with lookups by name: constants, and each value's element type."""

    def __init__(self, pb, graph) -> None:
        self.graph = graph
        self.constants = {n.name: n for n in graph.node if n.op_type == "Constant"}
        self.element_types: Dict[str, int] = {}
        for value in [*graph.input, *graph.parameter]:
            tensor = value.tensor[0] if hasattr(value, "tensor") and len(value.tensor) else value
            self.element_types[value.name] = tensor.data_type
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.name == "shape" and attribute.type == pb.AttributeProto.TENSORS and attribute.tensors:
                    self.element_types[node.name] = attribute.tensors[0].data_type
            if node.op_type == "Constant" and node.attribute[0].type == pb.AttributeProto.TENSORS:
                self.element_types[node.name] = node.attribute[0].tensors[0].data_type


def convert_mindir(data: bytes, name: str = "graph") -> Tuple[bytes, List[str]]:
    """A MindSpore 2.10 MindIR (static shapes) as MindIR version 1 for Lite 2.0 -> (bytes, ops converted).

    Raises PackageError naming the graph and the op when an op has no rule, an argument the rule needs
    constant is computed at run time, or an input has a dynamic dimension."""
    pb = proto()
    model = pb.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise PackageError(f"graph {name}: not a MindIR file ({exc})") from exc
    for value in model.graph.input:
        dims = list(value.tensor[0].dims) if value.tensor else []
        if any(d < 0 for d in dims):
            raise PackageError(f"graph {name}: input {value.name.split(':')[-1]} has a dynamic shape {dims}; Lite 2.0 "
                               f"builds only static graphs: export with --static-batch N (resize on the device)")
    primitives = {p.name: p for p in model.primitives}
    kept: List = []
    converted: set = set()
    for graph in [model.graph, *model.functions]:
        lookup = _Graph(pb, graph)
        extra_nodes = []
        for node in graph.node:
            if not node.op_type.startswith("REF::"):
                continue
            primitive = primitives[node.op_type[len("REF::"):]]
            op = primitive.op_type
            if primitive.prim_type != pb.PrimitiveProto.PRIMITIVE_FUNCTION:
                if op not in AS_IS and op not in RULES:
                    raise PackageError(f"graph {name}: op {op} has no Lite 2.0 conversion in export/lite2_mindir.py "
                                       f"RULES")
                kept.append(primitive)
                continue
            if op not in RULES:
                raise PackageError(f"graph {name}: op {op} has no Lite 2.0 conversion (export/lite2_mindir.py RULES "
                                   f"knows {', '.join(sorted(RULES))}); add a rule for it or avoid the op in the model")
            rule = RULES[op]
            dst_type = lookup.constants.get(node.input[1]) if op == "Cast" and len(node.input) > 1 else None
            if dst_type is not None and dst_type.attribute[0].i == BOOL_TYPE_ID:
                rule = CAST_TO_BOOL
            new = pb.PrimitiveProto()
            new.CopyFrom(primitive)
            new.op_type = rule.rename or op
            new.prim_type = pb.PrimitiveProto.PRIMITIVE
            new.name = f"{new.op_type}:lite2_{len(kept)}"
            inputs = []
            for index, source in enumerate(node.input):
                if index in rule.attributes or index in rule.tensor_inputs or index in rule.unset:
                    constant = lookup.constants.get(source)
                    if constant is None:
                        raise PackageError(f"graph {name}: op {op} input {index} is computed at run time; Lite 2.0 "
                                           f"needs it constant")
                    value = constant.attribute[0]
                if index in rule.unset:
                    if value.type != pb.AttributeProto.NONE:
                        raise PackageError(f"graph {name}: op {op} input {index} is set; Lite 2.0's "
                                           f"{rule.rename or op} has no such argument: leave it at its default")
                    continue
                if index in rule.attributes:
                    for attribute_name in rule.attributes[index]:
                        attribute = new.attribute.add()
                        attribute.CopyFrom(value)
                        attribute.name = attribute_name
                        if attribute_name in rule.strings:
                            attribute.ClearField("i")
                            attribute.type = pb.AttributeProto.STRING
                            attribute.s = rule.strings[attribute_name][value.i].encode()
                    continue
                if index in rule.tensor_inputs:
                    data_type = lookup.element_types.get(node.input[0])
                    number = rule.tensor_values.get(index, value.f if value.type in (
                        pb.AttributeProto.FLOAT, pb.AttributeProto.DOUBLE) else value.i)
                    try:
                        tensor = _scalar_tensor(pb, number, data_type)
                    except ValueError as exc:
                        raise PackageError(f"graph {name}: op {op}: cannot make its scalar a tensor ({exc})") from exc
                    constant_node = pb.NodeProto(name=f"{source}:lite2_{len(extra_nodes)}", op_type="Constant")
                    constant_node.output.append(constant_node.name)
                    constant_node.attribute.append(tensor)
                    extra_nodes.append(constant_node)
                    source = constant_node.name
                inputs.append(source)
            del node.input[:]
            node.input.extend(inputs)
            node.op_type = "REF::" + new.name
            kept.append(new)
            converted.add(op)
        # a constant must precede its users: put the new ones first
        nodes = [*extra_nodes, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    unique = {p.name: p for p in kept}
    del model.primitives[:]
    model.primitives.extend(unique.values())
    model.mind_ir_version = LITE2_MINDIR_VERSION
    return model.SerializeToString(), sorted(converted)


def unconvertible(ops: Iterable[str]) -> List[str]:
    """Of `ops`, those `convert_mindir` has no rule for."""
    return sorted(set(ops) - set(RULES) - set(AS_IS))
