"""The process that holds a Lite 2.0 model: `python -m mindvl.lite.worker BRIDGE` (see lite/lite2_runtime.py).

It loads the compiled bridge with ctypes and answers requests from its parent over a pipe: build,
resize, predict, close. It never imports mindspore (the wheel's libraries would clash with MindSpore
2.10's), and a crash of the Lite runtime ends this process, not the caller.
"""
import ctypes
import os
import sys
import time
from multiprocessing.connection import Connection
from typing import List, Sequence, Tuple

import numpy as np

MAX_RANK = 8
ERROR_BYTES = 4096
# mindspore::DataType -> numpy (include/api/data_type.h)
DTYPES = {30: np.bool_, 32: np.int8, 33: np.int16, 34: np.int32, 35: np.int64, 37: np.uint8, 38: np.uint16,
          39: np.uint32, 40: np.uint64, 42: np.float16, 43: np.float32, 44: np.float64}

TensorInfo = Tuple[str, str, Tuple[int, ...]]  # name (graph prefix removed), numpy dtype name, shape


class Bridge:
    """The bridge's C functions with their signatures."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.mvl_build.restype = ctypes.c_void_p
        lib.mvl_build.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.mvl_free.argtypes = [ctypes.c_void_p]
        lib.mvl_count.argtypes = [ctypes.c_void_p, ctypes.c_int]
        describe = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int),
                    ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.mvl_describe.argtypes = [ctypes.c_void_p, ctypes.c_int, *describe[1:]]
        lib.mvl_result.argtypes = describe
        lib.mvl_resize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int),
                                   ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.mvl_predict.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.mvl_result_copy.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self.lib = lib
        self.error = ctypes.create_string_buffer(ERROR_BYTES)

    def message(self) -> str:
        return self.error.value.decode(errors="replace").strip() or "no message from the runtime"


class Model:
    """One built Lite model inside the worker."""

    def __init__(self, bridge: Bridge, path: str, threads: int) -> None:
        self.bridge = bridge
        self.handle = bridge.lib.mvl_build(path.encode(), threads, bridge.error, ERROR_BYTES)
        if not self.handle:
            raise RuntimeError(f"Lite 2.0 could not build {path}: {bridge.message()}")

    def _info(self, call, *args) -> TensorInfo:
        name = ctypes.create_string_buffer(512)
        dtype, rank = ctypes.c_int(), ctypes.c_int()
        shape = (ctypes.c_int64 * MAX_RANK)()
        if call(self.handle, *args, name, 512, ctypes.byref(dtype), shape, ctypes.byref(rank), MAX_RANK) != 0:
            raise RuntimeError(f"tensor {args[-1]}: cannot be described")
        numpy_type = DTYPES.get(dtype.value)
        if numpy_type is None:
            raise RuntimeError(f"tensor {name.value.decode()}: unsupported element type {dtype.value}")
        return name.value.decode().split(":")[-1], np.dtype(numpy_type).name, tuple(shape[:rank.value])

    def tensors(self, outputs: bool) -> List[TensorInfo]:
        count = self.bridge.lib.mvl_count(self.handle, int(outputs))
        return [self._info(self.bridge.lib.mvl_describe, int(outputs), i) for i in range(count)]

    def resize(self, shapes: Sequence[Sequence[int]]) -> None:
        flat = [int(d) for shape in shapes for d in shape]
        ranks = (ctypes.c_int * len(shapes))(*[len(s) for s in shapes])
        if self.bridge.lib.mvl_resize(self.handle, (ctypes.c_int64 * max(1, len(flat)))(*flat), ranks, len(shapes),
                                      self.bridge.error, ERROR_BYTES) != 0:
            raise RuntimeError(f"resize to {[list(s) for s in shapes]} failed: {self.bridge.message()}")

    def predict(self, arrays: Sequence[np.ndarray]) -> Tuple[List[Tuple[str, np.ndarray]], float]:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        sizes = (ctypes.c_size_t * len(arrays))(*[a.nbytes for a in arrays])
        start = time.perf_counter()
        if self.bridge.lib.mvl_predict(self.handle, pointers, sizes, len(arrays), self.bridge.error, ERROR_BYTES) != 0:
            raise RuntimeError(f"predict failed: {self.bridge.message()}")
        seconds = time.perf_counter() - start
        results = []
        for index in range(self.bridge.lib.mvl_count(self.handle, 1)):
            name, dtype, shape = self._info(self.bridge.lib.mvl_result, index)
            array = np.empty(shape, dtype)
            if self.bridge.lib.mvl_result_copy(self.handle, index, array.ctypes.data, array.nbytes) != 0:
                raise RuntimeError(f"output {name}: copy failed")
            results.append((name, array))
        return results, seconds

    def close(self) -> None:
        if self.handle:
            self.bridge.lib.mvl_free(self.handle)
            self.handle = None


def serve(bridge_path: str, requests: Connection, replies: Connection) -> None:
    bridge = Bridge(bridge_path)
    model = None
    while True:
        try:
            command, *args = requests.recv()
        except EOFError:  # the parent went away
            break
        try:
            if command == "build":
                model = Model(bridge, *args)
                reply = (model.tensors(False), model.tensors(True))
            elif command == "resize":
                model.resize(*args)
                reply = (model.tensors(False), model.tensors(True))
            elif command == "predict":
                reply = model.predict(*args)
            elif command == "close":
                break
            else:
                raise RuntimeError(f"unknown request {command!r}")
            replies.send(("ok", reply))
        except Exception as exc:  # every failure goes back to the caller as its message
            replies.send(("error", str(exc)))
    if model is not None:
        model.close()


def main() -> None:
    # requests arrive on fd 0; replies leave on a copy of fd 1, and fd 1 itself becomes stderr so that
    # anything the runtime prints cannot corrupt the reply stream
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    serve(sys.argv[1], Connection(0, writable=False), replies)


if __name__ == "__main__":
    main()
