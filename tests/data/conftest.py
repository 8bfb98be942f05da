"""A small real data set (8 easy-VQA images per split, 2 training voices, 1 test voice), built once."""
import os

import pytest

os.environ.setdefault("GLOG_v", "3")

from mindvl.config import load_config  # noqa: E402

TRAIN_VOICES = ["en-us", "en-gb-scotland+m3"]
TEST_VOICES = ["en-us+f4"]


def small_config(root, **extra):
    overrides = [f"data.root={root}", f"data.train_voices=[{', '.join(TRAIN_VOICES)}]",
                 f"data.test_voices=[{', '.join(TEST_VOICES)}]", "data.speech_rates=[175]", "data.limit=8",
                 "data.batch_size=8", "data.num_workers=1"]
    overrides += [f"{k.replace('__', '.')}={v}" for k, v in extra.items()]
    return load_config("tiny", overrides)


@pytest.fixture(scope="session")
def make_config():
    """make_config(root, data__limit=3, ...) -> the small config with `a__b=value` overrides."""
    return small_config


@pytest.fixture(scope="session")
def small_cfg(tmp_path_factory):
    return small_config(tmp_path_factory.mktemp("data") / "root")


@pytest.fixture(scope="session")
def small_report(small_cfg):
    from mindvl.data.build import build_dataset

    return build_dataset(small_cfg, progress=False)
