"""`mindvl plot RUN`'s figure (mindvl/plots/training.py) from the session's trained runs: a panel per kind of
record the trainer wrote, a line per objective and per module, the values the records hold."""
from saved import assert_png_and_svg


def _lines(figure):
    return {axes.get_title(): {line.get_label(): line for line in axes.get_lines()} for axes in figure.axes}


def test_the_run_figure_draws_each_objective_module_and_validation_metric_the_run_logged(trained_run, tmp_path):
    from mindvl.plots.training import plot_training, read_metrics

    _, result = trained_run
    records = read_metrics(result.output_dir)
    train = [r for r in records if "split" not in r]
    figure, paths = plot_training(result.output_dir, tmp_path)
    assert_png_and_svg(paths)
    lines = _lines(figure)
    assert list(lines) == ["loss", "learning rate", "gradient norm", "samples/s", "validation"]
    assert list(lines["loss"]) == list(result.final_losses)  # the total, then each objective of the recipe
    assert list(lines["gradient norm"]) == list(train[0]["grad_norm"])
    assert figure.axes[2].get_yscale() == "log"
    assert list(lines["validation"]) == [k for k in result.validation[0] if k not in ("step", "split")]
    # the points are the records'
    assert list(lines["loss"]["contrastive"].get_xdata()) == [r["step"] for r in train]
    assert list(lines["loss"]["contrastive"].get_ydata()) == [r["contrastive"] for r in train]
    assert list(lines["validation"]["vqa_text"].get_ydata()) == [v["vqa_text"] for v in result.validation]


def test_the_generative_run_figure_has_its_own_objectives_and_leaves_out_panels_without_data(generative_run):
    from mindvl.plots.training import read_metrics, training_figure

    _, result = generative_run
    records = read_metrics(result.output_dir)
    lines = _lines(training_figure(records))
    assert list(lines["loss"]) == list(result.final_losses) and "contrastive" not in lines["loss"]
    assert set(lines["validation"]) >= {"vqa_text", "vqa_audio"}
    without_evaluation = _lines(training_figure([r for r in records if "split" not in r]))
    assert list(without_evaluation) == ["loss", "learning rate", "gradient norm", "samples/s"]
