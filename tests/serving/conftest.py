"""A real model package with all four graphs (from the session's trained_run), deployed once per session,
and a live server on free ports over a copy of it."""
import shutil

import pytest

from mindvl.export.package import write_package
from mindvl.export.source import load_source
from mindvl.serving.servable import deploy
from mindvl.serving.server import BackgroundServer

from live import config


@pytest.fixture(scope="session")
def vqa_package(trained_run, tmp_path_factory):
    """(config, package folder) of the small trained model: vqa, image_embed, text_embed, audio_embed."""
    _, result = trained_run
    cfg, model, record = load_source(result.output_dir)
    return cfg, write_package(cfg, model, tmp_path_factory.mktemp("serving_pkg") / "vqa", record, progress=False)


@pytest.fixture(scope="session")
def deployed(vqa_package, tmp_path_factory):
    """A servable directory holding servable `vqa` version 1 (tests that change it copy it first)."""
    servables = tmp_path_factory.mktemp("servables")
    deploy(vqa_package[1], servables, "vqa")
    return servables


@pytest.fixture
def fresh_servables(deployed, tmp_path):
    """A writable copy of `deployed` for a test that adds, breaks or removes versions."""
    target = tmp_path / "servables"
    shutil.copytree(deployed, target)
    return target


@pytest.fixture(scope="module")
def live_server(deployed):
    """A server over `deployed` with dynamic batching (max batch 8), shared by a test module."""
    with BackgroundServer(config(deployed, max_batch_size=8)) as server:
        yield server
