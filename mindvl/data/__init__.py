"""Data: building the data set offline (`build/`), reading it online (`reading/`), and the on-disk format
between them (records.py: the MindRecord tables; root.py: a data root; conversation_samples.py: the
generative model's conversations).

The names below are imported lazily so that `import mindvl.data` stays cheap (no mindspore import).
"""

__all__ = ["create_dataset", "build_dataset", "load_meta", "load_tokenizer", "COLUMNS"]


def __getattr__(name):
    if name in ("create_dataset", "COLUMNS"):
        from mindvl.data.reading import loader

        return getattr(loader, name)
    if name in ("load_meta", "load_tokenizer"):
        from mindvl.data import root

        return getattr(root, name)
    if name == "build_dataset":
        from mindvl.data.build.builder import build_dataset

        return build_dataset
    raise AttributeError(f"module 'mindvl.data' has no attribute {name!r}")
