"""The errors a user acts on, with one base: `MindvlError`.

Every error whose message names the thing at fault and the fix derives from MindvlError, wherever it is
raised (a recipe key, a request field, a checkpoint, a model package, a servable, a device runtime), so a
caller catches them all with one class: the CLI prints such an error's message and exits with status 2,
and lets anything else (a bug) raise with its traceback. Each also keeps the built-in class it always had
(ValueError, RuntimeError, FileNotFoundError), so code that caught those still does.

A leaf: it imports nothing of mindvl, so every layer (cells, serving and lite included) may raise these.
The errors of one layer only (a servable, the Lite runtime, the serving client) live in that layer and
derive from MindvlError there.
"""
import re


class MindvlError(Exception):
    """An error whose message tells the user what is wrong and what to do about it."""


class ConfigError(MindvlError, ValueError):
    """A configuration value or a setting a user must fix; the message names the dotted key."""


class InputError(MindvlError, ValueError):
    """An input that cannot be used (an image, a clip, a question, a request field); the message names it."""


class CheckpointError(MindvlError, RuntimeError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


class PackageError(MindvlError, RuntimeError):
    """A model package that is missing, incomplete, changed or of another format; the message names it."""


class DataRootError(MindvlError, FileNotFoundError):
    """A data root that is missing or incomplete; the message says which build makes it."""


class ConversionError(MindvlError, ValueError):
    """A pretrained file or converted folder that cannot be used; the message names the tensor or file."""


class BuildError(MindvlError, RuntimeError):
    """Compiled code mindvl needs (the fused kernels, the Lite 2.0 bridge) could not be built here."""


def shown(value, limit: int = 60) -> str:
    """`value` as an error message quotes it: its repr, cut to `limit` characters (a request's 100 KB string
    is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]* object at 0x[0-9a-fA-F]+>")


def plain(message: str) -> str:
    """`message` without the default reprs of objects (`<_io.BytesIO object at 0x7fd3...>`, as libraries
    word a stream they could not read), which tell a client nothing and leak heap addresses."""
    return _OBJECT_REPR.sub("the data", message)
