"""mindvl: native MindSpore multimodal training and deployment."""
from mindvl.version import __version__  # noqa: F401  (mindvl.__version__)


def from_pretrained(path, image_size=None):
    """A converted pretrained encoder (a folder written by `mindvl convert`) as a ready cell with its
    weights; see mindvl.pretrained.from_pretrained. Imported lazily: `import mindvl` stays light."""
    from mindvl.pretrained import from_pretrained as load

    return load(path, image_size=image_size)


def __getattr__(name):
    """The training API (TrainingArguments, Trainer, create_model, train) without importing MindSpore
    at `import mindvl`."""
    if name in ("TrainingArguments", "Trainer", "create_model", "train", "TrainResult"):
        import mindvl.train as training

        return getattr(training, name)
    raise AttributeError(f"module 'mindvl' has no attribute {name!r}")
