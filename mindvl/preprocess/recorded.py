"""The preprocessing settings as a manifest or meta.json records them, and back."""
import dataclasses
import json

from mindvl.config import PreprocessConfig


def preprocess_dict(pre: PreprocessConfig) -> dict:
    """The PreprocessConfig as a plain dict (what meta.json and the model manifest record)."""
    return json.loads(json.dumps(dataclasses.asdict(pre)))


def preprocess_config(recorded: dict) -> PreprocessConfig:
    """The PreprocessConfig a manifest recorded (its other keys, the tokenizer's, left out)."""
    return PreprocessConfig(**{f.name: recorded[f.name] for f in dataclasses.fields(PreprocessConfig)})
