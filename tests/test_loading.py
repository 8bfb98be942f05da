"""mindvl.from_pretrained, the one door: it says what a folder holds and opens it as the object that uses it;
the library's other loaders and the command line go through it; an option for another kind is refused."""
import logging

import pytest

import mindvl
from mindvl import loading
from mindvl.errors import ConfigError


def test_each_kind_of_folder_is_found_and_opened(tiny_llms, converted, trained_run, generative_run, package,
                                                 caplog):
    from mindvl.cells import MultimodalModel
    from mindvl.cells.text import TextEncoder
    from mindvl.generation import LanguageModel, MultimodalGenerator
    from mindvl.lite.device import DevicePipeline

    expected = [(tiny_llms["llama"], loading.LLM, LanguageModel, {"cache_len": 32}),
                (converted("minilm"), loading.ENCODER, TextEncoder, {}),
                (trained_run[1].output_dir, loading.CLASSIFIER_RUN, MultimodalModel, {}),
                (generative_run[1].output_dir, loading.GENERATIVE_RUN, MultimodalGenerator, {"cache_len": 64}),
                (package, loading.PACKAGE, DevicePipeline, {"backend": "graphcell"})]
    for folder, kind, cls, options in expected:
        assert mindvl.describe(folder).kind == kind
        with caplog.at_level(logging.INFO, logger="mindvl"):
            opened = mindvl.from_pretrained(folder, **options)
        assert isinstance(opened, cls), (folder, type(opened))
        assert f"{folder}: {kind}" in caplog.text  # it says what it found
        if isinstance(opened, DevicePipeline):
            opened.close()


def test_an_option_of_another_kind_and_an_unknown_folder_are_refused(tiny_llms, converted, tmp_path):
    with pytest.raises(ConfigError, match=r"image_size: not an option of a converted LLM \(takes cache_len, kernels, weights\)"):
        mindvl.from_pretrained(tiny_llms["llama"], image_size=224)
    with pytest.raises(ConfigError, match="cache_len: not an option of a converted encoder"):
        mindvl.from_pretrained(converted("minilm"), cache_len=64)
    with pytest.raises(ConfigError, match="not a folder mindvl opens; expected a converted LLM, VLM or encoder"):
        mindvl.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no such file or folder"):
        mindvl.from_pretrained(tmp_path / "absent")


def test_the_public_loaders_go_through_the_one_door(tiny_llms, monkeypatch, capsys):
    """The door's old aliases are gone, and the command line opens what it generates with through the door."""
    import mindvl.generation
    import mindvl.model_factory
    import mindvl.pretrained
    from mindvl.cli import main
    from mindvl.generation import multimodal_generator

    assert not hasattr(mindvl.generation, "from_pretrained") and not hasattr(mindvl.pretrained, "from_pretrained")
    assert not hasattr(multimodal_generator, "from_run")
    assert not hasattr(mindvl.model_factory, "build_model") and not hasattr(mindvl.model_factory,
                                                                            "create_generative_model")
    opened = []
    door = loading.from_pretrained
    monkeypatch.setattr(loading, "from_pretrained", lambda path, **options: opened.append(path) or door(path, **options))
    assert main(["generate", "--model", str(tiny_llms["llama"]), "the cat", "--max-new-tokens", "2",
                 "--cache-len", "32"]) == 0
    assert opened == [str(tiny_llms["llama"])]
    mindvl.from_pretrained(tiny_llms["llama"], cache_len=32)
    assert opened[-1] == tiny_llms["llama"]
