"""One weights file for several MindIR graphs: parameters stored once by name (MindIR external data), the graphs
loaded back by mindspore.load with their outputs unchanged, MindSpore's own >1 GB split form taken in too."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindvl.export.graphs import TensorSpec, export_graph
from mindvl.export.shared_weights import share_weights
from mindvl.errors import PackageError


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.first = nn.Dense(16, 32)
        self.second = nn.Dense(32, 8)

    def construct(self, x):
        return self.second(self.first(x))


def test_graphs_share_one_weights_file_and_compute_what_they_computed(tmp_path, monkeypatch):
    import mindspore.train.serialization as serialization

    ms.set_context(mode=ms.GRAPH_MODE)
    net = Net()
    x = Tensor(np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32))
    expected = net(x).asnumpy()
    export_graph(net, "a", [TensorSpec("x", "float32", (-1, 16))], tmp_path / "a.mindir")
    monkeypatch.setattr(serialization, "TOTAL_SAVE", 0)  # MindSpore's >1 GB form: a_graph.mindir + b_variables/
    export_graph(net, "b", [TensorSpec("x", "float32", (2, 16))], tmp_path / "b.mindir")
    assert (tmp_path / "b_variables").is_dir()
    sizes = share_weights(tmp_path, ["a.mindir", "b.mindir"])
    assert not (tmp_path / "b_variables").exists()
    weights = 4 * (16 * 32 + 32 + 32 * 8 + 8)
    assert weights < sizes["weights_bytes"] < weights + 64 * 5  # each parameter once, 64-byte aligned
    assert sizes["shared_bytes"] < sizes["graph_bytes"]
    np.testing.assert_array_equal(nn.GraphCell(ms.load(str(tmp_path / "a.mindir")))(x).asnumpy(), expected)
    # against the network at batch 2 itself: on an AVX2 host oneDNN's kernels for 2 and 3 rows round differently
    np.testing.assert_array_equal(nn.GraphCell(ms.load(str(tmp_path / "b.mindir")))(x[:2]).asnumpy(),
                                  net(x[:2]).asnumpy())


def test_graphs_of_different_weights_under_one_name_are_refused(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    for name in ("a", "b"):
        export_graph(Net(), name, [TensorSpec("x", "float32", (-1, 16))], tmp_path / f"{name}.mindir")
    with pytest.raises(PackageError, match="b.mindir: parameter first.weight differs"):
        share_weights(tmp_path, ["a.mindir", "b.mindir"])
