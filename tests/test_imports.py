"""The import structure (README: Code map): import-linter's contracts in .importlinter, no cycles between any
two modules, and a deployment side that loads nothing of training."""
import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAINING_SIDE = ("mindvl.train", "mindvl.data", "mindvl.pretrained", "mindvl.model_factory", "mindvl.eval", "mindvl.export",
                 "mindvl.cells", "mindvl.runs", "mindvl.deploy", "mindvl.loading", "mindvl.generation")


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    """The package as it installs (setup.py maps cells/, export/, ... into mindvl/), as links: grimp reads
    packages from a folder tree, which the editable install's mapping does not give it."""
    setup = ast.parse((REPO / "setup.py").read_text())
    mapped = next(ast.literal_eval(node.value) for node in ast.walk(setup)
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "MAPPED")
    root = tmp_path_factory.mktemp("layout")
    package = root / "mindvl"
    package.mkdir()
    linked = {name.split(".", 1)[1] for name in mapped.values()}
    for child in (REPO / "mindvl").iterdir():
        if child.name != "__pycache__" and child.name not in linked:  # a checkout may link the mapped folders
            (package / child.name).symlink_to(child)
    for folder, name in mapped.items():
        (package / name.split(".", 1)[1]).symlink_to(REPO / folder)
    return root


def _run(layout: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(layout)}
    return subprocess.run(command, cwd=layout, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold(layout):
    lint = shutil.which("lint-imports", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert lint, "lint-imports is not installed: pip install -e '.[test]' brings import-linter"
    done = _run(layout, lint, str(REPO / ".importlinter"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "Contracts: 7 kept" in done.stdout


CYCLES = """
import json, sys
import grimp
graph = grimp.build_graph("mindvl", cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
index, low, stack, on, cycles = {}, {}, [], set(), []
def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop(); on.discard(w); component.append(w)
            if w == v:
                break
        if len(component) > 1:
            cycles.append(sorted(component))
sys.setrecursionlimit(10000)
for module in sorted(edges):
    if module not in index:
        visit(module)
print(json.dumps({"modules": len(edges), "cycles": cycles}))
"""


def test_no_two_modules_import_each_other_even_through_others(layout):
    """Stricter than the acyclic_siblings contract: cycles through a package's __init__ count too."""
    done = _run(layout, sys.executable, "-c", CYCLES)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["modules"] > 100 and result["cycles"] == []


def test_serving_and_lite_load_no_training_data_or_pretrained_code():
    """A fresh interpreter, the installed package: what a server or a device app imports."""
    code = ("import sys, json; import mindvl.serving.server, mindvl.lite.device, mindvl.lite.cascade; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('mindvl'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout)
    assert "mindvl.serving.server" in loaded and "mindvl.package_reader" in loaded
    assert [m for m in loaded if m.startswith(TRAINING_SIDE)] == []


def test_the_generation_engine_loads_no_framework():
    """What the server and the device run of generation: the loop, the prompts, a package's graphs; MindSpore
    comes only with the graphs a runtime gives it."""
    code = ("import sys, json; import mindvl.engine.decode_loop, mindvl.engine.package_graphs; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('mindvl', 'mindspore')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout)
    assert "mindvl.engine.decode_loop" in loaded and not [m for m in loaded if m.startswith(("mindspore", "mindvl.cells"))]


def test_every_user_error_derives_from_one_base_the_cli_catches():
    """Each error class whose message names the fix is a MindvlError, wherever it is raised."""
    from mindvl.errors import MindvlError

    named = {"mindvl.errors": ["ConfigError", "InputError", "CheckpointError", "PackageError", "DataRootError",
                               "ConversionError", "BuildError"],
             "mindvl.serving.register": ["ServableError"], "mindvl.serving.client": ["ServingError"],
             "mindvl.serving.protocol": ["ProtocolError"], "mindvl.lite.lite_model": ["LiteError"],
             "mindvl.lite.calibration": ["CalibrationError"], "mindvl.lite.lite2_runtime": ["Lite2Unavailable"],
             "mindvl.lite.cpp_runner": ["RunnerFailed"], "mindvl.data.build.speech": ["SpeechError"],
             "mindvl.pretrained.tokens": ["MissingTokens"]}
    import importlib

    for module, names in named.items():
        for name in names:
            assert issubclass(getattr(importlib.import_module(module), name), MindvlError), f"{module}.{name}"
