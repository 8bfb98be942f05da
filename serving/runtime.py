"""A servable version loaded for serving: its graphs as GraphCells, its methods run over batches of instances.

A method runs the stages servable_config.py recorded. Python stages run once per instance in the worker
pool, and stages that do not depend on each other run at the same time (the image, question and speech
preprocessing of a predict); a model stage stacks its instances into one batch for its graph, which runs
on its own thread, one batch at a time. One instance's failure (a corrupt JPEG) fails that instance only.

Loading checks every file's sha256, then runs each graph on the package's stored samples: a version whose
graphs do not reproduce the exported outputs is refused, and the graphs are compiled before the first
request arrives.
"""
import asyncio
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from mindvl.model_package import TOLERANCE, as_tuple, check_files, load_graph, load_samples, read_manifest
from mindvl.serving.protocol import InstanceError, ProtocolError
from mindvl.serving.register import Method, Placeholder, ServableDefinition, ServableError, Stage, load_servable_config
from mindvl.serving.servable import CONFIG_FILE, check_config, resolve

# A graph with a dynamic batch dimension compiles once per batch size it meets (~0.2 s each for the tiny
# recipe): batches are padded up to one of these sizes, and loading compiles them all before requests come.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_GRAPH_BATCH = BATCH_BUCKETS[-1]  # larger batches run in chunks of this many rows (bounded memory)
# MindSpore deadlocks when two GraphCells execute at once from two threads (both stuck in _exec_pip): graphs
# run one at a time in the process, each still on its own runner thread; the Python stages stay parallel.
GRAPH_LOCK = threading.Lock()


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


class GraphRunner:
    """One declared model's graph, run on stacked inputs on its own thread (MindSpore runs one graph call at
    a time per cell); also the `runner` of its Model, so Python stages may `model.call(...)` it."""

    def __init__(self, name: str, cell, entry: dict) -> None:
        self.name = name
        self.cell = cell
        self.inputs = entry["inputs"]  # [{name, dtype, shape}], shape[0] the batch (-1: any)
        self.outputs = entry["outputs"]
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"graph-{name}")

    def check_instance(self, values: Sequence[Any]) -> List[np.ndarray]:
        """One instance's inputs as arrays of the graph's dtypes; InstanceError names the input at fault."""
        if len(values) != len(self.inputs):
            raise InstanceError(f"graph {self.name}: given {len(values)} inputs, expected {len(self.inputs)}")
        arrays = []
        for value, spec in zip(values, self.inputs):
            array = np.asarray(value)
            want_shape = tuple(spec["shape"][1:])
            if array.dtype != np.dtype(spec["dtype"]) or len(array.shape) != len(want_shape) or any(
                    want not in (-1, got) for want, got in zip(want_shape, array.shape)):
                raise InstanceError(f"graph {self.name}: input {spec['name']}: given {array.dtype} of shape "
                                    f"{list(array.shape)}, expected {spec['dtype']} of shape {list(want_shape)} "
                                    f"(-1: any size)")
            arrays.append(array)
        return arrays

    def run(self, *batch: np.ndarray, subgraph: int = 0) -> Tuple[np.ndarray, ...]:
        """The graph on batched inputs, padded to a batch bucket (blocking; call it on the graph's thread)."""
        if subgraph != 0:
            raise ServableError(f"graph {self.name}: has one graph, not subgraph {subgraph}")
        rows = len(batch[0])
        if rows > MAX_GRAPH_BATCH:
            return tuple(np.concatenate(parts) for parts in zip(*(
                self.run(*(array[start:start + MAX_GRAPH_BATCH] for array in batch))
                for start in range(0, rows, MAX_GRAPH_BATCH))))
        padding = bucket(rows) - rows  # repeats of row 0: real inputs, so no NaN from an empty mask
        batch = [np.concatenate([array, np.repeat(array[:1], padding, axis=0)]) if padding else array
                 for array in batch]
        with GRAPH_LOCK:
            outputs = as_tuple(self.cell(*(ms.Tensor(array) for array in batch)))
            return tuple(output.asnumpy()[:rows] for output in outputs)

    def __call__(self, *batch: np.ndarray, subgraph: int = 0) -> Tuple[np.ndarray, ...]:
        return self.thread.submit(self.run, *batch, subgraph=subgraph).result()

    async def run_instances(self, instances: List[List[np.ndarray]]) -> List[Tuple[np.ndarray, ...]]:
        """Outputs per instance for checked instances, stacked into one batch."""
        stacked = [np.stack(column) for column in zip(*instances)]
        outputs = await asyncio.get_running_loop().run_in_executor(self.thread, self.run, *stacked)
        return [tuple(output[row] for output in outputs) for row in range(len(instances))]

    def warm_up(self, sample: Sequence[np.ndarray], max_batch: int) -> None:
        """Compile every batch bucket up to `max_batch` now, not on the first request that needs it."""
        for size in BATCH_BUCKETS:
            self(*(np.repeat(array[:1], size, axis=0) for array in sample))
            if size >= max_batch:
                break

    def close(self) -> None:
        self.thread.shutdown(wait=True)


@dataclass
class LoadedVersion:
    """Version `version` of servable `name`, ready to run its methods."""

    name: str
    version: int
    folder: Path
    manifest: dict
    definition: ServableDefinition
    runners: Dict[int, GraphRunner]  # id(Model) -> its runner
    levels: Dict[str, List[List[Stage]]] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.levels = {name: _levels(method) for name, method in self.definition.methods.items()}

    @property
    def methods(self) -> Dict[str, Method]:
        return self.definition.methods

    def method(self, name: str) -> Method:
        if name not in self.methods:
            raise MethodNotFound(f"servable {self.name} version {self.version}: method {name} is not available; "
                                 f"it has {', '.join(sorted(self.methods))}")
        return self.methods[name]

    async def run(self, method_name: str, instances: List[Dict[str, Any]], pool: Executor) -> List[Any]:
        """One result per instance: {output name: value} or the InstanceError that failed it."""
        method = self.method(method_name)
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
            values.append({} if failure else {Placeholder(method.name, 0, i): instance[name]
                                              for i, name in enumerate(method.inputs)})
        for group in self.levels[method.name]:
            await asyncio.gather(*(self._run_stage(stage, values, failures, pool) for stage in group))
        return [failure or {name: values[i][placeholder] for name, placeholder in zip(method.output_names,
                                                                                      method.returns)}
                for i, failure in enumerate(failures)]

    async def _run_stage(self, stage: Stage, values: List[Dict[Placeholder, Any]],
                         failures: List[Optional[BaseException]], pool: Executor) -> None:
        live = [i for i, failure in enumerate(failures) if failure is None]
        if not live:
            return
        arguments = [[values[i][arg] for arg in stage.args] for i in live]
        if stage.is_model:
            outputs = await self._run_model(stage, arguments, live, failures)
        elif stage.batch_size is None:
            loop = asyncio.get_running_loop()
            outputs = await asyncio.gather(*(loop.run_in_executor(pool, _call, stage, args) for args in arguments),
                                           return_exceptions=True)
        else:
            outputs = await asyncio.get_running_loop().run_in_executor(pool, _call_batched, stage, arguments)
        for i, output in zip(live, outputs):
            if isinstance(output, BaseException):
                failures[i] = output if isinstance(output, InstanceError) else \
                    InstanceError(f"stage {stage.name}: {type(output).__name__}: {output}")
            else:
                values[i].update(zip(stage.outputs, output))

    async def _run_model(self, stage: Stage, arguments: List[List[Any]], live: List[int],
                         failures: List[Optional[BaseException]]) -> List[Any]:
        runner = self.runners[id(stage.target)]
        outputs: List[Any] = [None] * len(arguments)
        checked = []
        for position, args in enumerate(arguments):
            try:
                checked.append((position, runner.check_instance(args)))
            except InstanceError as error:
                outputs[position] = error
        if checked:
            results = await runner.run_instances([arrays for _, arrays in checked])
            for (position, _), result in zip(checked, results):
                outputs[position] = result
        return outputs

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()


def _as_outputs(stage: Stage, result: Any) -> Tuple[Any, ...]:
    count = len(stage.outputs)
    outputs = (result,) if count == 1 else tuple(result) if isinstance(result, (tuple, list)) else None
    if outputs is None or len(outputs) != count:
        raise InstanceError(f"stage {stage.name}: returned {type(result).__name__} "
                            f"{'of ' + str(len(result)) + ' values ' if isinstance(result, (tuple, list)) else ''}"
                            f"where outputs_count={count}")
    return outputs


def _call(stage: Stage, args: List[Any]) -> Tuple[Any, ...]:
    return _as_outputs(stage, stage.target(*args))


def _call_batched(stage: Stage, arguments: List[List[Any]]) -> List[Any]:
    """A stage with batch_size N: called with up to N instances' argument tuples, yielding one result each."""
    results: List[Any] = []
    for start in range(0, len(arguments), stage.batch_size):
        chunk = [tuple(args) for args in arguments[start:start + stage.batch_size]]
        try:
            produced = list(stage.target(chunk))
            if len(produced) != len(chunk):
                raise InstanceError(f"stage {stage.name}: yielded {len(produced)} results for {len(chunk)} instances")
            results += [_as_outputs(stage, result) for result in produced]
        except Exception as error:  # user code: the chunk's instances fail, the others go on
            results += [error] * len(chunk)
    return results


def load_version(servable_dir: Path, name: str, version: int, key: Optional[bytes] = None,
                 max_batch: int = 1) -> LoadedVersion:
    """Load version `version` (0: the newest on disk) of servable `name`: hashes, config, graphs, the sample
    check, and every batch bucket up to `max_batch` compiled."""
    folder = resolve(servable_dir, name, version or None)
    manifest = read_manifest(folder)
    check_files(folder, manifest)
    definition = load_servable_config(folder.parent / CONFIG_FILE)
    check_config(definition, manifest, folder)
    graph_names = {entry["file"]: graph for graph, entry in manifest["graphs"].items()}
    runners: Dict[int, GraphRunner] = {}
    try:
        for model in definition.models:
            graph = graph_names[model.files[0]]
            runner = GraphRunner(graph, load_graph(folder, manifest, graph, key), manifest["graphs"][graph])
            runners[id(model)] = runner
            runner.warm_up(_check_samples(folder, manifest, graph, runner), max_batch)
            model.runner = runner
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    return LoadedVersion(name, int(folder.name), folder, manifest, definition, runners)


def _check_samples(folder: Path, manifest: dict, graph: str, runner: GraphRunner) -> List[np.ndarray]:
    """Run the stored sample inputs and refuse the version unless the exported outputs come back; -> the inputs."""
    inputs, expected = load_samples(folder, manifest, graph)
    got = runner(*inputs.values())
    for (output, want), value in zip(expected.items(), got):
        if want.dtype.kind in "iub":
            same = np.array_equal(value, want)
        else:
            same = np.allclose(value, want, atol=TOLERANCE["atol"], rtol=TOLERANCE["rtol"])
        if value.shape != want.shape or not same:
            raise ServableError(f"{folder}: graph {graph} output {output} differs from the outputs stored at export "
                                f"(tolerance {TOLERANCE}); this runtime does not reproduce the package, refusing it")
    return list(inputs.values())
