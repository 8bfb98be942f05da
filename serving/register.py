"""MindSpore Serving 2.0's registration API (`mindspore_serving.server.register`), as mindvl runs it.

A servable_config.py written for MindSpore Serving runs unchanged under mindvl: `load_servable_config`
executes it with `mindspore_serving.server.register` pointing at this module. As in MindSpore Serving, a
method's body runs once, at registration, with placeholder arguments: each `add_stage` records a stage
and returns placeholders for its outputs, and the placeholders the body returns become the method's
outputs. Each load records into a fresh registry, so nothing leaks from one servable to the next.

The names MindSpore Serving deprecated in 1.5 but still runs (`declare_servable`, `call_preprocess`,
`call_servable`, `call_postprocess` and their `_pipeline` forms) run here too, as add_stage calls; like
MindSpore Serving, they read each stage's outputs_count from the method's source (the number of names its
result is assigned to). Device settings (`Context`, `CPUDeviceInfo`, ...) are accepted and not applied.
"""
import ast
import importlib
import importlib.util
import inspect
import sys
import textwrap
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from mindvl.errors import MindvlError
from mindvl.serving.device_options import (AclOptions, AscendDeviceInfo, Context, CPUDeviceInfo,  # noqa: F401 (API)
                                           GPUDeviceInfo, GpuOptions)

FORMATS = ("MindIR", "MindIR_Lite", "OM")  # what MindSpore Serving accepts
LOADABLE_FORMATS = ("MindIR",)  # what mindvl's runtime (MindSpore) loads
SHIM_MODULES = ("mindspore_serving", "mindspore_serving.server", "mindspore_serving.server.register")
# MindSpore 2 merged the c_transforms / py_transforms modules that MindSpore Serving's examples import into
# mindspore.dataset.vision and mindspore.dataset.transforms (same class names): while a file that names them
# loads, the old names point at the new modules.
DATASET_ALIASES = {"mindspore.dataset.vision.c_transforms": "mindspore.dataset.vision",
                   "mindspore.dataset.vision.py_transforms": "mindspore.dataset.vision",
                   "mindspore.dataset.transforms.c_transforms": "mindspore.dataset.transforms",
                   "mindspore.dataset.transforms.py_transforms": "mindspore.dataset.transforms"}


class ServableError(MindvlError, RuntimeError):
    """A servable that cannot be registered, found or deployed; the message names the file or folder."""


class MissingServable(ServableError):
    """A servable or a version the servable directory does not hold (HTTP 404 where a route answers it)."""


@dataclass(frozen=True)
class Placeholder:
    """A value known only when the method runs: input `index` (stage 0) or output `index` of stage `stage`."""

    method: str
    stage: int  # 0: the method's inputs; 1..N: its stages in the order add_stage recorded them
    index: int

    def __bool__(self):
        raise TypeError("a placeholder has no value at registration: a method body holds only add_stage calls "
                        "and a return of their placeholders (no branches or loops)")


@dataclass(eq=False)
class Model:
    """A model declared by `declare_model`; `files` are relative to the version folder, file i being
    subgraph i (add_stage runs subgraph 0; a Python stage may `call(..., subgraph=i)`).

    `call` needs a runner, which the server binds when it has loaded the model:
    runner([(x1, x2, ...), ...], subgraph) -> [(y1, ...), ...], one output tuple per instance.
    """

    files: Tuple[str, ...]
    model_format: str
    with_batch_dim: bool
    options: Any
    without_batch_dim_inputs: Tuple[int, ...]
    context: Any
    config_file: Optional[str]
    config: Path  # the servable_config.py that declared it
    runner: Optional[Callable] = None

    @property
    def name(self) -> str:
        return ", ".join(self.files)

    @property
    def key(self) -> str:
        """MindSpore Serving's name of the model (in stage tags and messages): its files joined by ';'."""
        return ";".join(self.files)

    def check_loadable(self) -> None:
        """Raise ServableError unless mindvl can load this model (the server checks before loading)."""
        if self.model_format not in LOADABLE_FORMATS:
            raise ServableError(f"{self.config}: model {self.name}: format {self.model_format} is recorded, but "
                                f"mindvl serves only {', '.join(LOADABLE_FORMATS)}; export the model as MindIR or "
                                f"serve this servable with MindSpore Serving")

    def call(self, *args, subgraph: int = 0):
        """Run the model from a Python stage, as MindSpore Serving's Model.call does: call(x1, x2) runs one
        instance and returns its outputs (the output itself when there is one); call([[x1, x2], ...]) runs
        several and returns one output tuple per instance. A bad instance raises RuntimeError."""
        if self.runner is None:
            raise ServableError(f"{self.config}: model {self.name}: call() runs only while a server serves the "
                                f"servable (at registration there is nothing to run)")
        failed = f"Model({self.key}{f' ,subgraph={subgraph}' if subgraph else ''}).call() failed"
        forms = "the inputs can be call(x1, x2) for single instance or call([[x1, x2], [x1, x2]]) for multi instances."
        if not args:
            raise RuntimeError(f"{failed}: no inputs provided, {forms}")
        several = len(args) == 1 and isinstance(args[0], (tuple, list))
        if several and not all(isinstance(instance, (tuple, list)) for instance in args[0]):
            raise RuntimeError(f"{failed}: inputs format invalid, {forms}")
        outputs = self.runner([tuple(i) for i in args[0]] if several else [tuple(args)], subgraph)
        if several:
            return tuple(outputs)
        return outputs[0][0] if len(outputs[0]) == 1 else outputs[0]


@dataclass
class Stage:
    """One step of a method: a Python function or a declared model applied to earlier placeholders.

    batch_size None: a Python function receives one instance's values; N: an iterable of up to N
    instances (0: all of the batch), yielding one result per instance (MindSpore Serving's convention).
    `label` names the stage in failures as MindSpore Serving does: the tag, else "Function '<servable>.<f>'"
    or "Model '<files>'"."""

    target: Union[Callable, Model]
    args: Tuple[Placeholder, ...]
    outputs: Tuple[Placeholder, ...]
    batch_size: Optional[int]
    tag: Optional[str]
    label: str = ""

    @property
    def is_model(self) -> bool:
        return isinstance(self.target, Model)

    @property
    def name(self) -> str:
        return self.tag or (self.target.name if self.is_model else getattr(self.target, "__name__", repr(self.target)))


@dataclass
class Method:
    """A registered method: request instances carry `inputs`; replies carry `output_names`, output i being
    the value of placeholder `returns[i]`."""

    name: str
    inputs: Tuple[str, ...]  # the decorated function's parameter names
    output_names: Tuple[str, ...]
    stages: List[Stage] = field(default_factory=list)
    returns: Tuple[Placeholder, ...] = ()


@dataclass
class ServableDefinition:
    """What one servable_config.py declared: its models in declaration order and its methods by name."""

    config: Path
    models: List[Model]
    methods: Dict[str, Method]
    generation: bool = False  # declare_generation: method `generate` runs the package's generation engine


class _Registry:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.models: List[Model] = []
        self.methods: Dict[str, Method] = {}
        self.building: Optional[Method] = None  # the method whose body is running
        self.legacy_counts: Dict[str, int] = {}  # outputs_count of the building method's call_* stages
        self.legacy_used: Set[str] = set()  # the call_* interfaces its body has called
        self.generation = False


_LOCK = threading.RLock()  # one load at a time: the registry and the sys.modules entries are process-wide
_active: Optional[_Registry] = None


def _registry(api: str) -> _Registry:
    if _active is None:
        raise ServableError(f"register.{api}: called outside a servable_config.py being loaded; load the file "
                            f"with mindvl.serving.register.load_servable_config")
    return _active


def _model_files(model_file, where: str) -> Tuple[str, ...]:
    files = (model_file,) if isinstance(model_file, str) else model_file
    if not isinstance(files, (list, tuple)) or not files:
        raise ServableError(f"{where}: model_file: expected a file name or a list of them, got {model_file!r}")
    for name in files:
        if not isinstance(name, str) or not name or PurePosixPath(name).is_absolute() \
                or ".." in PurePosixPath(name).parts or "\\" in name:
            raise ServableError(f"{where}: model_file {name!r}: expected a file name relative to the version folder")
    return tuple(files)


GENERATE = "generate"
GENERATION_INPUTS = ("text", "image", "audio", "images", "video", "history", "max_tokens", "temperature", "top_p",
                     "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed",
                     "ignore_eos", "top_logprobs", "grammar")
GENERATION_OUTPUTS = ("text", "tokens", "finish_reason", "prompt_tokens", "completion_tokens", "mean_logprob",
                      "dropped_turns")


def declare_generation():
    """mindvl's own declaration (MindSpore Serving has no generation loop): the servable's versions are generative
    model packages, and method `generate` (an image, the question typed as `text` or spoken as `audio`, the
    generation settings -> the answer) runs their generation engine (serving/continuous_batching.py)."""
    registry = _registry("declare_generation")
    if registry.generation or registry.models or registry.methods:
        raise ServableError(f"{registry.config}: declare_generation() declares the whole servable; call it once, "
                            f"with no declare_model or register_method beside it")
    registry.generation = True
    registry.methods[GENERATE] = Method(GENERATE, GENERATION_INPUTS, GENERATION_OUTPUTS)


def _not_generative(registry: "_Registry", api: str) -> None:
    if registry.generation:
        raise ServableError(f"{registry.config}: {api} after declare_generation(); a generative servable has only "
                            f"its generate method")


def declare_model(model_file, model_format, with_batch_dim=True, options=None, without_batch_dim_inputs=None,
                  context=None, config_file=None) -> Model:
    """Declare a model of this servable: `model_file` (a name or a list) relative to the version folder."""
    registry = _registry("declare_model")
    _not_generative(registry, "declare_model")
    where = f"{registry.config}: declare_model"
    if registry.building is not None:
        raise ServableError(f"{where}: called inside method {registry.building.name}; declare models at module level")
    files = _model_files(model_file, where)
    formats = {f.lower(): f for f in FORMATS}
    if not isinstance(model_format, str) or model_format.lower() not in formats:
        raise ServableError(f"{where}({files[0]!r}): model_format {model_format!r}: expected one of {', '.join(FORMATS)}")
    if not isinstance(with_batch_dim, bool):
        raise ServableError(f"{where}({files[0]!r}): with_batch_dim: expected True or False, got {with_batch_dim!r}")
    if context is not None and not isinstance(context, Context):
        raise ServableError(f"{where}({files[0]!r}): Parameter 'context' should be Context, but gotten {type(context)}")
    if options is not None and not isinstance(options, (GpuOptions, AclOptions)):
        raise ServableError(f"{where}({files[0]!r}): Parameter 'options' should be None, GpuOptions or AclOptions, "
                            f"but gotten {type(options)}")
    shared = () if without_batch_dim_inputs is None else without_batch_dim_inputs
    shared = (shared,) if isinstance(shared, int) else tuple(shared)
    if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in shared):
        raise ServableError(f"{where}({files[0]!r}): without_batch_dim_inputs: expected input indices (ints >= 0), "
                            f"got {without_batch_dim_inputs!r}")
    declared = {name for model in registry.models for name in model.files}
    twice = [name for name in files if name in declared]
    if twice:
        raise ServableError(f"{where}: model file {twice[0]} is declared twice; declare each file once and use "
                            f"the returned model in every stage that needs it")
    model = Model(files, formats[model_format.lower()], with_batch_dim, options, shared, context, config_file,
                  registry.config)
    registry.models.append(model)
    return model


def declare_servable(servable_file, model_format, with_batch_dim=True, options=None, without_batch_dim_inputs=None):
    """MindSpore Serving's name for declare_model before 1.5 (deprecated there, still served)."""
    return declare_model(servable_file, model_format, with_batch_dim, options, without_batch_dim_inputs)


def register_method(output_names):
    """Decorator: register the function as a method named after it, its parameters being the inputs."""
    registry = _registry("register_method")
    _not_generative(registry, "register_method")
    names = (output_names,) if isinstance(output_names, str) else output_names
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names) \
            or len(set(names)) != len(names):
        raise ServableError(f"{registry.config}: register_method: output_names: expected distinct non-empty "
                            f"names, got {output_names!r}")

    def register(function: Callable) -> Callable:
        name = function.__name__
        where = f"{registry.config}: method {name}"
        if name in registry.methods:
            raise ServableError(f"{where}: registered twice; give each method its own function name")
        parameters = inspect.signature(function).parameters.values()
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        odd = [p.name for p in parameters if p.kind not in plain or p.default is not inspect.Parameter.empty]
        if odd or not parameters:
            raise ServableError(f"{where}: its inputs are its parameters, each plain (no default, *args or "
                                f"**kwargs); {'check ' + ', '.join(odd) if odd else 'it has none'}")
        method = Method(name, tuple(p.name for p in parameters), tuple(names))
        registry.building = method
        registry.legacy_counts, registry.legacy_used = _legacy_counts(function), set()
        try:
            returned = function(*(Placeholder(name, 0, i) for i in range(len(method.inputs))))
        except ServableError:
            raise
        except Exception as exc:  # the body is user code: name where it failed, keep its own message
            raise ServableError(f"{where}: {type(exc).__name__}: {exc} (at registration a body only calls add_stage "
                                f"and returns placeholders; does each outputs_count match the names its result "
                                f"is unpacked into?)") from exc
        finally:
            registry.building = None
        method.returns = _returned(returned, method, where)
        registry.methods[name] = method
        return function

    return register


def _returned(value, method: Method, where: str) -> Tuple[Placeholder, ...]:
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if len(values) != len(method.output_names):
        raise ServableError(f"{where}: returns {len(values)} value(s) for {len(method.output_names)} output_names "
                            f"{list(method.output_names)}")
    for output, placeholder in zip(method.output_names, values):
        if not isinstance(placeholder, Placeholder) or placeholder.method != method.name:
            raise ServableError(f"{where}: output {output!r} is {placeholder!r}, not an input or a stage output of "
                                f"the method; return what add_stage returned")
    return values


def add_stage(fn_or_model, *args, outputs_count, batch_size=None, tag=None):
    """Record a stage of the method being registered; -> its output placeholder (a tuple when several)."""
    registry = _registry("add_stage")
    method = registry.building
    if method is None:
        raise ServableError(f"{registry.config}: add_stage: called outside a @register_method body")
    where = f"{registry.config}: method {method.name}: stage {len(method.stages) + 1}"
    if isinstance(fn_or_model, Model):
        if not any(fn_or_model is model for model in registry.models):
            raise ServableError(f"{where}: model {fn_or_model.name} was not declared with declare_model in this "
                                f"servable_config.py")
    elif isinstance(fn_or_model, str):
        raise ServableError(f"{where}: stage {fn_or_model!r} names a C++ stage function of MindSpore Serving, which "
                            f"mindvl does not have; pass a Python function that does the same")
    elif not callable(fn_or_model):
        raise ServableError(f"{where}: expected a Python function or a model from declare_model, got "
                            f"{fn_or_model!r}")
    if not isinstance(outputs_count, int) or isinstance(outputs_count, bool) or outputs_count < 1:
        raise ServableError(f"{where}: outputs_count: expected an int >= 1, got {outputs_count!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 0):
        raise ServableError(f"{where}: batch_size: expected None or an int >= 0 (0: the whole batch), got "
                            f"{batch_size!r}")
    if tag is not None and not isinstance(tag, str):
        raise ServableError(f"{where}: tag: expected a string, got {tag!r}")
    for position, arg in enumerate(args, 1):
        if not isinstance(arg, Placeholder) or arg.method != method.name:
            raise ServableError(f"{where}: argument {position} is {arg!r}, not an input or an earlier stage output "
                                f"of the method")
    number = len(method.stages) + 1
    outputs = tuple(Placeholder(method.name, number, i) for i in range(outputs_count))
    if tag:
        label = tag
    elif isinstance(fn_or_model, Model):
        label = f"Model '{fn_or_model.key}'"
    else:
        label = f"Function '{registry.config.parent.name}.{getattr(fn_or_model, '__name__', type(fn_or_model).__name__)}'"
    method.stages.append(Stage(fn_or_model, tuple(args), outputs, batch_size, tag, label))
    return outputs[0] if outputs_count == 1 else outputs


# ---- the interfaces MindSpore Serving deprecated in 1.5: call_* -> add_stage ---------------------------------

LEGACY_CALLS = {"call_preprocess": ("Preprocess", None), "call_preprocess_pipeline": ("Preprocess", 0),
                "call_servable": (None, None),
                "call_postprocess": ("Postprocess", None), "call_postprocess_pipeline": ("Postprocess", 0)}


def _legacy_counts(function: Callable) -> Dict[str, int]:
    """outputs_count of each call_* in a method body, read as MindSpore Serving reads it: the number of names
    its result is assigned to (`x1, x2 = register.call_preprocess(f, x1, x2)` -> 2)."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError):  # no source to read: call_* then names the problem
        return {}
    counts = {}
    for statement in body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
            func = statement.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in LEGACY_CALLS:
                target = statement.targets[0]
                counts[name] = len(target.elts) if isinstance(target, ast.Tuple) else 1
    return counts


def _legacy_stage(call: str, stage, args: tuple):
    registry = _registry(call)
    method = registry.building
    if method is None:
        raise ServableError(f"{registry.config}: {call}: called outside a @register_method body")
    where = f"{registry.config}: method {method.name}"
    if call in registry.legacy_used:
        raise ServableError(f"{where}: Check failed in method '{method.name}', {call} should not be invoked more "
                            f"than once")
    if call not in registry.legacy_counts:
        raise ServableError(f"{where}: Failed to parse method '{method.name}', complex statements such as conditions "
                            f"and loops are not supported in register_method when the interface '{call}' is used, "
                            f"use 'add_stage' to replace '{call}'")
    registry.legacy_used.add(call)
    tag, batch_size = LEGACY_CALLS[call]
    return add_stage(stage, *args, outputs_count=registry.legacy_counts[call], batch_size=batch_size, tag=tag)


def call_preprocess(preprocess_fun, *args):
    return _legacy_stage("call_preprocess", preprocess_fun, args)


def call_preprocess_pipeline(preprocess_fun, *args):
    return _legacy_stage("call_preprocess_pipeline", preprocess_fun, args)


def call_postprocess(postprocess_fun, *args):
    return _legacy_stage("call_postprocess", postprocess_fun, args)


def call_postprocess_pipeline(postprocess_fun, *args):
    return _legacy_stage("call_postprocess_pipeline", postprocess_fun, args)


def call_servable(*args):
    """The one declared model as a stage (MindSpore Serving refuses call_servable when there are several)."""
    registry = _registry("call_servable")
    if len(registry.models) != 1:
        raise ServableError(f"{registry.config}: call_servable: there are {len(registry.models)} models declared; "
                            f"call_servable needs exactly one (use add_stage to name the model)")
    return _legacy_stage("call_servable", registry.models[0], args)


def _shim_modules(source: str) -> Dict[str, types.ModuleType]:
    """`mindspore_serving`, `.server` and `.server.register`, the last being this module; and the old dataset
    transform modules when `source` (the file's text) names one whose name MindSpore 2 dropped."""
    this = sys.modules[__name__]
    package = types.ModuleType("mindspore_serving", "mindvl's stand-in while a servable_config.py executes")
    server = types.ModuleType("mindspore_serving.server")
    package.server, server.register = server, this
    modules = dict(zip(SHIM_MODULES, (package, server, this)))
    for old, new in DATASET_ALIASES.items():
        if old.rsplit(".", 1)[1] in source and importlib.util.find_spec(old) is None:
            modules[old] = importlib.import_module(new)
    return modules


def load_servable_config(path: Union[str, Path]) -> ServableDefinition:
    """Execute the servable_config.py at `path` against a fresh registry; -> what it declared.

    While the file executes, `mindspore_serving.server.register` is this module, also where the real
    mindspore_serving is installed (else the file would register with it, where mindvl cannot read it);
    the previous sys.modules entries are restored afterwards.
    """
    global _active
    path = Path(path)
    if not path.is_file():
        raise ServableError(f"{path}: no such file; a servable folder holds servable_config.py next to its "
                            f"version folders")
    with _LOCK:
        registry = _Registry(path)
        shims = _shim_modules(path.read_text(errors="replace"))
        saved = {name: sys.modules[name] for name in shims if name in sys.modules}
        sys.modules.update(shims)
        _active = registry
        try:
            _execute(path)
        finally:
            _active = None
            for name in shims:
                if name in saved:
                    sys.modules[name] = saved[name]
                else:
                    sys.modules.pop(name, None)
    if not registry.methods:
        raise ServableError(f"{path}: registers no method; decorate a function with "
                            f"@register.register_method(output_names=[...])")
    return ServableDefinition(path, registry.models, registry.methods, registry.generation)


def _execute(path: Path) -> None:
    spec = importlib.util.spec_from_file_location("mindvl_servable_config", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ServableError:
        raise
    except Exception as exc:  # the file is user code: SyntaxError, ImportError, ...
        raise ServableError(f"{path}: {type(exc).__name__}: {exc}") from exc

