"""mindvl: native MindSpore multimodal training and deployment."""
from mindvl.version import __version__  # noqa: F401  (mindvl.__version__)


def from_pretrained(path, image_size=None, cache_len=1024):
    """A converted folder or a trained run as a ready model: a pretrained LLM (`mindvl convert llm`) as a
    mindvl.generation.LanguageModel (`cache_len`: prompt + new tokens at most), a generative run (its folder
    or a step_* checkpoint) as a mindvl.generation.multimodal.MultimodalGenerator that answers questions about
    images, typed or spoken, a converted encoder (`mindvl convert minilm|dinov2|whisper-base`) as a cell with
    its weights (`image_size`: vision only; see mindvl.pretrained.from_pretrained). Imported lazily:
    `import mindvl` stays light."""
    from mindvl.generation.model import is_llm_folder
    from mindvl.runs import is_run_folder

    if is_llm_folder(path):
        from mindvl.generation import from_pretrained as load_llm

        return load_llm(path, cache_len=cache_len)
    if is_run_folder(path):
        from mindvl.generation.multimodal import from_run

        return from_run(path, cache_len=cache_len)
    from mindvl.pretrained import from_pretrained as load  # it reports what is wrong with the folder

    return load(path, image_size=image_size)


def __getattr__(name):
    """The training API (TrainingArguments, Trainer, create_model, train) without importing MindSpore
    at `import mindvl`."""
    if name in ("TrainingArguments", "Trainer", "create_model", "train", "TrainResult"):
        import mindvl.train as training

        return getattr(training, name)
    raise AttributeError(f"module 'mindvl' has no attribute {name!r}")
