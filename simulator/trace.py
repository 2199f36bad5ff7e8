"""The simulator's event trace: its primary output, from which peaks, timelines and plots derive."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

__all__ = ["Event", "EventKind", "Trace"]


class EventKind(IntEnum):
    """What happened to device or host memory at one step of the schedule."""

    ALLOC = 0
    FREE = 1
    SWAP_OUT = 2
    SWAP_IN = 3
    STALL = 4


@dataclass(frozen=True)
class Event:
    """One event: at schedule step `step` (op `op`, level `level`) `nbytes` of `tensor` moved."""

    kind: EventKind
    step: int
    level: int
    op: str
    tensor: str
    nbytes: int
    live_bytes: int


class Trace:
    """Events stored as columns (cheap to build in the hot loop), viewed as `Event`s on demand."""

    def __init__(self, ops: tuple[str, ...], levels: list[int], tensors: list[str]) -> None:
        self._ops = ops
        self._levels = levels
        self._tensors = tensors
        self.kind: list[int] = []
        self.step: list[int] = []
        self.tensor: list[int] = []
        self.nbytes: list[int] = []
        self.live: list[int] = []

    def record(self, kind: int, step: int, tensor: int, nbytes: int, live: int) -> None:
        """Append one event (the interpreter's only way to write the trace)."""
        self.kind.append(kind)
        self.step.append(step)
        self.tensor.append(tensor)
        self.nbytes.append(nbytes)
        self.live.append(live)

    def __len__(self) -> int:
        return len(self.kind)

    def __iter__(self) -> Iterator[Event]:
        for i in range(len(self.kind)):
            yield self.event(i)

    def event(self, i: int) -> Event:
        """The i-th event as a record."""
        step = self.step[i]
        op = self._ops[step] if step < len(self._ops) else "<end>"
        level = self._levels[step] if step < len(self._levels) else -1
        return Event(
            EventKind(self.kind[i]),
            step,
            level,
            op,
            self._tensors[self.tensor[i]],
            self.nbytes[i],
            self.live[i],
        )

    @property
    def events(self) -> list[Event]:
        """All events as records, in order."""
        return list(self)

    def live_bytes(self) -> np.ndarray:
        """Live device bytes after each event."""
        return np.asarray(self.live, dtype=np.int64)

    def live_by_step(self, n_steps: int, start: int) -> np.ndarray:
        """Peak live device bytes at each schedule step (the memory timeline)."""
        out = np.full(n_steps, start, dtype=np.int64)
        current = start
        last = -1
        for step, live in zip(self.step, self.live):
            if step >= n_steps:
                break
            if step != last:
                out[last + 1 : step] = current
                out[step] = live
                last = step
            out[step] = max(out[step], live)
            current = live
        out[last + 1 :] = current
        return out
