"""Progress bars for long work, the same on a terminal and in a log.

On a terminal a bar redraws in place; in a file or a pipe (a quickstart's log, CI) every redraw is another
line of text, so there a bar updates at most every LOG_INTERVAL seconds (one quickstart log held 98 KB of
bars before). `progress_bar` takes tqdm's arguments; `disable=True` shows nothing.
"""
import sys

from tqdm import tqdm

LOG_INTERVAL = 10.0  # seconds between updates when the output is not a terminal


def _interactive(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def progress_bar(iterable=None, **options) -> tqdm:
    """tqdm over `iterable` (or a manual bar with total=...), written to stderr, its updates spaced for a log
    when stderr is not a terminal."""
    stream = options.setdefault("file", sys.stderr)
    if not _interactive(stream):
        options.setdefault("mininterval", LOG_INTERVAL)
        options.setdefault("maxinterval", LOG_INTERVAL * 6)
    return tqdm(iterable, **options)



def log_line(text: str) -> None:
    """A line printed above the running bars, so no bar is torn (tqdm.write)."""
    tqdm.write(text)
