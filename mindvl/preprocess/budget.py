"""The memory that decoding images and audio may hold at once in a process, bounded: a server's request
preparation (`mindvl serve --decode-slots`), unbounded elsewhere (the training loader's threads).

A decode waits until its bytes fit and holds them until its large buffers are freed, so the bound is on
memory, and a small image or a short clip never queues behind large ones (a count of decodes made the legit
clients' 64x64 images wait behind 4096x4096 ones). One slot is what the largest image takes: 4096 x 4096 pixels
at 8 bytes (Pillow's decoded image and its RGB copy), 128 MB; every image and clip admitted fits in one.
"""
from __future__ import annotations

import contextlib
import threading
from typing import ContextManager, Iterator, Optional

SLOT_BYTES = 4096 * 4096 * 8  # one largest image (image.MAX_IMAGE_PIXELS at image.BYTES_PER_PIXEL)


class DecodeBudget:
    """Bytes being decoded at once, bounded: `hold(n)` waits until n bytes are free."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self.condition = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        size = min(size, self.capacity)  # what one decode may hold is bounded by its checks, never more than all
        with self.condition:
            self.condition.wait_for(lambda: self.free >= size)
            self.free -= size
        try:
            yield
        finally:
            with self.condition:
                self.free += size
                self.condition.notify_all()


_budget: Optional[DecodeBudget] = None  # limit_decodes() bounds the bytes decoding in flight


def limit_decodes(slots: int) -> None:
    """The images and clips decoding at once in this process hold at most `slots` x SLOT_BYTES, from now on
    (`slots` images of the largest size, or many small ones, or clips)."""
    global _budget
    if slots < 1:
        raise ValueError(f"decode slots: expected an integer >= 1, got {slots}")
    _budget = DecodeBudget(slots * SLOT_BYTES)


def decoding(size: int) -> ContextManager:
    """Hold `size` bytes in the decode budget while a decode runs (nothing when unbounded)."""
    return contextlib.nullcontext() if _budget is None else _budget.hold(size)
