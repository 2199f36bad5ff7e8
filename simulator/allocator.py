"""A model of TensorFlow's best-fit-with-coalescing (BFC) allocator, replaying a trace's events.

The memory walk says which tensors are live; the allocator decides how many bytes that costs. BFC
rounds every request to 256 bytes, takes the smallest free chunk that fits, and only splits it when
the chunk is at least twice the request, so a 1.6 MiB tensor placed in a fresh 2 MiB region holds
all 2 MiB. Regions grow by doubling from 2 MiB when `allow_growth` (TensorFlow's CPU BFC), or are
one region of the whole memory (a GPU without growth). `bytes_in_use` counts whole chunks, exactly
as `tf.config.experimental.get_memory_info(...)['peak']` does. Variables move between chunks
where the step writes them, as TensorFlow's do (`replay_peak`'s `moves`).

Inside the model, sizes and addresses count 256-byte units (BFC's granularity): they stay small
ints, which Python adds, compares and hashes faster than the byte counts of a large device.
The model's attributes and methods speak bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from simulator.heap import GRANULARITY, round_up
from simulator.memory import Move, SimResult, paused_gc
from simulator.trace import DEVICE_ALLOCS, EventKind, Row, Trace

__all__ = [
    "BFCHeap",
    "BFCModel",
    "OutOfMemory",
    "Request",
    "replay_history",
    "replay_peak",
    "with_allocator",
]

_UNIT = GRANULARITY  # 256 B: BFC rounds every request up to it (kMinAllocationSize)
_UNIT_BITS = _UNIT.bit_length() - 1
_MAX_INTERNAL_FRAGMENTATION = (128 << 20) // _UNIT
_FIRST_REGION = 2 << 20
_ALLOC, _FREE = int(EventKind.ALLOC), int(EventKind.FREE)


class OutOfMemory(RuntimeError):
    """The modelled allocator could not place a request within its memory limit."""


# a free chunk is one sortable int, size << _ADDR_BITS | address (in units); addresses stay
# below the memory limit's units plus a unit per region, far below 2**48 units (64 PiB)
_ADDR_BITS = 48
_ADDR_MASK = (1 << _ADDR_BITS) - 1


class BFCModel:
    """Chunks by address (in use: `used`; free: `free_at` by start and `free_end` by end, so a
    released chunk finds free neighbours in two lookups) and the free chunks in one list sorted
    by (size, address), each encoded as one int, all in units of 256 B. Regions lie a unit
    apart, so chunks of different regions are never neighbours."""

    def __init__(self, memory_limit: int = 1 << 50, *, allow_growth: bool = True) -> None:
        if not 0 < memory_limit < _UNIT << _ADDR_BITS - 1:
            raise ValueError(f"memory limit {memory_limit} B is not within 1 B to 32 PiB")
        self.memory_limit = memory_limit
        self.region_bytes = min(memory_limit, _FIRST_REGION) if allow_growth else memory_limit
        self.region_bytes = _units(self.region_bytes) * _UNIT
        self.allocated_regions = 0
        # in units of 256 B:
        self.used: dict[int, int] = {}  # start -> size
        self.free_at: dict[int, int] = {}  # start -> size
        self.free_end: dict[int, int] = {}  # end -> start
        self.sorted_free: list[int] = []
        self.regions: list[tuple[int, int]] = []  # (base, size)
        self.in_use_units = 0
        self.peak_units = 0
        self._next_base = 0

    @property
    def in_use(self) -> int:
        """Bytes in chunks in use."""
        return self.in_use_units * _UNIT

    @property
    def peak(self) -> int:
        """The most bytes in use since the model was made or its peak reset."""
        return self.peak_units * _UNIT

    @property
    def free(self) -> list[tuple[int, int]]:
        """Free chunks as (bytes, address), smallest first: the order best fit searches."""
        return [
            ((key >> _ADDR_BITS) * _UNIT, (key & _ADDR_MASK) * _UNIT) for key in self.sorted_free
        ]

    def reset_peak(self) -> None:
        """Start a new peak from the bytes in use now (like reset_memory_stats)."""
        self.peak_units = self.in_use_units

    def allocate(self, nbytes: int) -> int:
        """Place `nbytes` and return the chunk's address."""
        where = [0]
        self.replay([(_ALLOC, 0, 0, nbytes, 0, 0)], where)
        return where[0] * _UNIT

    def release(self, addr: int) -> None:
        """Free the chunk at `addr` and coalesce it with free neighbours."""
        self.replay([(_FREE, 0, 0, 0, 0, 0)], [addr // _UNIT])

    def hold(self, sizes: Sequence[int]) -> list[int]:
        """Place tensors held across steps, as `allocate` one by one would, and return their
        addresses (in units of 256 B).

        In a fresh model each region is then a used prefix and a free tail: the placement is
        computed once per list of sizes (every simulation of a graph holds the same variables).
        """
        if self.regions:  # not fresh
            return [self.allocate(nbytes) // _UNIT for nbytes in sizes]
        regions, grown, placed = _held_layout(tuple(sizes), self.memory_limit, self.region_bytes)
        self.region_bytes, self.allocated_regions, self._next_base = grown
        for region in regions:
            self._place_region(*region)
        self.used.update(placed)
        return list(placed)

    def replay(self, rows: Iterable[Row], where: list[int]) -> None:
        """Replay a trace's rows in turn: place each device allocation (`DEVICE_ALLOCS`) and
        release each FREE; host events pass. `where` holds each placed tensor's address (in
        units). One loop with its state in locals, reading the walk's rows as they are: it runs
        for every allocation of every simulated step."""
        used, free_at, free_end, ordered = self.used, self.free_at, self.free_end, self.sorted_free
        shift, mask, waste = _ADDR_BITS, _ADDR_MASK, _MAX_INTERNAL_FRAGMENTATION
        free, placed, bits, up = _FREE, DEVICE_ALLOCS, _UNIT_BITS, _UNIT - 1
        in_use, peak = self.in_use_units, self.peak_units
        try:
            for kind, _, tensor, nbytes, _, _ in rows:
                if kind == free:  # release, coalescing with free neighbours
                    start = where[tensor]
                    size = used.pop(start)
                    in_use -= size
                    end = start + size
                    if end in free_at:
                        right = free_at.pop(end)
                        del ordered[bisect_left(ordered, right << shift | end)]
                        end += right
                    if start in free_end:
                        start = free_end.pop(start)
                        del ordered[bisect_left(ordered, free_at[start] << shift | start)]
                    free_at[start] = end - start
                    free_end[end] = start
                    insort(ordered, (end - start) << shift | start)
                elif kind in placed:  # best fit: the smallest free chunk that holds it
                    units = (nbytes + up) >> bits or 1  # _units(nbytes), inlined: hot
                    try:
                        key = ordered.pop(bisect_left(ordered, units << shift))
                    except IndexError:  # no free chunk fits: a new region
                        self._extend(units)
                        key = ordered.pop(bisect_left(ordered, units << shift))
                    size, addr = key >> shift, key & mask
                    del free_at[addr]
                    if size >= 2 * units or size - units >= waste:  # split off the rest
                        rest = addr + units
                        free_at[rest] = size - units
                        free_end[addr + size] = rest
                        insort(ordered, (size - units) << shift | rest)
                        size = units
                    else:
                        del free_end[addr + size]
                    used[addr] = size
                    in_use += size
                    if in_use > peak:
                        peak = in_use
                    where[tensor] = addr
        finally:  # an OutOfMemory leaves the state of the events before it
            self.in_use_units, self.peak_units = in_use, peak

    def _place_region(self, base: int, size: int, used: int) -> None:
        """Record a region whose first `used` units are in use (the caller records the chunks)
        and the rest is free."""
        self.regions.append((base, size))
        if used:
            self.in_use_units += used
            self.peak_units = max(self.peak_units, self.in_use_units)
        if used < size:
            self.free_at[base + used] = size - used
            self.free_end[base + size] = base + used
            insort(self.sorted_free, (size - used) << _ADDR_BITS | (base + used))

    def _extend(self, units: int) -> None:
        """Add a region that holds `units`, or raise OutOfMemory past the limit."""
        rounded = units * _UNIT
        available = (self.memory_limit - self.allocated_regions) // _UNIT * _UNIT
        if rounded > available:
            raise OutOfMemory(f"cannot place {rounded} B within {self.memory_limit} B")
        increased = False
        while rounded > self.region_bytes:
            self.region_bytes *= 2
            increased = True
        size = min(self.region_bytes, available)
        if not increased:
            self.region_bytes *= 2
        base = self._next_base
        self._next_base += size // _UNIT + 1
        self.allocated_regions += size
        self._place_region(base, size // _UNIT, 0)


@functools.lru_cache(maxsize=8)
def _held_layout(
    sizes: tuple[int, ...], memory_limit: int, region_bytes: int
) -> tuple[list[tuple[int, int, int]], tuple[int, int, int], dict[int, int]]:
    """Regions (base, size, used; in units) after placing `sizes` (bytes) one by one in a fresh
    model, the model's growth state after them (next region size, bytes in regions, next
    base address) and the chunks (address: size, in placement order). Without releases each
    region is a used prefix and a free tail."""
    model = BFCModel(memory_limit)
    model.region_bytes = region_bytes
    for nbytes in sizes:
        model.allocate(nbytes)
    regions = [
        (base, size, sum(n for a, n in model.used.items() if base <= a < base + size))
        for base, size in model.regions
    ]
    return regions, (model.region_bytes, model.allocated_regions, model._next_base), model.used


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


def _units(nbytes: int) -> int:
    """`nbytes` in units of the allocator's granularity, rounded up (at least one unit)."""
    return round_up(nbytes) // _UNIT or 1
