"""Data: building the data set (`build`), reading it (`loader`, `stream`), and the sources behind it.

`create_dataset` is imported lazily so that `import mindvl.data` stays cheap (no mindspore import).
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
