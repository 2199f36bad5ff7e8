"""A model of TensorFlow's best-fit-with-coalescing (BFC) allocator, replaying a trace's events.

The memory walk says which tensors are live; the allocator decides how many bytes that costs. BFC
rounds every request to 256 bytes, takes the smallest free chunk that fits, and only splits it when
the chunk is at least twice the request, so a 1.6 MiB tensor placed in a fresh 2 MiB region holds
all 2 MiB. Regions grow by doubling from 2 MiB when `allow_growth` (TensorFlow's CPU BFC), or are
one region of the whole memory (a GPU without growth). `bytes_in_use` counts whole chunks, exactly
as `tf.config.experimental.get_memory_info(...)['peak']` does.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.memory import SimResult, paused_gc
from simulator.trace import DEVICE_ALLOCS, EventKind, Trace

__all__ = ["BFCModel", "OutOfMemory", "replay_peak", "with_allocator"]

_MIN_ALLOC = 256
_MAX_INTERNAL_FRAGMENTATION = 128 << 20
_FIRST_REGION = 2 << 20


class OutOfMemory(RuntimeError):
    """The modelled allocator could not place a request within its memory limit."""


@dataclass(slots=True)
class _Chunk:
    size: int
    in_use: bool
    region_end: int
    prev: int | None


class BFCModel:
    """Chunks in address order per region, free chunks in one list sorted by (size, address)."""

    def __init__(self, memory_limit: int = 1 << 50, *, allow_growth: bool = True) -> None:
        self.memory_limit = memory_limit
        self.region_bytes = min(memory_limit, _FIRST_REGION) if allow_growth else memory_limit
        self.region_bytes = -(-self.region_bytes // _MIN_ALLOC) * _MIN_ALLOC
        self.allocated_regions = 0
        self.chunks: dict[int, _Chunk] = {}
        self.free: list[tuple[int, int]] = []
        self.in_use = 0
        self.peak = 0
        self._next_base = 0

    def reset_peak(self) -> None:
        """Start a new peak from the bytes in use now (like reset_memory_stats)."""
        self.peak = self.in_use

    def allocate(self, nbytes: int) -> int:
        """Place `nbytes` and return the chunk's address."""
        rounded = _rounded(nbytes)
        addr = self._find(rounded)
        if addr is None:
            self._extend(rounded)
            addr = self._find(rounded)
        if addr is None:
            raise self._out_of_memory(nbytes)
        return addr

    def hold(self, sizes: Sequence[int]) -> None:
        """Place tensors held for the whole run (never released), as `allocate` one by one would.

        In a fresh model each region is then a used prefix and a free tail: the placement is
        computed once per list of sizes (every simulation of a graph holds the same variables)
        and each region's held tensors become one in-use chunk. The bytes in use, the peak and
        the free chunks are those of the one-by-one placement.
        """
        if self.chunks:
            for nbytes in sizes:
                self.allocate(nbytes)
            return
        regions, grown = _held_layout(tuple(sizes), self.memory_limit, self.region_bytes)
        self.region_bytes, self.allocated_regions, self._next_base = grown
        for region in regions:
            self._place_region(*region)

    def _place_region(self, base: int, size: int, used: int) -> None:
        """Record a region whose first `used` bytes are one in-use chunk and the rest is free."""
        end = base + size
        if used:
            self.chunks[base] = _Chunk(used, True, end, None)
            self.in_use += used
            self.peak = max(self.peak, self.in_use)
        if used < size:
            self.chunks[base + used] = _Chunk(size - used, False, end, base if used else None)
            bisect.insort(self.free, (size - used, base + used))

    def release(self, addr: int) -> None:
        """Free the chunk at `addr` and coalesce it with free neighbours."""
        chunks, free = self.chunks, self.free
        chunk = chunks[addr]
        chunk.in_use = False
        self.in_use -= chunk.size
        nxt = addr + chunk.size
        if nxt < chunk.region_end:
            right = chunks[nxt]
            if not right.in_use:  # the free right neighbour joins this chunk
                del free[bisect.bisect_left(free, (right.size, nxt))]
                self._merge(addr, chunk, nxt, right)
        prev = chunk.prev
        if prev is not None:
            left = chunks[prev]
            if not left.in_use:  # this chunk joins the free left neighbour
                del free[bisect.bisect_left(free, (left.size, prev))]
                self._merge(prev, left, addr, chunk)
                addr, chunk = prev, left
        bisect.insort(free, (chunk.size, addr))

    def _merge(self, left_addr: int, left: _Chunk, right_addr: int, right: _Chunk) -> None:
        """Fold the chunk at `right_addr` into its neighbour at `left_addr`."""
        del self.chunks[right_addr]
        left.size += right.size
        after = left_addr + left.size
        if after < left.region_end:
            self.chunks[after].prev = left_addr

    def _find(self, rounded: int) -> int | None:
        free = self.free
        i = bisect.bisect_left(free, (rounded, -1))
        if i == len(free):
            return None
        size, addr = free.pop(i)
        chunk = self.chunks[addr]
        if _splits(size, rounded):
            # split: the rest becomes a free chunk of its own
            rest, rest_size = addr + rounded, size - rounded
            self.chunks[rest] = _Chunk(rest_size, False, chunk.region_end, addr)
            if rest + rest_size < chunk.region_end:
                self.chunks[rest + rest_size].prev = rest
            chunk.size = rounded
            bisect.insort(free, (rest_size, rest))
        chunk.in_use = True
        self.in_use += chunk.size
        if self.in_use > self.peak:
            self.peak = self.in_use
        return addr

    def _extend(self, rounded: int) -> None:
        region = self._grow(rounded)
        if region is not None:
            self._place_region(*region)

    def _new_region(self, rounded: int, nbytes: int) -> list[int]:
        region = self._grow(rounded)
        if region is None:
            raise self._out_of_memory(nbytes)
        return region

    def _out_of_memory(self, nbytes: int) -> OutOfMemory:
        return OutOfMemory(f"cannot place {nbytes} B within {self.memory_limit} B")

    def _grow(self, rounded: int) -> list[int] | None:
        """A new region (base, size, 0 used) that holds `rounded`, or None past the limit."""
        available = (self.memory_limit - self.allocated_regions) // _MIN_ALLOC * _MIN_ALLOC
        if rounded > available:
            return None
        increased = False
        while rounded > self.region_bytes:
            self.region_bytes *= 2
            increased = True
        size = min(self.region_bytes, available)
        if not increased:
            self.region_bytes *= 2
        base = self._next_base
        self._next_base += size + (1 << 40)
        self.allocated_regions += size
        return [base, size, 0]


@functools.lru_cache(maxsize=8)
def _held_layout(
    sizes: tuple[int, ...], memory_limit: int, region_bytes: int
) -> tuple[list[tuple[int, int, int]], tuple[int, int, int]]:
    """Regions (base, size, used bytes) after placing `sizes` in a fresh model, and the model's
    growth state after them (next region size, bytes in regions, next base address)."""
    model = BFCModel(memory_limit)
    model.region_bytes = region_bytes
    regions: list[list[int]] = []  # [base, size, used bytes]
    for nbytes in sizes:
        rounded = _rounded(nbytes)
        fits = [r for r in regions if r[1] - r[2] >= rounded]
        if not fits:
            fits = [model._new_region(rounded, nbytes)]
            regions.append(fits[0])
        region = min(fits, key=lambda r: (r[1] - r[2], r[0]))  # the smallest free tail that fits
        tail = region[1] - region[2]
        region[2] += rounded if _splits(tail, rounded) else tail
    grown = (model.region_bytes, model.allocated_regions, model._next_base)
    return [(base, size, used) for base, size, used in regions], grown


def _splits(size: int, rounded: int) -> bool:
    """Whether BFC splits a free chunk of `size` to place `rounded` bytes (else the request
    takes the whole chunk): when the chunk is at least twice the request, or would waste
    128 MiB or more."""
    return size >= 2 * rounded or size - rounded >= _MAX_INTERNAL_FRAGMENTATION


def replay_peak(
    trace: Trace, resident: list[int], model: BFCModel | None = None, *, warmup: bool = True
) -> int:
    """Peak bytes in use while replaying `trace` after placing the resident tensors' bytes.

    With `warmup`, the step is replayed once before the measured one, as a measurement does, so
    the measured step starts from the free chunks the warm-up left behind.
    """
    with paused_gc():
        return _replay_peak(trace, resident, model or BFCModel(), warmup)


def with_allocator(result: SimResult, allocator: BFCModel) -> SimResult:
    """`result` with its peak replaced by the peak `allocator` reaches replaying the trace."""
    peak = replay_peak(result.trace, list(result.resident_sizes), allocator)
    return dataclasses.replace(result, peak_bytes=peak)


def _replay_peak(trace: Trace, resident: list[int], model: BFCModel, warmup: bool) -> int:
    model.hold(resident)
    events = _device_events(trace)
    regions = model.allocated_regions
    model.reset_peak()
    _replay(events, model)
    if warmup and model.allocated_regions != regions:
        # a step frees all it allocates, so only the regions it added change the next step;
        # without new regions the measured step would repeat the warm-up exactly
        model.reset_peak()
        _replay(events, model)
    return model.peak


def _device_events(trace: Trace) -> list[tuple[int, int]]:
    """(tensor, bytes rounded to the allocator's granularity) for each device allocation and
    (tensor, 0) for each release, in trace order."""
    free = int(EventKind.FREE)
    return [
        (tensor, _rounded(nbytes) if kind != free else 0)
        for kind, _, tensor, nbytes, _, _ in trace.rows
        if kind == free or kind in DEVICE_ALLOCS
    ]


def _rounded(nbytes: int) -> int:
    """`nbytes` rounded up to the allocator's granularity (at least one unit)."""
    return max(_MIN_ALLOC, -(-nbytes // _MIN_ALLOC) * _MIN_ALLOC)


def _replay(events: list[tuple[int, int]], model: BFCModel) -> None:
    where = [0] * (1 + max((t for t, _ in events), default=0))  # chunk address by tensor
    release, find, allocate = model.release, model._find, model.allocate
    for tensor, rounded in events:
        if rounded:
            addr = find(rounded)
            where[tensor] = addr if addr is not None else allocate(rounded)
        else:
            release(where[tensor])
