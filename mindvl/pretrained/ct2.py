"""A reader of CTranslate2's model.bin (binary version 6) that needs no CTranslate2.

Layout (little-endian): u32 binary version, string spec name, u32 spec revision, u32 variable count, then
per variable: string name, u8 rank, u32 dims[rank], u8 dtype id, u32 byte count, the raw bytes (C order);
then u32 alias count and (alias, target) string pairs, and nothing after. A string is a u16 length that
counts a trailing NUL, the UTF-8 bytes and that NUL.

A model can be split into parts (wheels have a size limit): the parts are read in order as one stream,
so no joined copy is written. Variables whose names start with a `skip` prefix are not read: they become
shape-only placeholders (a broadcast zero of their dtype), so callers still see every name and shape.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Dict, List, Sequence, Tuple, Union

import numpy as np

from mindvl.errors import ConversionError

BINARY_VERSIONS = (6,)  # what CTranslate2 3.x and 4.x write; other versions are refused, not guessed at
DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, None)  # id -> dtype; 5 is bfloat16
MAX_VARIABLES = 1 << 20  # a sanity bound: a foreign file read as a count gives absurd numbers


@dataclass
class CT2Model:
    """The variables of one model.bin: name -> array (float16 stays float16), aliases -> their targets."""

    spec: str
    revision: int
    variables: Dict[str, np.ndarray]
    aliases: Dict[str, str]
    files: List[Path]


class _Parts:
    """Several files read as one byte stream, with the position kept for error messages."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self.sizes = [p.stat().st_size for p in self.paths]
        self.total = sum(self.sizes)
        self.position = 0
        self.index = 0
        self.handle: BinaryIO = open(self.paths[0], "rb")

    @property
    def label(self) -> str:
        return " + ".join(str(p) for p in self.paths)

    def _advance(self) -> bool:
        self.handle.close()
        self.index += 1
        if self.index == len(self.paths):
            return False
        self.handle = open(self.paths[self.index], "rb")
        return True

    def read(self, count: int, what: str) -> bytes:
        if self.position + count > self.total:
            raise ConversionError(f"{self.label}: truncated; {what} needs {count} bytes at offset {self.position} "
                                  f"but the model ends at {self.total} bytes (expected a complete CTranslate2 "
                                  f"model.bin{'; are all parts present and in order?' if len(self.paths) > 1 else ''})")
        chunks = []
        left = count
        while left:
            chunk = self.handle.read(left)
            if not chunk and not self._advance():
                raise ConversionError(f"{self.label}: ended early while reading {what}; did a file change while "
                                      f"it was read?")
            chunks.append(chunk)
            left -= len(chunk)
        self.position += count
        return b"".join(chunks)

    def skip(self, count: int, what: str) -> None:
        if self.position + count > self.total:
            self.read(count, what)  # raises the truncation error
        target = self.position + count
        while True:
            start = sum(self.sizes[:self.index])
            if target <= start + self.sizes[self.index]:
                self.handle.seek(target - start)
                break
            self._advance()
        self.position = target

    def unpack(self, fmt: str, what: str) -> Tuple[int, ...]:
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt), what))

    def number(self, fmt: str, what: str) -> int:
        return self.unpack(fmt, what)[0]

    def string(self, what: str) -> str:
        length = self.number("H", f"the length of {what}")
        raw = self.read(length, what)
        if not length or raw[-1] != 0:
            raise ConversionError(f"{self.label}: {what} at offset {self.position - length} is not a NUL-terminated "
                                  f"string; not a CTranslate2 model.bin or a damaged one")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConversionError(f"{self.label}: {what} is not UTF-8 ({exc}); not a CTranslate2 model.bin") from exc

    def close(self) -> None:
        self.handle.close()


def read(paths: Union[Path, Sequence[Path]], skip: Tuple[str, ...] = ()) -> CT2Model:
    """Read model.bin (one path, or its parts in order); variables starting with a `skip` prefix are
    placeholders (see the module docstring). Raises ConversionError naming the file(s) on anything that
    is not a complete CTranslate2 binary model of a version listed in BINARY_VERSIONS."""
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    for path in paths:
        if not path.is_file():
            raise ConversionError(f"{path}: no such file; expected a CTranslate2 model.bin (or its parts)")
    stream = _Parts(paths)
    try:
        version = stream.number("I", "the binary version")
        if version not in BINARY_VERSIONS:
            raise ConversionError(f"{stream.label}: binary version {version} (first bytes "
                                  f"{struct.pack('<I', version)!r}); expected a CTranslate2 model.bin of version "
                                  f"{' or '.join(map(str, BINARY_VERSIONS))}")
        spec = stream.string("the model spec name")
        revision = stream.number("I", "the spec revision")
        count = stream.number("I", "the variable count")
        if count > MAX_VARIABLES:
            raise ConversionError(f"{stream.label}: {count} variables is not plausible; not a CTranslate2 model.bin")
        variables = {}
        for i in range(count):
            name = stream.string(f"the name of variable {i}")
            rank = stream.number("B", f"the rank of {name!r}")
            shape = stream.unpack(f"{rank}I", f"the shape of {name!r}")
            type_id = stream.number("B", f"the dtype of {name!r}")
            dtype = DTYPES[type_id] if type_id < len(DTYPES) else None
            if dtype is None:
                raise ConversionError(f"{stream.label}: variable {name!r} has dtype id {type_id}; this reader handles "
                                      f"float32, int8, int16, int32 and float16 (convert the model without bfloat16)")
            size = stream.number("I", f"the byte count of {name!r}")
            expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if size != expected:
                raise ConversionError(f"{stream.label}: variable {name!r} of shape {shape} ({np.dtype(dtype).name}) "
                                      f"declares {size} bytes, expected {expected}; the file is damaged")
            if skip and name.startswith(skip):
                stream.skip(size, f"variable {name!r}")
                variables[name] = np.broadcast_to(np.zeros((), dtype), shape)
            else:
                raw = stream.read(size, f"variable {name!r} {shape}")
                variables[name] = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
        aliases = {}
        for i in range(stream.number("I", "the alias count")):
            alias = stream.string(f"alias {i}")
            aliases[alias] = stream.string(f"the target of alias {alias!r}")
        if stream.position != stream.total:
            raise ConversionError(f"{stream.label}: {stream.total - stream.position} extra byte(s) after the last "
                                  f"alias at offset {stream.position}; expected the model to end there (a damaged "
                                  f"file, or parts joined in the wrong order)")
    finally:
        stream.close()
    return CT2Model(spec, revision, variables, aliases, paths)


__all__ = ["CT2Model", "read", "BINARY_VERSIONS"]
