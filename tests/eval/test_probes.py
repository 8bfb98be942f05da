"""Ridge probes: closed-form fits that recover a linear rule, with the penalty chosen on held-out rows."""
import numpy as np

from mindvl.eval.probes import PENALTIES, accuracy, classification_probe, recall_at_1, retrieval_probe


def test_a_classification_probe_learns_a_linear_rule_and_not_an_interaction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 6))
    linear = (x @ rng.standard_normal((6, 3))).argmax(1)
    probe = classification_probe(x[:1500], linear[:1500], 3)
    assert accuracy(probe, x[1500:], linear[1500:]) > 0.9 and probe.penalty in PENALTIES
    xor = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(int)  # what an image x question interaction looks like
    probe = classification_probe(x[:1500], xor[:1500], 2)
    assert accuracy(probe, x[1500:], xor[1500:]) < 0.6


def test_a_retrieval_probe_maps_queries_into_the_candidates_space():
    rng = np.random.default_rng(1)
    candidates = rng.standard_normal((12, 5))
    targets = rng.integers(0, 12, 800)
    queries = candidates[targets] @ rng.standard_normal((5, 9)) + 0.05 * rng.standard_normal((800, 9))
    probe = retrieval_probe(queries[:600], targets[:600], candidates)
    assert recall_at_1(probe, queries[600:], targets[600:], candidates) > 0.95
