"""train.kernels "auto": every swappable operation is timed fused against standard at the shapes it runs
at, forward + backward, and the faster one is kept.

Why per operation and per shape: whether a kernel wins depends on the CPU and the shape. On a 2-vCPU AVX2
EPYC the fused Linear bias add was slower than MindSpore's Add while GELU won 2.6x (issue 22), and an
operation over 30 rows can lose what it wins over 2,000. A fixed "fused" can make a step slower than the
standard operators; "auto" never keeps a kernel that timed slower.

How: `record_shapes` runs the caller's probe (one forward pass of the model on a real batch) in PyNative
mode with a recorder in place of every swappable operation, which notes the shapes each one is called
with. Operations of one signature (kind, settings, input shapes) are timed once: a graph-mode cell of the
operation alone, value and gradients, fused and standard, each compiled and warmed up (`WARMUP` calls),
then `REPEATS` calls of each in turns, the medians compared. Decisions are cached in `choices.json` next
to the compiled kernels, keyed by the build (its file name hashes the sources, the flags and this CPU's
model and flags), the kernel threads and the signature: a new build, CPU, thread count or shape is timed
again, anything else is read back. tests/cells/test_kernels_auto.py slows a kernel (or the standard
operator) on purpose to show the faster one is kept.
"""
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn, ops

from mindvl.files import atomic_write

from .machine import kernel_threads

CHOICES_FILE = "choices.json"
VERSION = 1
WARMUP, REPEATS = 2, 5  # calls after the compiling one, then timed calls (the median counts)
SETTINGS = ("eps", "scale", "heads", "head_dim")  # what besides the shapes tells two operations apart
logger = logging.getLogger("mindvl.kernels")

Shapes = Tuple[Optional[Tuple[int, ...]], ...]  # one call's input shapes, None for an input not given


@dataclass
class Choice:
    """The decision for one signature: "fused" or "standard", with the medians it was made on."""
    signature: str
    choice: str
    fused_ms: float
    standard_ms: float
    timed: str  # when (UTC, ISO 8601)


class _Recorder(nn.Cell):
    """Stands in for one operation during the probe (PyNative: construct runs as Python) and notes the
    shapes of every call."""

    def __init__(self, operation):
        super().__init__()
        self.operation = operation
        self.calls: List[Shapes] = []

    def construct(self, *inputs):
        self.calls.append(tuple(None if x is None else tuple(x.shape) for x in inputs))
        return self.operation(*inputs)


def record_shapes(swaps: Sequence[tuple], probe: Callable[[], object]) -> List[List[Shapes]]:
    """For each (parent, attribute, fused) of `swaps`, the distinct input shapes its operation was called
    with while `probe()` ran (in PyNative mode, the context's mode restored after); [] for one not reached."""
    import mindspore as ms

    recorders = []
    for parent, attribute, _ in swaps:
        recorders.append(_Recorder(getattr(parent, attribute)))
        setattr(parent, attribute, recorders[-1])
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        probe()
    finally:
        ms.set_context(mode=mode)
        for (parent, attribute, _), recorder in zip(swaps, recorders):
            setattr(parent, attribute, recorder.operation)
    return [list(dict.fromkeys(recorder.calls)) for recorder in recorders]


def signature(fused: nn.Cell, calls: Sequence[Shapes]) -> str:
    """kind[settings] and the input shapes of every call, e.g. FusedLayerNorm[eps=1e-06] (2048,256)(256,)(256,)."""
    settings = ",".join(f"{name}={getattr(fused, name):g}" for name in SETTINGS
                        if isinstance(getattr(fused, name, None), (int, float)))
    shapes = " | ".join("".join("-" if shape is None else f"({','.join(map(str, shape))})" for shape in call)
                        for call in calls)
    return f"{type(fused).__name__}[{settings}] {shapes}"


class _Sum(nn.Cell):
    """The operation's first output, summed."""

    def __init__(self, operation):
        super().__init__()
        self.operation = operation

    def construct(self, *inputs):
        out = self.operation(*inputs)
        if isinstance(out, tuple):
            out = out[0]
        return out.sum()


class _ForwardBackward(nn.Cell):
    """The summed output and its gradients w.r.t. every input: what a train step asks of the operation."""

    def __init__(self, operation, inputs: int):
        super().__init__()
        self.grad_fn = ops.value_and_grad(_Sum(operation), tuple(range(inputs)))

    def construct(self, *inputs):
        return self.grad_fn(*inputs)


def _timed_calls(operation, calls: Sequence[Shapes]) -> Callable[[], float]:
    """A function running forward + backward over all of `calls` once (trailing absent inputs dropped) ->
    its seconds."""
    rng = np.random.default_rng(0)
    nets = []
    for call in calls:
        shapes = list(call)
        while shapes and shapes[-1] is None:
            shapes.pop()
        tensors = [Tensor(rng.standard_normal(shape).astype(np.float32)) for shape in shapes]
        nets.append((_ForwardBackward(operation, len(tensors)), tensors))

    def run() -> float:
        start = time.perf_counter()
        for net, tensors in nets:
            net(*tensors)[0].asnumpy()
        return time.perf_counter() - start

    return run


def time_signature(fused: nn.Cell, calls: Sequence[Shapes]) -> Tuple[float, float]:
    """(fused ms, standard ms): medians of forward + backward at `calls`, the two timed in turns (a machine
    that speeds up or slows down while they run shifts both alike)."""
    runs = (_timed_calls(fused, calls), _timed_calls(fused.standard(), calls))
    for run in runs:  # compile, then warm up
        for _ in range(1 + WARMUP):
            run()
    times: Tuple[List[float], List[float]] = ([], [])
    for _ in range(REPEATS):
        for run, timed in zip(runs, times):
            timed.append(run())
    fused_s, standard_s = (statistics.median(timed) for timed in times)
    return fused_s * 1e3, standard_s * 1e3


def build_key(library: Path) -> str:
    return f"{library.name} threads={kernel_threads()}"


def read_choices(folder: Path) -> Dict:
    """The cache: {"version", "builds": {build key: {signature: Choice as a dict}}}; an unreadable or older
    file counts as empty (it is recomputed, never trusted half-read)."""
    try:
        cached = json.loads((folder / CHOICES_FILE).read_text())
    except (OSError, ValueError):
        return {"version": VERSION, "builds": {}}
    if not isinstance(cached, dict) or cached.get("version") != VERSION or not isinstance(cached.get("builds"), dict):
        return {"version": VERSION, "builds": {}}
    return cached


def choose(swaps: Sequence[tuple], probe: Callable[[], object], library: Path, folder: Path,
           log: Optional[Callable[[str], None]] = None,
           agree: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> List[tuple]:
    """The swaps of `swaps` whose fused operation timed faster than the standard one at its shapes
    (measured, or read from `folder`/choices.json), after one log line that says what was chosen.

    `agree`: under data parallelism, the per-operation (fused ms, standard ms) summed over the ranks. Every
    rank must compile the same graph (its collectives line up by position), while each times its own first
    batch on a busy machine; deciding on the sums gives every rank the same choices. A fused cell marked
    `untimed` (inference only: no backward to time, and a standard form that is always the slower) is kept
    without timing."""
    log = log or logger.info
    kept = [swap for swap in swaps if getattr(swap[2], "untimed", False)]
    swaps = [swap for swap in swaps if not getattr(swap[2], "untimed", False)]
    calls = record_shapes(swaps, probe)
    signatures = [signature(fused, shapes) if shapes else None for (_, _, fused), shapes in zip(swaps, calls)]
    cache = read_choices(folder)
    known = cache["builds"].setdefault(build_key(library), {})
    start, measured = time.perf_counter(), 0
    for (_, _, fused), shapes, name in zip(swaps, calls, signatures):
        if name is None or name in known:
            continue
        fused_ms, standard_ms = time_signature(fused, shapes)
        known[name] = asdict(Choice(name, "fused" if fused_ms < standard_ms else "standard", round(fused_ms, 3),
                                    round(standard_ms, 3), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
        measured += 1
    if measured:
        atomic_write(folder / CHOICES_FILE, lambda tmp: tmp.write_text(json.dumps(cache, indent=1)), durable=False)
    # (fused ms, standard ms) per operation; (0, 0) for one the probe did not reach, which stays standard
    times = np.array([(known[name]["fused_ms"], known[name]["standard_ms"]) if name else (0.0, 0.0)
                      for name in signatures], np.float64).reshape(-1, 2)
    if agree is not None:
        times = np.asarray(agree(times), np.float64)
    faster = (times[:, 1] > 0) & (times[:, 0] < times[:, 1])
    log(summary(swaps, times, faster, measured, time.perf_counter() - start, folder / CHOICES_FILE))
    return [swap for swap, fused in zip(swaps, faster) if fused] + kept


def summary(swaps, times: np.ndarray, faster: np.ndarray, measured: int, seconds: float, path: Path) -> str:
    """One line: how many operations run fused, of which kinds, and where the decisions come from."""
    kinds: Dict[str, List[int]] = {}
    for (_, _, fused), (_, standard_ms), chosen in zip(swaps, times, faster):
        if standard_ms > 0:
            counts = kinds.setdefault(type(fused).__name__.removeprefix("Fused"), [0, 0])
            counts[int(chosen)] += 1
    parts = ", ".join(f"{kind} {counts[1]}/{sum(counts)}" for kind, counts in kinds.items())
    source = (f"{measured} signature(s) timed in {seconds:.1f} s" if measured else "all decisions cached")
    return (f"train.kernels auto: {int(faster.sum())} of {sum(map(sum, kinds.values()))} operations fused "
            f"({parts}); {source}; {path} (mindvl kernels shows them)")


def table(folder: Path, builds: Sequence[str]) -> List[str]:
    """Markdown rows of the cached decisions of `builds` (every build in the cache when empty)."""
    cached = read_choices(folder)["builds"]
    lines = []
    for key in builds or sorted(cached):
        choices = cached.get(key, {})
        lines += ["", f"build {key}: {len(choices)} decision(s)" if choices else f"build {key}: nothing timed yet "
                  "(the next training run with train.kernels=auto times its operations)"]
        if choices:
            lines += ["", "| choice | fused ms | standard ms | operation and input shapes | timed |", "|---|---|---|---|---|"]
            lines += [f"| {c['choice']} | {c['fused_ms']:.3f} | {c['standard_ms']:.3f} | {c['signature']} | {c['timed']} |"
                      for c in choices.values()]
    return lines


def forget(folder: Path) -> bool:
    """Remove the cached decisions (they are timed again at the next use) -> whether there were any."""
    path = folder / CHOICES_FILE
    existed = path.is_file()
    path.unlink(missing_ok=True)
    return existed
