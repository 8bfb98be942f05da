"""Data parallelism: two real msrun ranks on CPU, each embedding half of a batch and gathering with
GatherWithGrad, get exactly the gradients one process computes over the whole batch."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import MSRUN_WORKER  # noqa: E402  (tests/conftest.py)

TOLERANCE = 1e-6  # float32; measured differences are ~6e-8 on AVX-512, ~9e-8 on AVX2 (partial sums vs one matmul)


def test_init_data_parallel_without_msrun_initialises_nothing(monkeypatch):
    from mindspore.communication import GlobalComm

    from mindvl.train.distributed import GatherWithGrad, init_data_parallel, launched_by_msrun

    monkeypatch.delenv("MS_ROLE", raising=False)
    assert not launched_by_msrun()
    assert init_data_parallel() == (0, 1)
    assert not GlobalComm.INITED
    with pytest.raises(ValueError, match="rank=2, world=2"):
        GatherWithGrad(2, 2)


@pytest.mark.slow
def test_two_msrun_ranks_with_gathered_embeddings_get_the_single_process_gradients(msrun_ranks, tmp_path):
    single = subprocess.run([sys.executable, str(MSRUN_WORKER), str(tmp_path)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "GLOG_v": "3"})
    assert single.returncode == 0, single.stderr[-3000:]

    reference = np.load(tmp_path / "rank_0_of_1.npz")
    ranks = [np.load(msrun_ranks / f"rank_{r}_of_2.npz") for r in (0, 1)]
    parameters = [name for name in reference.files if name not in ("loss", "gathered")]
    assert len(parameters) == 4
    for rank in ranks:
        # every rank holds the whole batch's embeddings, rank 0's rows first; each half is computed by its own
        # rank, whose matmul over fewer rows may sum in another order (AVX2 kernels: ~9e-8 apart), so the
        # rows agree within float32 rounding, not bit for bit
        assert rank["gathered"].shape == reference["gathered"].shape
        np.testing.assert_allclose(rank["gathered"], reference["gathered"], rtol=0, atol=TOLERANCE)
        for name in parameters:
            np.testing.assert_allclose(rank[name], reference[name], rtol=0, atol=TOLERANCE, err_msg=name)
            assert np.abs(reference[name]).max() > 1e-2  # a gradient that matters, not zeros matching zeros
    # the local term is a mean over each rank's rows: the ranks' losses average to the whole batch's
    np.testing.assert_allclose((ranks[0]["loss"] + ranks[1]["loss"]) / 2, reference["loss"], rtol=1e-6)
