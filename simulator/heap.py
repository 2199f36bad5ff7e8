"""Heaps: what the memory walk's events cost, as a policy apart from the walk.

The walk (`simulator.memory`) decides which buffers are live at each step and calls a heap's
`alloc` and `free` (and `move`, for a variable the step writes to another buffer); the heap owns
the accounting and the peak, after XLA's HeapSimulator and its heap algorithms. Two policies:

- `LiveBytes`: the sum of live buffers, each rounded to the allocator's granularity. The walk
  runs with it and records its running total in the trace, so plots read live bytes off it.
- `simulator.replay.BFCHeap`: TensorFlow's best-fit-with-coalescing allocator, whose peak
  counts whole chunks and so is at least the live peak. It replays the trace's events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from simulator.trace import EventKind, Row

__all__ = ["GRANULARITY", "Heap", "LiveBytes", "round_up", "round_up_all"]

#: TensorFlow's BFC allocator rounds every allocation up to a multiple of 256 bytes
#: (kMinAllocationSize in tensorflow/core/common_runtime/bfc_allocator.h).
GRANULARITY = 256

_ALLOC = int(EventKind.ALLOC)
_FREE = int(EventKind.FREE)


def round_up(nbytes: int, granularity: int = GRANULARITY) -> int:
    """`nbytes` rounded up to a multiple of `granularity`; nothing for nothing."""
    return -(-nbytes // granularity) * granularity if nbytes > 0 else 0


def round_up_all(nbytes: np.ndarray, granularity: int = GRANULARITY) -> np.ndarray:
    """`round_up` of each of an array of byte counts."""
    return np.maximum(-(-nbytes // granularity) * granularity, 0)


class Heap(Protocol):
    """What a memory walk's events cost. Tensors are the walk's buffer ids."""

    @property
    def peak(self) -> int:
        """The most bytes the heap has held at once."""
        ...

    def alloc(self, step: int, tensor: int, nbytes: int, kind: int = _ALLOC) -> None:
        """Place buffer `tensor` of `nbytes` at schedule step `step` (`kind`: an ALLOC or a
        SWAP_IN event)."""
        ...

    def free(self, step: int, tensor: int, nbytes: int) -> None:
        """Release buffer `tensor` at schedule step `step`."""
        ...

    def move(self, variable: int, buffer: int, *, pending: bool) -> None:
        """Variable `variable` (held `variable`-th) now lives in buffer `buffer`, or in a new
        buffer of its size when `buffer` is -1. Its old buffer is released now or, when a read
        of it is `pending`, by `release_moved`."""
        ...

    def release_moved(self, variable: int) -> None:
        """Release the old buffers of `variable` that pending reads held."""
        ...


class LiveBytes:
    """The live-bytes policy: the sum of live buffers, each event recorded with the running
    totals of device and host bytes (`record`, a trace's row append)."""

    def __init__(self, resident_bytes: int, record: Callable[[Row], None]) -> None:
        self.live = self.peak = resident_bytes
        self.peak_step = 0
        self.host = self.host_peak = 0
        self.record = record

    def alloc(self, step: int, tensor: int, nbytes: int, kind: int = _ALLOC) -> None:
        self.live += nbytes
        self.record((kind, step, tensor, nbytes, self.live, self.host))
        if self.live > self.peak:
            self.peak, self.peak_step = self.live, step

    def free(self, step: int, tensor: int, nbytes: int) -> None:
        self.live -= nbytes
        self.record((_FREE, step, tensor, nbytes, self.live, self.host))

    def host_event(self, kind: int, step: int, tensor: int, nbytes: int, sign: int) -> None:
        """A copy to the host (`sign` +1) or its release (-1): host bytes, not device bytes."""
        self.host += sign * nbytes
        self.host_peak = max(self.host_peak, self.host)
        self.record((kind, step, tensor, nbytes, self.live, self.host))

    def move(self, variable: int, buffer: int, *, pending: bool) -> None:
        """A variable's bytes count once wherever they live: a move changes no live bytes."""

    def release_moved(self, variable: int) -> None:
        """Nothing to release: see `move`."""
