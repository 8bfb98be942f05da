"""A servable version loaded for serving: its graphs as GraphCells, its methods run over batches of instances.

A method runs the stages servable_config.py recorded. Python stages run once per instance in the worker
pool, and stages that do not depend on each other run at the same time (the image, question and speech
preprocessing of a predict); a model stage stacks its instances into one batch for its graph, which runs
on its own thread, one batch at a time. One instance's failure (a corrupt JPEG) fails that instance only.

A version folder holds a mindvl model package or, as MindSpore Serving's do, bare MindIR files. Loading a
package checks every file's sha256, then runs each graph on the package's stored samples: a version whose
graphs do not reproduce the exported outputs is refused. Bare MindIR files are read for their inputs and
outputs (dtypes, shapes, batch dimension), as MindSpore Serving reads them. Either way the graphs are
compiled before the first request arrives.
"""
import asyncio
import dataclasses
import logging
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from google.protobuf.message import DecodeError

from mindvl import preprocess as P
from mindvl.engine.package_graphs import SECTION
from mindvl.errors import MindvlError, plain
from mindvl.mindir import mindir_io
from mindvl.package_reader import (MANIFEST, TOLERANCE, as_array, as_tuple, check_files, load_graph, load_samples,
                                   read_manifest)
from mindvl.serving.batching import Batcher, BatchPolicy
from mindvl.serving.continuous_batching import (Choices, ContinuousBatcher, GenerationOptions, GenerationRequest, request_history,
                                                request_settings)
from mindvl.serving.protocol import InstanceError, ProtocolError
from mindvl.serving.register import (GENERATION_INPUTS, Method, Model, Placeholder, ServableDefinition, ServableError,
                                     Stage, load_servable_config)
from mindvl.serving.servable import CONFIG_FILE, check_config, resolve

# A graph with a dynamic batch dimension compiles once per batch size it meets (~0.2 s each for the tiny
# recipe): batches are padded up to one of these sizes, and loading compiles them all before requests come.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_GRAPH_BATCH = BATCH_BUCKETS[-1]  # larger batches run in chunks of this many rows (bounded memory)
# MindSpore deadlocks when two GraphCells execute at once from two threads (both stuck in _exec_pip): graphs
# run one at a time in the process, each still on its own runner thread; the Python stages stay parallel.
GRAPH_LOCK = threading.Lock()
MAX_FILES = {"images": 32, "video": 256}  # encoded files one question may send as a list (images, a video's frames)
LOG = logging.getLogger("mindvl.serving")


def bucket(size: int) -> int:
    """The smallest batch bucket holding `size` rows."""
    return next(b for b in BATCH_BUCKETS if b >= size)


class MethodNotFound(ProtocolError):
    """The servable has no method of that name."""


def _levels(method: Method) -> List[List[Stage]]:
    """The method's stages grouped so that each group depends only on the groups before it."""
    level_of: Dict[int, int] = {0: -1}  # stage number -> its group; the inputs (stage 0) come before all
    groups: List[List[Stage]] = []
    for number, stage in enumerate(method.stages, 1):
        level = 1 + max((level_of[arg.stage] for arg in stage.args), default=-1)
        level_of[number] = level
        if level == len(groups):
            groups.append([])
        groups[level].append(stage)
    return groups


def serving_type_name(dtype) -> str:
    """MindSpore Serving's name of a dtype in its messages: kMSI_ and numpy's name capitalised (kMSI_Float32,
    kMSI_Uint8, kMSI_Bool), kMSI_String for text."""
    kind = np.dtype(dtype)
    if kind.kind in "biuf" and kind.itemsize <= 8:
        return f"kMSI_{kind.name.capitalize()}"
    return "kMSI_String" if kind.kind in "OUS" else "kMSI_Unknown"


class GraphRunner:
    """One graph (one file of a declared model) run on its own thread, as MindSpore Serving runs a model.

    `inputs` and `outputs` are the graph's tensors ({name, dtype, shape}, the full shapes; -1: any size).
    With `batched` (declare_model's with_batch_dim) dimension 0 is the batch: an instance holds one row,
    instances are stacked, and a graph whose batch is fixed (N) gets N rows, padded with repeats of the
    first; a dynamic batch (-1) is padded to a batch bucket. Inputs in `shared` (without_batch_dim_inputs)
    are not stacked: instances that give them the same value run together. Without `batched`, every
    instance is a whole input of the graph and runs alone. An instance's input is checked by its size in
    bytes and its dtype, with MindSpore Serving's messages, and takes the graph's shape.
    """

    def __init__(self, name: str, cell, inputs: List[dict], outputs: List[dict], batched: bool = True,
                 shared: Sequence[int] = ()) -> None:
        self.name = name
        self.cell = cell
        self.inputs = inputs
        self.outputs = outputs
        self.batched = batched
        self.shared = frozenset(shared) if batched else frozenset(range(len(inputs)))
        self.batch = graph_batch(inputs, outputs, self.shared) if batched else 1  # None: dynamic
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"graph-{name}")

    def instance_shape(self, index: int) -> Tuple[int, ...]:
        shape = tuple(self.inputs[index]["shape"])
        return shape if index in self.shared else shape[1:]

    def check_instance(self, values: Sequence[Any]) -> List[np.ndarray]:
        """One instance's inputs as arrays of the graph's shapes; InstanceError with MindSpore Serving's phrase,
        then which graph input and what was given."""
        if len(values) != len(self.inputs):
            raise InstanceError(f"Given model inputs size {len(values)} not match model inputs size "
                                f"{len(self.inputs)} (graph {self.name})")
        arrays = []
        for index, (value, spec) in enumerate(zip(values, self.inputs)):
            array, want, dtype = np.asarray(value), self.instance_shape(index), np.dtype(spec["dtype"])
            detail = (f" (graph {self.name} input {spec['name']}: given {array.dtype} of shape {list(array.shape)}, "
                      f"expected {dtype} of shape {list(want)}{'; -1: any size' if -1 in want else ''})")
            if -1 not in want:
                size = int(np.prod(want, dtype=np.int64)) * dtype.itemsize
                if array.nbytes != size:
                    raise InstanceError(f"Given model input {index} size {array.nbytes} not match the size {size} "
                                        f"defined in model{detail}")
            elif array.ndim != len(want) or any(w not in (-1, g) for w, g in zip(want, array.shape)):
                raise InstanceError(f"Given model input {index} shape {list(array.shape)} not match the shape "
                                    f"{list(want)} defined in model{detail}")
            if array.dtype != dtype:
                raise InstanceError(f"Given model input {index} data type {serving_type_name(array.dtype)} not match "
                                    f"the data type {serving_type_name(dtype)} defined in model{detail}")
            arrays.append(array.reshape(want) if -1 not in want else array)
        return arrays

    def run(self, *columns: np.ndarray) -> Tuple[np.ndarray, ...]:
        """The graph on stacked inputs (shared ones as they are), in chunks of the graph's batch and padded to it
        (blocking: call it on the graph's thread or while loading)."""
        rows = len(next(c for i, c in enumerate(columns) if i not in self.shared))
        limit = self.batch or MAX_GRAPH_BATCH
        if rows > limit:
            return tuple(np.concatenate(parts) for parts in zip(*(
                self.run(*(c if i in self.shared else c[start:start + limit] for i, c in enumerate(columns)))
                for start in range(0, rows, limit))))
        padding = (self.batch or bucket(rows)) - rows  # repeats of row 0: real inputs, so no NaN from an empty mask
        columns = [np.concatenate([c, np.repeat(c[:1], padding, axis=0)]) if padding and i not in self.shared else c
                   for i, c in enumerate(columns)]
        return tuple(output[:rows] for output in self._execute(columns))

    def _execute(self, arrays: Sequence[np.ndarray]) -> Tuple[np.ndarray, ...]:
        """The graph once on `arrays`, as they are."""
        with GRAPH_LOCK:
            return tuple(output.asnumpy() for output in as_tuple(self.cell(*(ms.Tensor(a) for a in arrays))))

    def run_checked(self, instances: List[List[np.ndarray]]) -> List[Tuple[np.ndarray, ...]]:
        """Outputs per instance for checked instances (blocking: call it on the graph's thread)."""
        if not self.batched:
            return [self._execute(arrays) for arrays in instances]
        groups: Dict[tuple, List[int]] = {}  # instances giving the shared inputs the same values run together
        for row, arrays in enumerate(instances):
            groups.setdefault(tuple(arrays[i].tobytes() for i in sorted(self.shared)), []).append(row)
        results: List[Any] = [None] * len(instances)
        for rows in groups.values():
            first = instances[rows[0]]
            outputs = self.run(*(first[i] if i in self.shared else np.stack([instances[r][i] for r in rows])
                                 for i in range(len(self.inputs))))
            for position, row in enumerate(rows):
                results[row] = tuple(output[position] for output in outputs)
        return results

    async def run_instances(self, instances: List[List[np.ndarray]]) -> List[Tuple[np.ndarray, ...]]:
        return await asyncio.get_running_loop().run_in_executor(self.thread, self.run_checked, instances)

    def warm_up(self, sample: Sequence[np.ndarray], max_batch: int) -> None:
        """Compile the graph now, not on the first request: every batch bucket up to `max_batch` for a dynamic
        batch, else its one shape. `sample`: one batch of inputs (one instance without `batched`)."""
        if not self.batched or self.batch:
            self._execute(sample)
            return
        for size in BATCH_BUCKETS:
            self.run(*(a if i in self.shared else np.repeat(a[:1], size, axis=0) for i, a in enumerate(sample)))
            if size >= max_batch:
                break

    def close(self) -> None:
        self.thread.shutdown(wait=True)


def graph_batch(inputs: List[dict], outputs: List[dict], shared: frozenset) -> Optional[int]:
    """The batch size of a graph declared with_batch_dim: dimension 0 of its stacked inputs and of its
    outputs, the same for all (None: dynamic, -1); ServableError with MindSpore Serving's messages."""
    sizes = set()
    for what, tensors in (("input", inputs), ("output", outputs)):
        for index, tensor in enumerate(tensors):
            if what == "input" and index in shared:
                continue
            shape = list(tensor["shape"])
            if not shape:
                raise ServableError(f"The shape of model {what} {index} cannot be empty, when with_batch_dim is true "
                                    f"and without_batch_dim_inputs is {sorted(shared)}; declare the model with "
                                    f"with_batch_dim=False or list the input in without_batch_dim_inputs")
            if shape[0] == 0 or shape[0] < -1:
                raise ServableError(f"The shape of model {what} {index} is invalid, shape: {shape}")
            if sizes and shape[0] not in sizes:
                raise ServableError(f"The shape {shape} of model {what} {index} does not match current batch size "
                                    f"{sizes.pop()}")
            sizes.add(shape[0])
    if not any(i not in shared for i in range(len(inputs))):
        raise ServableError("without_batch_dim_inputs lists every input of the model, so no input has a batch "
                            "dimension; declare it with with_batch_dim=False")
    size = sizes.pop() if sizes else 1
    return None if size == -1 else size


class ModelRunner:
    """A declared model's graphs (subgraph i: its file i), bound to the Model for Python stages'
    `model.call`: instances -> one output tuple each; a bad instance raises RuntimeError, as there."""

    def __init__(self, graphs: List[GraphRunner]) -> None:
        self.graphs = graphs

    def __call__(self, instances: List[tuple], subgraph: int = 0) -> List[Tuple[np.ndarray, ...]]:
        if not 0 <= subgraph < len(self.graphs):
            raise RuntimeError(f"subgraph {subgraph}: the model has {len(self.graphs)} (one per model file)")
        graph = self.graphs[subgraph]
        checked = []
        for instance in instances:
            try:
                checked.append(graph.check_instance(instance))
            except InstanceError as error:
                raise RuntimeError(str(error)) from None
        return graph.thread.submit(graph.run_checked, checked).result()


def _byte_list(instance: Dict[str, Any], name: str) -> List[bytes]:
    """A generate input that is a list of encoded files (several images, a video's frames), checked, at most
    MAX_FILES[name] of them; [] when absent."""
    value = instance.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, bytes) for item in value):
        raise InstanceError(f"{name}: expected a list of encoded files (bytes)")
    if len(value) > MAX_FILES[name]:
        raise InstanceError(f"{name}: {len(value)} files; a question takes at most {MAX_FILES[name]}")
    return value


@dataclass
class LoadedVersion:
    """Version `version` of servable `name`, ready to run its methods; `manifest` is None for a MindSpore
    Serving servable's bare MindIR files."""

    name: str
    version: int
    folder: Path
    manifest: Optional[dict]
    definition: ServableDefinition
    models: Dict[int, ModelRunner]  # id(Model) -> its graphs
    levels: Dict[str, List[List[Stage]]] = field(default_factory=dict)
    batchers: Dict[int, Batcher] = field(default_factory=dict)  # id(GraphRunner) -> its batcher, made at first use
    loaded_at: float = field(default_factory=time.time)
    batcher: Optional[ContinuousBatcher] = None  # a generative package's (declare_generation)

    def __post_init__(self) -> None:
        self.levels = {name: _levels(method) for name, method in self.definition.methods.items()}

    @property
    def methods(self) -> Dict[str, Method]:
        return self.definition.methods

    def method(self, name: str) -> Method:
        if name not in self.methods:
            raise MethodNotFound(f"method is not available: servable {self.name} version {self.version} has no "
                                 f"method {name!r} (it has {', '.join(sorted(self.methods))})")
        return self.methods[name]

    async def run(self, method_name: str, instances: List[Dict[str, Any]], pool: Executor,
                  batching: Optional[BatchPolicy] = None) -> List[Any]:
        """One result per instance: {output name: value} or the InstanceError that failed it. With `batching`, the
        instances of concurrent runs meet in batches at each model stage."""
        method = self.method(method_name)
        if self.batcher is not None:
            return await asyncio.gather(*(self._generate(instance, pool) for instance in instances),
                                        return_exceptions=True)
        values: List[Dict[Placeholder, Any]] = []
        failures: List[Optional[BaseException]] = []
        for instance in instances:
            missing = [name for name in method.inputs if name not in instance]
            unknown = [name for name in instance if name not in method.inputs]
            failure = None
            if missing or unknown:
                problem = f"Cannot find input {missing[0]} in instance input" if missing \
                    else f"input {unknown[0]!r} is not an input of the method"
                failure = InstanceError(f"{problem}; method {method.name} takes {', '.join(method.inputs)}")
            failures.append(failure)
            values.append({} if failure else {Placeholder(method.name, 0, i): self._input(instance[name])
                                              for i, name in enumerate(method.inputs)})
        for group in self.levels[method.name]:
            await asyncio.gather(*(self._run_stage(method, stage, values, failures, pool, batching)
                                   for stage in group))
        return [failure or {name: values[i][placeholder] for name, placeholder in zip(method.output_names,
                                                                                      method.returns)}
                for i, failure in enumerate(failures)]

    async def start_generation(self, instance: Dict[str, Any], pool: Executor) -> GenerationRequest:
        """Queue one `generate` instance (its image and audio preprocessed in `pool`); InstanceError for a bad one."""
        return (await self.start_choices(instance, pool, 1)).requests[0]

    async def start_choices(self, instance: Dict[str, Any], pool: Executor, count: int) -> Choices:
        """Queue `count` generations of one `generate` instance, its prompt prepared once; with a seed, choice i
        samples with seed + i (each its own tokens, all reproducible)."""
        unknown = [name for name in instance if name not in GENERATION_INPUTS]
        if unknown:
            raise InstanceError(f"input {unknown[0]!r} is not an input of the method; method generate takes "
                                f"{', '.join(GENERATION_INPUTS)}")
        try:
            text = instance.get("text", "")
            for name, kind in (("text", str), ("image", bytes), ("audio", bytes)):
                if instance.get(name) is not None:
                    P.expect(instance[name], kind, name)
            images, video = _byte_list(instance, "images"), instance.get("video")
            if video is not None and not isinstance(video, bytes):
                video = _byte_list(instance, "video")  # its frames
            settings = request_settings(instance)
            history = request_history(instance.get("history"))
            loop = asyncio.get_running_loop()
            prompt = await loop.run_in_executor(pool, self.batcher.prepare, text, instance.get("image"),
                                                instance.get("audio"), settings, images, video, history)
            seeds = [None if settings.seed is None else settings.seed + i for i in range(count)]
            return Choices([self.batcher.submit(prompt, dataclasses.replace(settings, seed=seed), loop)
                            for seed in seeds])
        except (MindvlError, TypeError, ValueError) as error:
            raise InstanceError(plain(str(error))) from None

    async def _generate(self, instance: Dict[str, Any], pool: Executor) -> Dict[str, Any]:
        request = await self.start_generation(instance, pool)
        try:
            result = await request.result()
        finally:
            request.cancel()  # a request abandoned (timeout, disconnect) stops at the next step
        return {"text": result.text, "tokens": np.asarray(result.tokens, np.int32), "finish_reason": result.finish,
                "prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.tokens),
                "mean_logprob": np.float32(result.mean_logprob), "dropped_turns": result.dropped_turns}

    def _input(self, value: Any) -> Any:
        """A request value as the method's stages get it: MindSpore Serving hands bytes to Python stages as a
        uint8 array (its servables call .tobytes(), cv2.imdecode, ... on them); mindvl's own stages, over a
        package, take the bytes."""
        return np.frombuffer(value, np.uint8) if self.manifest is None and isinstance(value, bytes) else value

    async def _run_stage(self, method: Method, stage: Stage, values: List[Dict[Placeholder, Any]],
                         failures: List[Optional[BaseException]], pool: Executor,
                         batching: Optional[BatchPolicy]) -> None:
        live = [i for i, failure in enumerate(failures) if failure is None]
        if not live:
            return
        arguments = [[values[i][arg] for arg in stage.args] for i in live]
        if stage.is_model:
            outputs = await self._run_model(stage, arguments, batching)
        elif stage.batch_size is None:
            loop = asyncio.get_running_loop()
            outputs = await asyncio.gather(*(loop.run_in_executor(pool, _call, stage, args) for args in arguments),
                                           return_exceptions=True)
        else:
            outputs = await asyncio.get_running_loop().run_in_executor(pool, _call_batched, stage, arguments)
        for i, output in zip(live, outputs):
            if isinstance(output, InstanceError) and stage.is_model:
                failures[i] = output  # MindSpore Serving's input check messages stand alone
            elif isinstance(output, BaseException):  # a Python stage failed: MindSpore Serving's wording
                failures[i] = InstanceError(f"Call {stage.label} Failed, method: '{method.name}', stage index(begin "
                                            f"with 1): {method.stages.index(stage) + 1}, error msg: {output}")
            else:
                values[i].update(zip(stage.outputs, output))

    async def _run_model(self, stage: Stage, arguments: List[List[Any]], batching: Optional[BatchPolicy]) -> List[Any]:
        graph = self.models[id(stage.target)].graphs[0]  # add_stage runs subgraph 0, as in MindSpore Serving
        outputs: List[Any] = [None] * len(arguments)
        checked = []
        for position, args in enumerate(arguments):
            try:
                checked.append((position, graph.check_instance(args)))
            except InstanceError as error:
                outputs[position] = error
        if checked:
            arrays = [arrays for _, arrays in checked]
            results = await (self._batcher(graph, batching).submit(arrays) if batching else graph.run_instances(arrays))
            for (position, _), result in zip(checked, results):
                outputs[position] = result
        return outputs

    def _batcher(self, graph: GraphRunner, batching: BatchPolicy) -> Batcher:
        if id(graph) not in self.batchers:
            self.batchers[id(graph)] = Batcher(graph.run_instances, batching.max_batch, batching.max_wait_s,
                                               lambda size: batching.on_batch(self.name, graph.name, size))
        return self.batchers[id(graph)]

    async def close_batchers(self) -> None:
        """Stop the batchers (on the event loop, before `close`)."""
        for batcher in self.batchers.values():
            await batcher.close()

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        for model in self.models.values():
            for graph in model.graphs:
                graph.close()


def _as_outputs(stage: Stage, result: Any) -> Tuple[Any, ...]:
    """One instance's result of a Python stage as its outputs; MindSpore Tensors become numpy arrays."""
    count = len(stage.outputs)
    outputs = (result,) if count == 1 else tuple(result) if isinstance(result, (tuple, list)) else None
    if outputs is None or len(outputs) != count:
        given = len(result) if isinstance(result, (tuple, list)) else 1
        raise InstanceError(f"The outputs number {given} of one instance returned by function '{stage.name}' is not "
                            f"equal to the outputs number {count} registered in method (outputs_count)")
    return tuple(value.asnumpy() if callable(getattr(value, "asnumpy", None)) else value for value in outputs)


def _call(stage: Stage, args: List[Any]) -> Tuple[Any, ...]:
    return _as_outputs(stage, stage.target(*args))


def _call_batched(stage: Stage, arguments: List[List[Any]]) -> List[Any]:
    """A stage with batch_size N: called with up to N instances' argument tuples (0: all of them), yielding or
    returning one result each."""
    size = stage.batch_size or len(arguments)
    results: List[Any] = []
    for start in range(0, len(arguments), size):
        chunk = [tuple(args) for args in arguments[start:start + size]]
        try:
            produced = list(stage.target(chunk))
            if len(produced) != len(chunk):
                raise InstanceError(f"The number {len(produced)} of instances returned by function '{stage.name}' is "
                                    f"not equal to the number {len(chunk)} of instances provided to this function.")
            results += [_as_outputs(stage, result) for result in produced]
        except Exception as error:  # user code: the chunk's instances fail, the others go on
            results += [error] * len(chunk)
    return results


def load_version(servable_dir: Path, name: str, version: int, key: Optional[bytes] = None,
                 max_batch: int = 1, generation: GenerationOptions = GenerationOptions()) -> LoadedVersion:
    """Load version `version` (0: the newest on disk) of servable `name` and compile its graphs (every batch
    bucket up to `max_batch`). A mindvl model package (manifest.json) is checked file by file and against
    its stored samples; a MindSpore Serving servable's MindIR files are read as MindSpore Serving reads them.
    generation: a generative version's prefix caching and speculation (off by default)."""
    folder = resolve(servable_dir, name, version or None)
    definition = load_servable_config(folder.parent / CONFIG_FILE)
    manifest = read_manifest(folder) if (folder / MANIFEST).is_file() else None
    if definition.generation:
        return LoadedVersion(name, int(folder.name), folder, manifest, definition, {},
                             batcher=_continuous_batcher(folder, manifest, definition, key, max_batch, generation))
    models: Dict[int, ModelRunner] = {}
    try:
        for model in definition.models:
            model.check_loadable()
            settings = {"context": model.context, "options": model.options, "config_file": model.config_file}
            recorded = ", ".join(f"{what}={value!r}" for what, value in settings.items() if value is not None)
            if recorded:
                LOG.warning("servable %s version %s: model %s: %s recorded, not applied (mindvl runs the graph "
                            "with MindSpore's CPU settings)", name, folder.name, model.key, recorded)
            model.runner = models[id(model)] = ModelRunner([])  # its graphs join it as they load (closed on failure)
            if manifest is not None:
                _add_package_graph(model.runner.graphs, folder, manifest, definition, model, key, max_batch)
            else:
                _add_mindir_graphs(model.runner.graphs, folder, definition, model, max_batch)
    except BaseException:
        for runner in models.values():
            for graph in runner.graphs:
                graph.close()
        raise
    return LoadedVersion(name, int(folder.name), folder, manifest, definition, models)


def _continuous_batcher(folder: Path, manifest: Optional[dict], definition: ServableDefinition, key: Optional[bytes],
                       max_streams: int, options: GenerationOptions) -> ContinuousBatcher:
    """A generative package's continuous batcher, every graph checked against its stored samples first."""
    if manifest is None or SECTION not in manifest:
        raise ServableError(f"{definition.config}: declare_generation() serves generative model packages; {folder} "
                            f"holds {'no manifest.json' if manifest is None else 'a package that does not generate'}")
    check_files(folder, manifest)
    check_config(definition, manifest, folder)
    batcher = ContinuousBatcher(folder, manifest, key, GRAPH_LOCK, max_streams, options)
    try:
        for graph in batcher.graphs:
            _check_samples(folder, manifest, graph, _SampleRunner(batcher.run, graph))
        batcher.warm_up()
    except BaseException:
        batcher.close()
        raise
    return batcher


@dataclass
class _SampleRunner:
    """`run(*inputs)` of one generation graph, as _check_samples calls it."""

    call: Any
    graph: str

    def run(self, *inputs: np.ndarray) -> Tuple[np.ndarray, ...]:
        return tuple(as_array(o) for o in self.call(self.graph, inputs))


def _add_package_graph(graphs: List[GraphRunner], folder: Path, manifest: dict, definition: ServableDefinition,
                       model: Model, key: Optional[bytes], max_batch: int) -> None:
    """The package graph a model declares, added to `graphs`, then checked against the samples stored at export."""
    if model is definition.models[0]:  # once per version: hashes and the config's fit to the package
        check_files(folder, manifest)
        check_config(definition, manifest, folder)
    graph = {entry["file"]: graph for graph, entry in manifest["graphs"].items()}[model.files[0]]
    entry = manifest["graphs"][graph]
    runner = GraphRunner(graph, load_graph(folder, manifest, graph, key), entry["inputs"], entry["outputs"])
    graphs.append(runner)
    runner.warm_up(_check_samples(folder, manifest, graph, runner), max_batch)


def _add_mindir_graphs(graphs: List[GraphRunner], folder: Path, definition: ServableDefinition, model: Model,
                       max_batch: int) -> None:
    """A MindSpore Serving model's files (subgraph i: file i), added to `graphs`: inputs and outputs read from
    each MindIR, the counts add_stage gives checked against them, each graph compiled on zeros of its shapes."""
    counts = [(method.name, len(stage.args), len(stage.outputs)) for method in definition.methods.values()
              for stage in method.stages if stage.target is model]
    for subgraph, file in enumerate(model.files):
        path = folder / file
        if not path.is_file():
            have = ", ".join(sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))) or "nothing"
            raise ServableError(f"{definition.config}: model file {file}: not in {folder} (it has: {have}); "
                                f"put the MindIR file into each version folder")
        try:
            inputs, outputs = (
                [{"name": n, "dtype": d, "shape": list(shape)} for n, d, shape in tensors]
                for tensors in mindir_io(path.read_bytes()))
        except (DecodeError, ValueError) as exc:
            raise ServableError(f"{path}: cannot read the graph's inputs and outputs ({exc}); is it a MindIR "
                                f"file exported by mindspore.export(..., file_format='MINDIR')? (an encrypted "
                                f"MindIR is served inside a mindvl model package)") from None
        for method, given_in, given_out in (counts if subgraph == 0 else []):
            for what, given, have in (("inputs", given_in, inputs), ("outputs", given_out, outputs)):
                if given != len(have):
                    raise ServableError(f"{definition.config}: method {method}: The {what} count {given} in "
                                        f"register_method not equal to the count {len(have)} defined in model, "
                                        f"model info: {model.key}, subgraph: {subgraph}")
        try:
            cell = ms.nn.GraphCell(ms.load(str(path)))
        except (RuntimeError, ValueError) as exc:
            raise ServableError(f"{path}: MindSpore could not load it: {str(exc).strip().splitlines()[0]}") from exc
        graph = GraphRunner(file, cell, inputs, outputs, model.with_batch_dim, model.without_batch_dim_inputs)
        graphs.append(graph)
        graph.warm_up(_zeros(graph), max_batch)


def _zeros(graph: GraphRunner) -> List[np.ndarray]:
    """Inputs of zeros for compiling: one batch (a batch of 1 when dynamic), dynamic non-batch sizes as 1."""
    return [np.zeros([1 if d == -1 else d for d in spec["shape"]], spec["dtype"]) for spec in graph.inputs]


def _check_samples(folder: Path, manifest: dict, graph: str, runner: GraphRunner) -> List[np.ndarray]:
    """Run the stored sample inputs and refuse the version unless the exported outputs come back; -> the inputs."""
    inputs, expected = load_samples(folder, manifest, graph)
    got = runner.run(*inputs.values())
    for (output, want), value in zip(expected.items(), got):
        if want.dtype.kind in "iub":
            same = np.array_equal(value, want)
        else:
            same = np.allclose(value, want, atol=TOLERANCE["atol"], rtol=TOLERANCE["rtol"])
        if value.shape != want.shape or not same:
            raise ServableError(f"{folder}: graph {graph} output {output} differs from the outputs stored at export "
                                f"(tolerance {TOLERANCE}); this runtime does not reproduce the package, refusing it")
    return list(inputs.values())
