"""Progress bars redraw in place on a terminal and stay short in a log."""
import io

from mindvl.progress import LOG_INTERVAL, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_in_a_log_updates_every_few_seconds_and_on_a_terminal_at_every_step():
    log, terminal = io.StringIO(), Terminal()
    for stream, options in ((log, {}), (terminal, {"mininterval": 0})):  # 0: tqdm's own rate limit off
        with progress_bar(total=2000, desc="train", file=stream, **options) as bar:
            for _ in range(2000):
                bar.update(1)
    assert LOG_INTERVAL >= 5
    assert log.getvalue().count("\r") <= 3  # the first draw and the last: 2000 steps took far less than 10 s
    assert "2000/2000" in log.getvalue()
    assert terminal.getvalue().count("\r") > 100
