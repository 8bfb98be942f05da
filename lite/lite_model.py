"""`LiteModel`: the mindspore_lite Model API over the runtimes this machine has.

Shaped like `mindspore_lite.Model` (build_from_file, get_inputs, resize, predict; a Context with a CPU
thread count; tensors with set_data_from_numpy / get_data_to_numpy) so device code written for Lite
reads the same. Backends, tried in this order by `backend="auto"`:
  mindspore_lite  the real Lite Python package, when it imports (none exists for Python > 3.7 today);
  lite2           the MindSpore Lite 2.0 runtime of the registry wheel, through lite/bridge.cc in a
                  worker process (lite/lite2_runtime.py); reads the MindIR v1 files of `--target lite2`;
  graphcell       mindspore.load + nn.GraphCell, always available; reads the package's own MindIR.
`backend_report()` says which is active and why the others are not (`mindvl lite info`).
"""
import os
import subprocess
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.choices import LITE_BACKENDS
from mindvl.errors import MindvlError
from mindvl.lite import lite2_runtime

BACKENDS = tuple(b for b in LITE_BACKENDS if b != "auto")  # the runtimes, in the order "auto" tries them
TensorInfo = Tuple[str, str, Tuple[int, ...]]  # name, numpy dtype name, shape


class LiteError(MindvlError, RuntimeError):
    """A model that cannot be built or run; the message names the file or tensor and the fix."""


@dataclass
class CPUDeviceInfo:
    thread_num: int = 1


@dataclass
class Context:
    """mindspore_lite.Context's shape: `target` and `cpu.thread_num`."""
    thread_num: int = 1
    target: List[str] = field(default_factory=lambda: ["cpu"])

    def __post_init__(self) -> None:
        if int(self.thread_num) < 1:
            raise LiteError(f"Context(thread_num={self.thread_num}): use 1 or more threads")
        self.cpu = CPUDeviceInfo(int(self.thread_num))


class LiteTensor:
    """A named tensor: the model's inputs (fill with set_data_from_numpy) and its outputs."""

    def __init__(self, name: str, dtype: str, shape: Sequence[int], data: Optional[np.ndarray] = None) -> None:
        self.name, self.dtype, self.shape = name, np.dtype(dtype), tuple(int(d) for d in shape)
        self._data = data

    def set_data_from_numpy(self, array: np.ndarray) -> None:
        array = np.asarray(array)
        if array.dtype != self.dtype or tuple(array.shape) != self.shape:
            raise LiteError(f"input {self.name}: got {array.dtype}{list(array.shape)}, the model expects "
                            f"{self.dtype}{list(self.shape)}; cast it, or resize the model first")
        self._data = np.ascontiguousarray(array)

    def get_data_to_numpy(self) -> np.ndarray:
        if self._data is None:
            raise LiteError(f"tensor {self.name}: holds no data yet")
        return self._data

    def __repr__(self) -> str:
        return f"LiteTensor({self.name}, {self.dtype}, {list(self.shape)})"


# ----------------------------------------------------------------------------- backends
# Each: build(path, threads), inputs(), outputs() -> [TensorInfo], resize(shapes), predict(arrays) ->
# [array], close().

class GraphCellBackend:
    name = "graphcell"

    def build(self, path: str, threads: int, key: Optional[bytes] = None) -> None:
        import mindspore as ms
        from mindspore import nn

        from mindvl.mindir import mindir_io

        self._inputs, self._outputs = mindir_io(Path(path).read_bytes()) if key is None else (None, None)
        options = {"dec_key": key, "dec_mode": "AES-GCM"} if key else {}
        try:
            self.cell = nn.GraphCell(ms.load(path, **options))
        except (RuntimeError, ValueError) as exc:
            raise LiteError(f"{path}: MindSpore could not load it: {str(exc).strip().splitlines()[0]}") from exc
        self.ms = ms

    def inputs(self) -> List[TensorInfo]:
        return self._inputs

    def outputs(self) -> List[TensorInfo]:
        return self._outputs

    def resize(self, shapes: Sequence[Sequence[int]]) -> None:
        for (name, _, shape), new in zip(self._inputs, shapes):
            if len(new) != len(shape) or any(d >= 0 and d != n for d, n in zip(shape, new)):
                raise LiteError(f"input {name}: this graph has the fixed shape {list(shape)}, not {list(new)}; "
                                f"use the package's dynamic-batch graph")
        self._inputs = [(name, dtype, tuple(new)) for (name, dtype, _), new in zip(self._inputs, shapes)]

    def predict(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        outputs = self.cell(*(self.ms.Tensor(a) for a in arrays))
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return [o.asnumpy() for o in outputs]

    def close(self) -> None:
        self.cell = None


class Lite2Backend:
    """The Lite 2.0 runtime in a worker process (lite/worker.py)."""
    name = "lite2"

    def __init__(self) -> None:
        self.process = None
        self.last_predict_seconds = 0.0  # the runtime's own time for the last predict, without the pipe

    def _call(self, *request):
        if self.process is None or self.process.poll() is not None:
            raise LiteError("the Lite 2.0 worker process is not running (it exited: see its messages above)")
        try:
            self.requests.send(request)
            status, reply = self.replies.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            code = self.process.wait(timeout=5)
            raise LiteError(f"the Lite 2.0 worker died during {request[0]} (exit code {code}); its messages "
                            f"are above") from exc
        if status != "ok":
            raise LiteError(reply)
        return reply

    def build(self, path: str, threads: int, key: Optional[bytes] = None) -> None:
        if key is not None:
            raise LiteError(f"{path}: encrypted models are not supported on the Lite 2.0 runtime; use "
                            f"backend='graphcell' or export the lite2 package without a key")
        try:
            bridge = lite2_runtime.bridge_path()
        except lite2_runtime.Lite2Unavailable as exc:
            raise LiteError(f"the Lite 2.0 runtime is unavailable: {exc}") from exc
        request_read, request_write = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "mindvl.lite.worker", str(bridge)],
                                        stdin=request_read, stdout=subprocess.PIPE)
        os.close(request_read)
        self.requests = Connection(request_write, readable=False)
        self.replies = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdout.close()
        self._inputs, self._outputs = self._call("build", str(path), int(threads))

    def inputs(self) -> List[TensorInfo]:
        return self._inputs

    def outputs(self) -> List[TensorInfo]:
        return self._outputs

    def resize(self, shapes: Sequence[Sequence[int]]) -> None:
        self._inputs, self._outputs = self._call("resize", [list(s) for s in shapes])

    def predict(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        results, self.last_predict_seconds = self._call("predict", [np.ascontiguousarray(a) for a in arrays])
        return [array for _, array in results]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.requests.send(("close",))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self.requests.close()
            self.replies.close()
        self.process = None


class MindSporeLiteBackend:
    """The real `mindspore_lite` package (Lite's own Python API), when this Python has it."""
    name = "mindspore_lite"

    def build(self, path: str, threads: int, key: Optional[bytes] = None) -> None:
        import mindspore_lite as mslite

        context = mslite.Context()
        context.target = ["cpu"]
        context.cpu.thread_num = threads
        self.model = mslite.Model()
        self.model.build_from_file(str(path), mslite.ModelType.MINDIR, context,
                                   **({"dec_key": key, "dec_mode": "AES-GCM"} if key else {}))

    def _infos(self, tensors) -> List[TensorInfo]:
        return [(t.name, np.dtype(t.get_data_to_numpy().dtype).name, tuple(t.shape)) for t in tensors]

    def inputs(self) -> List[TensorInfo]:
        return self._infos(self.model.get_inputs())

    def outputs(self) -> List[TensorInfo]:
        return self._infos(self.model.get_outputs())

    def resize(self, shapes: Sequence[Sequence[int]]) -> None:
        self.model.resize(self.model.get_inputs(), [list(s) for s in shapes])

    def predict(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        inputs = self.model.get_inputs()
        for tensor, array in zip(inputs, arrays):
            tensor.set_data_from_numpy(np.ascontiguousarray(array))
        return [t.get_data_to_numpy() for t in self.model.predict(inputs)]

    def close(self) -> None:
        self.model = None


FACTORIES = {"mindspore_lite": MindSporeLiteBackend, "lite2": Lite2Backend, "graphcell": GraphCellBackend}


def backend_report() -> List[Dict[str, object]]:
    """Each backend in the order `auto` tries them: {"backend", "available", "detail"}; the first
    available one is what LiteModel() uses."""
    rows = []
    try:
        import mindspore_lite

        rows.append({"backend": "mindspore_lite", "available": True,
                     "detail": f"mindspore_lite {getattr(mindspore_lite, '__version__', '?')} imports"})
    except Exception as exc:  # ImportError, or a wheel for another Python failing to load
        rows.append({"backend": "mindspore_lite", "available": False,
                     "detail": f"cannot import mindspore_lite ({type(exc).__name__}: {exc}); the package registry has it "
                               f"for Python 3.7 only (this is {sys.version_info.major}.{sys.version_info.minor})"})
    reason = lite2_runtime.status()
    rows.append({"backend": "lite2", "available": not reason,
                 "detail": reason or f"MindSpore Lite 2.0 ({lite2_runtime.WHEEL_REQUIREMENT}) in {lite2_runtime.runtime_dir()}, "
                                     f"bridge {lite2_runtime.bridge_path().name}, run in a worker process"})
    try:
        import mindspore

        rows.append({"backend": "graphcell", "available": True,
                     "detail": f"mindspore {mindspore.__version__}: mindspore.load + nn.GraphCell"})
    except ImportError as exc:
        rows.append({"backend": "graphcell", "available": False, "detail": f"cannot import mindspore ({exc})"})
    return rows


def default_backend() -> str:
    for row in backend_report():
        if row["available"]:
            return str(row["backend"])
    raise LiteError("no runtime is available: install mindspore (`pip install mindspore==2.10.0`)")


class LiteModel:
    """A model on the device runtime; see the module docstring for the backends."""

    def __init__(self, backend: str = "auto") -> None:
        if backend not in LITE_BACKENDS:
            raise LiteError(f"backend {backend!r}: choose {', '.join(LITE_BACKENDS)}")
        self.backend_name = default_backend() if backend == "auto" else backend
        self._backend = None
        self._fixed_batch = False  # a resize failed: run() feeds other batch sizes in chunks
        self.output_names: Optional[List[str]] = None  # set by from_package: the manifest's output names

    # -- the mindspore_lite API
    def build_from_file(self, model_path: Union[str, Path], model_type: str = "mindir",
                        context: Optional[Context] = None, key: Optional[bytes] = None) -> "LiteModel":
        if str(model_type).lower().split(".")[-1] != "mindir":
            raise LiteError(f"model_type {model_type!r}: mindvl runs MindIR models only")
        path = Path(model_path)
        if not path.is_file():
            raise LiteError(f"{path}: no such model file")
        context = context or Context()
        self.close()
        backend = FACTORIES[self.backend_name]()
        try:
            backend.build(str(path), context.cpu.thread_num, key)
        except LiteError:
            backend.close()
            raise
        except Exception as exc:  # the runtimes raise their own types
            backend.close()
            raise LiteError(f"{path}: the {self.backend_name} backend could not build it: {exc}") from exc
        self._backend, self.path, self.context = backend, path, context
        self._fixed_batch = False
        return self

    def _require(self):
        if self._backend is None:
            raise LiteError("the model is not built: call build_from_file first")
        return self._backend

    def get_inputs(self) -> List[LiteTensor]:
        return [LiteTensor(*info) for info in self._require().inputs()]

    def get_outputs(self) -> List[LiteTensor]:
        names = self.output_names or [info[0] for info in self._require().outputs()]
        return [LiteTensor(name, dtype, shape) for name, (_, dtype, shape) in zip(names, self._require().outputs())]

    def resize(self, inputs: Sequence[LiteTensor], dims: Sequence[Sequence[int]]) -> None:
        if len(dims) != len(self._require().inputs()):
            raise LiteError(f"resize: {len(dims)} shapes for {len(self._require().inputs())} inputs")
        try:
            self._require().resize(dims)
        except LiteError:
            raise
        except Exception as exc:
            raise LiteError(f"resize to {[list(d) for d in dims]}: {exc}") from exc
        for tensor, shape in zip(inputs, dims):
            tensor.shape = tuple(int(d) for d in shape)

    def predict(self, inputs: Sequence[LiteTensor]) -> List[LiteTensor]:
        backend = self._require()
        expected = backend.inputs()
        if len(inputs) != len(expected):
            raise LiteError(f"predict: {len(inputs)} inputs given, the model has {len(expected)} "
                            f"({', '.join(name for name, _, _ in expected)})")
        arrays = []
        for tensor, (name, dtype, shape) in zip(inputs, expected):
            array = tensor.get_data_to_numpy()
            if array.dtype != np.dtype(dtype) or tuple(array.shape) != tuple(shape):
                raise LiteError(f"input {name}: got {array.dtype}{list(array.shape)}, the model expects "
                                f"{dtype}{list(shape)}")
            arrays.append(array)
        try:
            results = backend.predict(arrays)
        except LiteError:
            raise
        except Exception as exc:
            raise LiteError(f"predict on the {self.backend_name} backend failed: {exc}") from exc
        names = self.output_names or [info[0] for info in backend.outputs()]
        return [LiteTensor(name, a.dtype, a.shape, a) for name, a in zip(names, results)]

    # -- conveniences
    def run(self, arrays: Union[Mapping[str, np.ndarray], Sequence[np.ndarray]]) -> Dict[str, np.ndarray]:
        """Predict from arrays (in input order, or by input name) -> {output name: array}. Arrays of the inputs'
        own shapes run as they are; a new batch size resizes the model; a static graph that cannot resize (its shape
        constants hold the batch, as the lite2 graphs' do) gets the rows in chunks of its own batch, the last one
        padded."""
        inputs = self.get_inputs()
        if isinstance(arrays, Mapping):
            missing = [t.name for t in inputs if t.name not in arrays]
            if missing:
                raise LiteError(f"run: missing inputs {missing} (the model takes {[t.name for t in inputs]})")
            arrays = [arrays[t.name] for t in inputs]
        arrays = [np.asarray(a).astype(t.dtype, copy=False) for a, t in zip(arrays, inputs)]
        if len(arrays) != len(inputs):
            raise LiteError(f"run: {len(arrays)} arrays for {len(inputs)} inputs")
        if all(a.shape == tuple(t.shape) for a, t in zip(arrays, inputs)):  # as the graph takes them, batch axis or
            return self._predict_arrays(arrays)  # not (a native VLM's vision graph: one packed sequence)
        for array, tensor in zip(arrays, inputs):
            if array.shape[1:] != tensor.shape[1:] or array.shape[0] != arrays[0].shape[0]:
                raise LiteError(f"run: input {tensor.name} has shape {list(array.shape)}; the model takes "
                                f"{list(tensor.shape)} with one batch size for every input")
        if arrays[0].shape[0] != inputs[0].shape[0]:
            if self._fixed_batch:
                return self._run_in_chunks(arrays, inputs[0].shape[0])
            try:
                self.resize(inputs, [a.shape for a in arrays])
            except LiteError:
                self._fixed_batch = True
                return self._run_in_chunks(arrays, inputs[0].shape[0])
        return self._predict_arrays(arrays)

    def _predict_arrays(self, arrays: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
        inputs = self.get_inputs()
        for tensor, array in zip(inputs, arrays):
            tensor.set_data_from_numpy(array)
        return {t.name: t.get_data_to_numpy() for t in self.predict(inputs)}

    def _run_in_chunks(self, arrays: Sequence[np.ndarray], batch: int) -> Dict[str, np.ndarray]:
        rows = arrays[0].shape[0]
        parts: Dict[str, list] = {}
        for start in range(0, rows, batch):
            chunk = [a[start:start + batch] for a in arrays]
            short = batch - len(chunk[0])
            if short:  # pad with copies of the last row; their outputs are dropped
                chunk = [np.concatenate([c, np.repeat(c[-1:], short, axis=0)]) for c in chunk]
            for name, value in self._predict_arrays(chunk).items():
                parts.setdefault(name, []).append(value[:batch - short])
        return {name: np.concatenate(values) for name, values in parts.items()}

    @property
    def last_predict_seconds(self) -> Optional[float]:
        """The runtime's own time for the last predict, where the backend measures it apart (lite2)."""
        return getattr(self._backend, "last_predict_seconds", None)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> "LiteModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    @classmethod
    def from_package(cls, package: Union[str, Path], graph: str = "vqa", context: Optional[Context] = None,
                     backend: str = "auto", key: Optional[bytes] = None) -> "LiteModel":
        """Graph `graph` of a model package on the chosen backend, with the manifest's tensor names: the
        lite2 backend reads the package's lite2/ graphs (`mindvl export --target lite2`), the others the
        standard MindIR. File hashes are checked first."""
        from mindvl.package_reader import check_files, read_manifest

        package = Path(package)
        manifest = read_manifest(package)
        model = cls(backend)
        if graph not in manifest["graphs"]:
            raise LiteError(f"graph {graph}: not in {package} (it has {', '.join(manifest['graphs'])})")
        entry = manifest["graphs"][graph]
        path = package / entry["file"]
        if model.backend_name == "lite2":
            lite2 = (manifest.get("lite2") or {}).get("graphs", {})
            if graph not in lite2:
                raise LiteError(f"{package}: has no Lite 2.0 graph {graph}; export it with `mindvl export "
                                f"--target lite2` (or choose backend='graphcell')")
            path = package / lite2[graph]["file"]
        check_files(package, manifest, [str(path.relative_to(package))])
        model.build_from_file(path, context=context, key=key)
        model.output_names = [t["name"] for t in entry["outputs"]]
        # the lite2 graphs hold their batch in shape constants: run() feeds chunks without trying a resize
        model._fixed_batch = model.backend_name == "lite2"
        return model



class GenerationGraphs:
    """A generative package's graphs as LiteModels, each built on its first call: `graphs(name, inputs)` runs
    graph `name` on arrays in its input order -> its outputs in order. This is the `run` function of the
    engine's PackageGraphs (mindvl.engine.package_graphs), so the package generates on the device runtime:
    attachments, the prompt's bucket and decode are built (a worker process each on lite2), the other
    buckets never. Decode and attachments rows run in chunks of a lite2 graph's batch (LiteModel.run); a
    prefill of more prompts than its batch is refused, since its slot_index addresses the modality rows
    of the whole batch: prefill one prompt at a time (DevicePipeline.generate does)."""

    def __init__(self, package: Union[str, Path], backend: str = "auto", context: Optional[Context] = None,
                 key: Optional[bytes] = None) -> None:
        from mindvl.engine.package_graphs import GenerationSpec, prefill_name
        from mindvl.package_reader import read_manifest

        self.package, self.context, self.key = Path(package), context, key
        self.backend_name = default_backend() if backend == "auto" else backend
        self.spec = GenerationSpec.from_manifest(read_manifest(self.package))
        self.prefills = {prefill_name(bucket) for bucket in self.spec.buckets}
        self.models: Dict[str, LiteModel] = {}

    def model(self, name: str) -> LiteModel:
        """Graph `name`'s LiteModel, built now if it was not yet."""
        if name not in self.models:
            self.models[name] = LiteModel.from_package(self.package, name, self.context, self.backend_name,
                                                       self.key)
        return self.models[name]

    def __call__(self, name: str, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
        model = self.model(name)
        rows, batch = len(inputs[0]), model.get_inputs()[0].shape[0]
        if name in self.prefills and model._fixed_batch and rows > batch:
            raise LiteError(f"graph {name}: {rows} prompts for a graph of batch {batch}; their slot_index addresses "
                            f"one modality table for the whole batch, so they cannot run in turn: prefill one "
                            f"prompt at a time")
        return list(model.run(list(inputs)).values())

    def close(self) -> None:
        for model in self.models.values():
            model.close()
        self.models.clear()

    def __enter__(self) -> "GenerationGraphs":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
