"""The simulator's event trace: its primary output, from which peaks, timelines and plots derive."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

__all__ = ["DEVICE_ALLOCS", "Event", "EventKind", "Row", "Trace", "copy_name", "remade_name"]


def copy_name(tensor: str, k: int) -> str:
    """How the trace names the device copy swap-in `k` of `tensor` brings back."""
    return f"{tensor}@in{k}"


def remade_name(tensor: str) -> str:
    """How the trace names the copy of `tensor` a recompute makes."""
    return f"{tensor}@re"


class EventKind(IntEnum):
    """What happened to device or host memory at one step of the schedule (waits for copies
    are the time model's, `simulator.timing`, not memory events)."""

    ALLOC = 0
    FREE = 1
    SWAP_OUT = 2
    SWAP_IN = 3
    HOST_FREE = 5
    RECOMPUTE = 6


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
    host_bytes: int = 0


#: Event kinds that take device memory: a new tensor, a swapped-in or a recomputed copy.
DEVICE_ALLOCS = frozenset(map(int, (EventKind.ALLOC, EventKind.SWAP_IN, EventKind.RECOMPUTE)))
Row = tuple[int, int, int, int, int, int]  # kind, step, tensor id, bytes, device live, host live


class Trace:
    """Events stored as tuples in `rows` (the interpreter appends them directly, one append per
    event in the hot loop), read as columns or as `Event`s."""

    def __init__(
        self,
        ops: tuple[str, ...],
        levels: list[int],
        tensors: list[str],
        lists: frozenset[int] = frozenset(),
    ) -> None:
        self._ops = ops
        self._levels = levels
        self._tensors = tensors
        #: tensors that are a loop's lists (`Program.lists`)
        self.lists = lists
        self.rows: list[Row] = []
        self._columns: list[tuple[int, ...]] | None = None

    def _column(self, i: int) -> tuple[int, ...]:
        if self._columns is None or len(self._columns[0]) != len(self.rows):
            self._columns = list(zip(*self.rows)) if self.rows else [()] * 6
        return self._columns[i]

    @property
    def kind(self) -> tuple[int, ...]:
        return self._column(0)

    @property
    def step(self) -> tuple[int, ...]:
        return self._column(1)

    @property
    def tensor(self) -> tuple[int, ...]:
        return self._column(2)

    @property
    def nbytes(self) -> tuple[int, ...]:
        return self._column(3)

    @property
    def live(self) -> tuple[int, ...]:
        return self._column(4)

    @property
    def host(self) -> tuple[int, ...]:
        return self._column(5)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def n_tensors(self) -> int:
        """How many tensor ids the rows may name (buffers, scratch and swapped-in copies)."""
        return len(self._tensors)

    def __iter__(self) -> Iterator[Event]:
        for i in range(len(self.rows)):
            yield self.event(i)

    def event(self, i: int) -> Event:
        """The i-th event as a record."""
        kind, step, tensor, nbytes, live, host = self.rows[i]
        op = self._ops[step] if step < len(self._ops) else "<end>"
        level = self._levels[step] if step < len(self._levels) else -1
        return Event(EventKind(kind), step, level, op, self._tensors[tensor], nbytes, live, host)

    @property
    def events(self) -> list[Event]:
        """All events as records, in order."""
        return list(self)

    def live_at(self, step: int) -> dict[str, int]:
        """Device bytes of each buffer live at the moment step `step` held the most: the
        tensors behind a peak. A buffer is named by the tensor that allocated it (in-place and
        forwarding results share it); copies are named by `copy_name` and `remade_name`."""
        top, at = -1, -1
        for i, (_, s, _, _, live, _) in enumerate(self.rows):
            if s == step and live > top:
                top, at = live, i
        held: dict[int, int] = {}
        for kind, _, tensor, nbytes, _, _ in self.rows[: at + 1]:
            if kind in DEVICE_ALLOCS:
                held[tensor] = nbytes
            elif kind == EventKind.FREE:
                held.pop(tensor, None)
        return {self._tensors[t]: b for t, b in held.items()}

    def freed_at(self) -> dict[str, int]:
        """The step that freed each buffer (named as in `live_at`): where its last reader ran,
        in-place and forwarding readers included; the step's outputs at its end (`len(ops)`)."""
        return {
            self._tensors[tensor]: step
            for kind, step, tensor, _, _, _ in self.rows
            if kind == EventKind.FREE
        }

    def live_bytes(self) -> np.ndarray:
        """Live device bytes after each event."""
        return np.asarray(self.live, dtype=np.int64)

    def live_by_step(self, n_steps: int, start: int) -> np.ndarray:
        """Peak live device bytes at each schedule step (the memory timeline)."""
        return self._by_step(self.live, n_steps, start)

    def host_by_step(self, n_steps: int) -> np.ndarray:
        """Peak host bytes at each schedule step (swapped-out copies held)."""
        return self._by_step(self.host, n_steps, 0)

    def _by_step(self, values: tuple[int, ...], n_steps: int, start: int) -> np.ndarray:
        """The largest of `values` at each step; a step without events keeps the last one."""
        out = np.full(n_steps, start, dtype=np.int64)
        current = start
        last = -1
        for step, value in zip(self.step, values):
            if step >= n_steps:
                break
            if step != last:
                out[last + 1 : step] = current
                out[step] = value
                last = step
            out[step] = max(out[step], value)
            current = value
        out[last + 1 :] = current
        return out
