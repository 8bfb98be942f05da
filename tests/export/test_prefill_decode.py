"""A generative run's model package: attachments, a prefill graph per prompt bucket and one decode graph over
ONE weights file, loaded back as MindIR (GraphCell, no model code) and generating the framework's tokens."""

import pytest

from mindvl.errors import PackageError
from mindvl.package_reader import read_manifest


def test_the_package_holds_the_generation_graphs_over_one_weights_file(generative_package):
    _, package = generative_package
    manifest = read_manifest(package)
    spec = manifest["generation"]
    assert list(manifest["graphs"]) == ["attachments", *(f"prefill_{b}" for b in spec["buckets"]), "decode",
                                        "decode_wide",  # the step of 8 rows or more: its new rows out
                                        "extend_8"]  # the several-token step: prefix caching, speculation
    assert spec["wide_rows"] == 8
    outputs = manifest["graphs"]["decode_wide"]["outputs"]
    assert [o["shape"] for o in outputs[1:]] == [[-1, 1, spec["kv_width"]]] * (2 * spec["layers"])
    assert spec["buckets"] == [32, 48] and spec["cache_len"] == 112  # the fixture's --prompt-bucket / --cache-len
    assert spec["extend_steps"] == 8 and manifest["graphs"]["extend_8"]["inputs"][0]["shape"] == [-1, 8]
    weights = manifest["weights"]
    # every graph's parameters point into weights.bin: the graph files hold no weights of their own, and the
    # decoder, in every prefill graph and in decode, is stored once
    graph_files = sum(manifest["files"][e["file"]]["bytes"] for e in manifest["graphs"].values())
    assert weights["shared_bytes"] == graph_files + weights["weights_bytes"]
    assert weights["shared_bytes"] < 0.6 * weights["graph_bytes"]  # the decoder in 4 graphs, stored once
    assert weights["weights_bytes"] < 1.1 * 4 * manifest["parameters"] + 64 * 200  # one float32 copy (+ alignment)
    assert (package / "tokenizer.json").is_file()
    assert spec["stop_ids"] and spec["chat_template"] == "word"


def test_export_verify_regenerates_the_stored_questions_with_the_frameworks_tokens(generative_package):
    from mindvl.deploy.verify import verify_package

    _, package = generative_package
    report = verify_package(package)
    assert report.ok, report.summary()
    tokens = [c for c in report.checks if c.graph == "generate"]
    samples = read_manifest(package)["generation_samples"]["prompts"]
    assert len(tokens) == len(samples) == 4 and all(c.max_abs_diff == 0 for c in tokens)
    assert any(s["audio"] for s in samples) and any(s["question"] for s in samples)
    assert all(s["image"] for s in samples) and all(s["tokens"] for s in samples)
    for graph in ("decode", "decode_wide", "extend_8"):
        checks = [c for c in report.checks if c.graph == graph]
        assert checks and all(c.ok for c in checks)


def test_a_tampered_weights_file_is_refused_by_name(generative_package, writable_copy, tmp_path):
    from mindvl.deploy.verify import verify_package

    _, package = generative_package
    copy = writable_copy(package, tmp_path)
    data = bytearray((copy / "weights.bin").read_bytes())
    data[100] ^= 0xFF
    (copy / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(PackageError, match="weights.bin: sha256 differs"):
        verify_package(copy)


def test_options_a_generative_package_does_not_have_yet_are_refused(generative_run, tmp_path):
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(generative_run[1].output_dir)
    with pytest.raises(PackageError, match="--static-batch: not available for a generative model's package"):
        package_and_check(cfg, model, record, tmp_path / "p", PackageOptions(static_batches=(2,)), log=print)
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_an_int4_decoder_package_verifies_and_takes_its_row_in_the_comparison_table(generative_run, generative_package,
                                                                                  tmp_path):
    """`mindvl export quantize --weights int4` of a generative run: INT4 weight-only projections everywhere (the
    decoder's and its token table included, widened by standard operators in the MindIR), verified like any
    package; evaluation generates the test questions through its graphs."""
    from mindvl.deploy.evaluate_package import comparison_table, evaluate_package
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.cells.quantize import quantize_model
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(generative_run[1].output_dir)
    report = quantize_model(model, "int4")
    assert report["layers"] > 0
    # the session package's prompt buckets and cache: the default (every bucket the decoder's 256 positions
    # allow) would export, verify and evaluate a prefill graph per bucket for nothing this test checks
    options = PackageOptions(progress=False, evaluate=True, eval_limit=2, prompt_buckets=(32, 48), cache_len=112)
    result = package_and_check(cfg, model, record, tmp_path / "int4", options, {"method": "int4-weight-only", **report},
                               log=lambda *_: None)
    assert result["verify"]["ok"]
    row = result["evaluation"]
    assert row["kind"] == "generative" and row["questions"] == 4 and row["decode_ms_b1"] > 0
    assert 0 <= row["vqa_text"] <= 1 and 0 <= row["vqa_audio"] <= 1
    evaluate_package(generative_package[1], progress=False, limit=2)
    table = comparison_table([generative_package[1], tmp_path / "int4"])
    assert "| int4 | int4-weight-only |" in table and "decode ms/token b1" in table
    int4_bytes = read_manifest(tmp_path / "int4")["weights"]["weights_bytes"]
    assert int4_bytes < 0.45 * read_manifest(generative_package[1])["weights"]["weights_bytes"]
