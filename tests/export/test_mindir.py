"""The MindIR round trip: export the answer graph, load it back with no Python model, same answers."""
import numpy as np
import pytest

from mindvl.data import create_dataset
from mindvl.eval import load_trained
from mindvl.export.mindir import ANSWER_INPUTS, export_answer_graph, load_graph, verify_answer_graph


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    _, result = trained_run
    cfg, model = load_trained(result.output_dir)
    path = export_answer_graph(model, cfg.preprocess, tmp_path_factory.mktemp("export") / "answer.mindir")
    return cfg, model, path


def test_loaded_graph_answers_as_the_framework_does(exported):
    cfg, model, path = exported
    assert path.stat().st_size > 0
    batch = next(create_dataset(cfg, "test", question_modality="both").create_dict_iterator(
        num_epochs=1, output_numpy=True))
    check = verify_answer_graph(model, load_graph(path), batch)
    assert check["count"] == cfg.data.batch_size
    assert check["answers_equal"]
    assert check["max_abs_diff"] < 1e-5


def test_exported_graph_takes_any_batch_size(exported):
    cfg, model, path = exported
    graph = load_graph(path)
    batch = next(create_dataset(cfg, "test", question_modality="audio").create_dict_iterator(
        num_epochs=1, output_numpy=True))
    for size in (1, 3):
        small = {name: batch[name][:size] for name in ANSWER_INPUTS}
        check = verify_answer_graph(model, graph, small)
        assert check["count"] == size and check["answers_equal"]
        assert check["max_abs_diff"] < 1e-5
