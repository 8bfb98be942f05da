"""mindvl: native MindSpore multimodal training and deployment."""
import os

from mindvl.version import __version__  # noqa: F401  (mindvl.__version__)

# MindSpore's C++ log shows errors only, unless the user set GLOG_v: its warnings (the analyzer's "Some side effect
# nodes were eliminated by mistake", one per compiled generation graph) say nothing a user can act on and drown the
# progress bars. MindSpore reads it when it is imported, so this holds wherever mindvl is imported first.
os.environ.setdefault("GLOG_v", "3")


def from_pretrained(path, **options):
    """Open whatever `path` holds: a converted LLM or encoder, a trained run, a model package (mindvl.loading,
    the one door; it logs what it found). Options: cache_len, kernels, image_size, backend, threads, each for
    the kinds it applies to. Imported lazily: `import mindvl` stays light."""
    from mindvl.loading import from_pretrained as open_folder

    return open_folder(path, **options)


def __getattr__(name):
    """The training API (TrainingArguments, Trainer, create_model, train) and `describe` (what a folder holds)
    without importing MindSpore at `import mindvl`."""
    if name in ("TrainingArguments", "Trainer", "create_model", "train", "TrainResult"):
        import mindvl.train as training

        return getattr(training, name)
    if name == "describe":
        from mindvl.loading import describe

        return describe
    raise AttributeError(f"module 'mindvl' has no attribute {name!r}")
