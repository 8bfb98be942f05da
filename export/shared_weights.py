"""One weights file for several MindIR graphs over the same parameters (a generative package's prefill buckets
and decode graph all hold the decoder).

A MindIR parameter may keep its bytes outside the model file: `external_data` names a file (relative to the
MindIR's folder), an offset and a length, and `mindspore.load` reads them from there. MindSpore writes this
form itself for models over 1 GB (`<name>_variables/data_0`: a first byte of 1 marking little-endian data,
then each parameter 64-byte aligned). Here every graph's parameters point into ONE such file, each parameter
stored once under its name, so N graphs cost one copy of the weights on disk instead of N.
"""
import shutil
from pathlib import Path
from typing import Dict, Sequence

from mindspore.train.mind_ir_pb2 import ModelProto

from mindvl.errors import PackageError

ALIGN = 64
HEADER = b"\x01" + bytes(ALIGN - 1)  # MindSpore's mark of little-endian external data


def _name(proto) -> str:
    """A parameter's name without the graph prefix MindSpore writes before ':'."""
    return proto.name[proto.name.find(":") + 1:]


def external_bytes(folder: Path, where, split_files: Dict[str, bytes]) -> bytes:
    """The bytes a parameter's `external_data` (`where`) names, relative to the MindIR's `folder`; `split_files`
    caches each file read ({location: bytes})."""
    if where.location not in split_files:
        split_files[where.location] = (folder / where.location).read_bytes()
    return split_files[where.location][where.offset:where.offset + where.length]


def share_weights(folder: Path, files: Sequence[str], weights: str = "weights.bin") -> Dict[str, int]:
    """Move the parameters of `files` (MindIR files in `folder`, not encrypted) into `folder/weights`, each once;
    -> {"graph_bytes": the MindIR files' bytes before (with MindSpore's own <graph>_variables/ for graphs over
    1 GB), "shared_bytes": the MindIR files + the weights file after, "weights_bytes"}. Parameters with the
    same name must hold the same bytes (one model's graphs)."""
    folder = Path(folder)
    offsets: Dict[str, tuple] = {}
    split_files: Dict[str, bytes] = {}
    before = sum(p.stat().st_size for f in files for p in [folder / f, *(folder / f"{Path(f).stem}_variables")
                                                         .glob("*")] if p.is_file())
    with open(folder / weights, "wb") as out:
        out.write(HEADER)
        for file in files:
            model = ModelProto()
            model.ParseFromString((folder / file).read_bytes())
            for proto in model.graph.parameter:
                name, data = _name(proto), proto.raw_data
                if proto.HasField("external_data"):  # MindSpore's own split (over 1 GB): read from there
                    data = external_bytes(folder, proto.external_data, split_files)
                if name not in offsets:
                    offset = out.tell()
                    out.write(data + bytes(-len(data) % ALIGN))
                    offsets[name] = (offset, len(data), hash(data))
                elif offsets[name][1:] != (len(data), hash(data)):
                    raise PackageError(f"{file}: parameter {name} differs from the one of the same name in another "
                                       f"graph; graphs sharing a weights file must come from one model")
                offset, length, _ = offsets[name]
                proto.ClearField("raw_data")
                proto.external_data.location = weights
                proto.external_data.offset = offset
                proto.external_data.length = length
            (folder / file).write_bytes(model.SerializeToString())
            for location in split_files:  # nothing points into this graph's <graph>_variables/ any more
                shutil.rmtree(folder / Path(location).parent, ignore_errors=True)
            split_files.clear()
    after = sum((folder / f).stat().st_size for f in files)
    size = (folder / weights).stat().st_size
    return {"graph_bytes": before, "shared_bytes": after + size, "weights_bytes": size}
