"""A simulated step's trace replayed on the BFC model (`simulator.allocator`): its peak as a
measurement takes it (after a warm-up), with the variables moving between buffers where the
step writes them, as TensorFlow's do; and a real allocator's request history replayed."""

from __future__ import annotations

import dataclasses
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from simulator.allocator import BFCModel
from simulator.heap import GRANULARITY
from simulator.memory import SimResult, paused_gc
from simulator.program import Move
from simulator.trace import EventKind, Row, Trace

__all__ = ["BFCHeap", "Request", "replay_history", "replay_peak", "with_allocator"]

_UNIT = GRANULARITY  # the model's addresses count 256 B units
_ALLOC, _FREE = int(EventKind.ALLOC), int(EventKind.FREE)


def replay_peak(
    trace: Trace,
    resident: list[int],
    model: BFCModel | None = None,
    *,
    warmup: bool = True,
    moves: Sequence[Move] = (),
) -> int:
    """Peak bytes in use while replaying `trace` after placing the resident tensors' bytes.

    With `warmup`, the peak is that of the measured step after a warm-up, as a measurement
    takes it: the measured step starts from the free chunks the warm-up left behind.
    `moves` are the step's variable writes (`SimResult.moves`), which move variables between
    buffers as TensorFlow's do: a write that adopts its value's buffer frees the variable's
    old one, and a write while a read of the variable is pending goes to a new buffer, the old
    one freed after the read's last consumer. The measured step then starts from the layout the
    warm-up left, and is replayed; without moves it is replayed only where it can differ from
    the warm-up (`_exhausted`).
    """
    with paused_gc():
        return _replay_peak(trace, resident, model or BFCModel(), warmup, moves)


class Request(NamedTuple):
    """One request a real allocator served: an allocation of `nbytes` (as asked, before
    rounding) at `address`, or the release of the chunk at `address`."""

    allocated: bool
    address: int
    nbytes: int = 0


def replay_history(
    requests: Sequence[Request], start: int = 0, model: BFCModel | None = None
) -> int:
    """Peak bytes in use from request `start` on, replaying what a real allocator served: each
    allocation placed by the model, each release freeing the chunk placed for that address. A
    whole process's history (say, from the profiler) checks the model against the allocator's
    own peak, free of any assumption about which tensors a step holds and when."""
    if not 0 <= start < len(requests):
        raise ValueError(f"start {start} is not one of the {len(requests)} requests")
    model = model or BFCModel()
    placed: dict[int, int] = {}
    for i, req in enumerate(requests):
        if i == start:
            model.reset_peak()
        if req.allocated:
            placed[req.address] = model.allocate(req.nbytes)
        elif req.address in placed:
            model.release(placed.pop(req.address))
        else:
            raise ValueError(f"request {i} releases {req.address:#x}, which was not allocated")
    return model.peak


def with_allocator(result: SimResult, allocator: BFCModel) -> SimResult:
    """`result` with the peak `allocator` reaches replaying the trace (its live peak kept)."""
    resident = list(result.resident_sizes)
    peak = replay_peak(result.trace, resident, allocator, moves=result.moves)
    return dataclasses.replace(result, allocator_peak_bytes=peak)


class BFCHeap:
    """The BFC policy of `simulator.heap.Heap`: a `BFCModel`, where each of a trace's buffers
    sits, and where each held variable does (addresses in units of 256 B)."""

    def __init__(self, model: BFCModel, n_tensors: int, resident: Sequence[int]) -> None:
        self.model = model
        self.resident = list(resident)
        self.held = model.hold(self.resident)
        self.where = [0] * n_tensors
        self.waiting: dict[int, list[int]] = {}  # variable -> old buffers a read holds

    @property
    def peak(self) -> int:
        return self.model.peak

    def alloc(self, step: int, tensor: int, nbytes: int, kind: int = _ALLOC) -> None:
        self.model.replay([(kind, step, tensor, nbytes, 0, 0)], self.where)

    def free(self, step: int, tensor: int, nbytes: int) -> None:
        self.model.replay([(_FREE, step, tensor, nbytes, 0, 0)], self.where)

    def replay(self, rows: Iterable[Row]) -> None:
        """`alloc` and `free` for each of a trace's rows, in one loop (host rows pass)."""
        self.model.replay(rows, self.where)

    def move(self, variable: int, buffer: int, *, pending: bool) -> None:
        old = self.held[variable]
        if buffer >= 0:
            self.held[variable] = self.where[buffer]
        else:
            self.held[variable] = self.model.allocate(self.resident[variable]) // _UNIT
        if pending:
            self.waiting.setdefault(variable, []).append(old)
        else:
            self.model.release(old * _UNIT)

    def release_moved(self, variable: int) -> None:
        for addr in self.waiting.pop(variable, []):
            self.model.release(addr * _UNIT)


def _replay_peak(
    trace: Trace, resident: list[int], model: BFCModel, warmup: bool, moves: Sequence[Move]
) -> int:
    heap = BFCHeap(model, trace.n_tensors, resident)
    model.lists = trace.lists
    if moves:
        actions = _move_actions(trace.rows, moves)
        for _ in range(2 if warmup else 1):
            model.reset_peak()
            _replay_moving(heap, trace.rows, actions)
        return heap.peak
    regions = model.allocated_regions
    model.reset_peak()
    heap.replay(trace.rows)
    if warmup and model.allocated_regions != regions and _exhausted(model):
        model.reset_peak()
        heap.replay(trace.rows)
    return heap.peak


# rows of a step after its op ran: the frees of the inputs it last read, then its swap-ins
_AFTER_THE_OP = frozenset(
    map(int, (EventKind.FREE, EventKind.SWAP_IN, EventKind.RECOMPUTE, EventKind.HOST_FREE))
)
# what a variable write does to the allocator, at a row of the trace (see `_move_actions`)
_RELEASE_OLD, _ADOPT, _COPY = 0, 1, 2
# (row index, order at that row, action, held variable, buffer, whether the old one waits); the
# order is the step the action belongs to, then a release before a write of the same step
_Action = tuple[int, int, int, int, int, bool]


def _move_actions(rows: Sequence[Row], moves: Sequence[Move]) -> list[_Action]:
    """Where each variable write acts in the trace's rows, in row order: an adoption in place
    of the row that frees its value's buffer (the row is skipped), a copy while its op runs
    (before the frees of its step), and the release of old buffers a pending read held, after
    the rows of the step that last consumes it (before the actions of later steps there). A
    step without rows shares its index with the next step that has some: actions at one index
    run in the order of their steps, so a copy is made before the release of a later step
    frees its old buffer."""
    actions: list[_Action] = []
    step = operator.itemgetter(1)
    for move in moves:
        lo = bisect_left(rows, move.step, key=step)
        hi = bisect_right(rows, move.step, key=step)
        after = [i for i in range(lo, hi) if rows[i][0] in _AFTER_THE_OP]
        waits = move.release >= 0
        adopted = [i for i in after if rows[i][0] == _FREE and rows[i][2] == move.buffer]
        if adopted:  # (a buffer of -1 frees no row)
            actions.append((adopted[0], 2 * move.step + 1, _ADOPT, move.held, move.buffer, waits))
        elif waits:
            at = after[0] if after else hi
            actions.append((at, 2 * move.step + 1, _COPY, move.held, -1, True))
        if waits:
            end = bisect_right(rows, move.release, key=step)
            actions.append((end, 2 * move.release, _RELEASE_OLD, move.held, -1, False))
    actions.sort(key=lambda a: a[:2])
    return actions


def _replay_moving(heap: BFCHeap, rows: Sequence[Row], actions: list[_Action]) -> None:
    """One pass over `rows` with the variable writes `actions`."""
    start = 0
    for index, _, kind, variable, buffer, waits in actions:
        heap.replay(rows[start:index])
        start = index
        if kind == _RELEASE_OLD:
            heap.release_moved(variable)
            continue
        if kind == _ADOPT:  # the variable takes its value's buffer: that row frees nothing
            start = index + 1
        heap.move(variable, buffer, pending=waits)
    heap.replay(rows[start:])


def _exhausted(model: BFCModel) -> bool:
    """Whether the measured step after a warm-up could differ from the warm-up: only when the
    regions fill the memory limit, so that the last one may have been cut short.

    A step frees all it allocates, so the measured step starts where the warm-up did, plus the
    regions the warm-up added, each whole and free. A region is never smaller than one made
    before it (sizes double, or grow to fit a request and then stay), unless the limit cuts it,
    and it lies above them. Best fit takes the smallest chunk that fits, the lowest address on
    a tie; so at each request the measured step takes the chunk the warm-up took, or, where the
    warm-up added a region, that same region (the smallest and lowest of those it added from
    there on). The two steps place every tensor alike and reach the same peak.

    That holds for a step that keeps every variable in the buffer it was placed in. A step
    with variable writes (`moves`) moves some variables to new buffers, so the measured step's
    layout differs from the warm-up's: `_replay_peak` then always replays it.
    """
    return model.memory_limit - model.allocated_regions < _UNIT
