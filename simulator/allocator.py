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
from dataclasses import dataclass

from simulator.memory import SimResult, paused_gc
from simulator.trace import EventKind, Trace

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
        rounded = max(_MIN_ALLOC, -(-nbytes // _MIN_ALLOC) * _MIN_ALLOC)
        addr = self._find(rounded)
        if addr is None:
            self._extend(rounded)
            addr = self._find(rounded)
        if addr is None:
            raise OutOfMemory(f"cannot place {nbytes} B within {self.memory_limit} B")
        return addr

    def release(self, addr: int) -> None:
        """Free the chunk at `addr` and coalesce it with free neighbours."""
        chunk = self.chunks[addr]
        chunk.in_use = False
        self.in_use -= chunk.size
        nxt = addr + chunk.size
        if nxt < chunk.region_end and not self.chunks[nxt].in_use:
            self._unlink_free(nxt)
            self._merge(addr, nxt)
        prev = chunk.prev
        if prev is not None and not self.chunks[prev].in_use:
            self._unlink_free(prev)
            self._merge(prev, addr)
            addr = prev
        bisect.insort(self.free, (self.chunks[addr].size, addr))

    def _find(self, rounded: int) -> int | None:
        i = bisect.bisect_left(self.free, (rounded, -1))
        if i == len(self.free):
            return None
        size, addr = self.free.pop(i)
        if size >= 2 * rounded or size - rounded >= _MAX_INTERNAL_FRAGMENTATION:
            self._split(addr, rounded)
        chunk = self.chunks[addr]
        chunk.in_use = True
        self.in_use += chunk.size
        if self.in_use > self.peak:
            self.peak = self.in_use
        return addr

    def _split(self, addr: int, rounded: int) -> None:
        chunk = self.chunks[addr]
        rest = addr + rounded
        self.chunks[rest] = _Chunk(chunk.size - rounded, False, chunk.region_end, addr)
        nxt = rest + chunk.size - rounded
        if nxt < chunk.region_end:
            self.chunks[nxt].prev = rest
        chunk.size = rounded
        bisect.insort(self.free, (self.chunks[rest].size, rest))

    def _merge(self, left: int, right: int) -> None:
        a, b = self.chunks[left], self.chunks.pop(right)
        a.size += b.size
        nxt = left + a.size
        if nxt < a.region_end:
            self.chunks[nxt].prev = left

    def _unlink_free(self, addr: int) -> None:
        i = bisect.bisect_left(self.free, (self.chunks[addr].size, addr))
        del self.free[i]

    def _extend(self, rounded: int) -> None:
        available = (self.memory_limit - self.allocated_regions) // _MIN_ALLOC * _MIN_ALLOC
        if rounded > available:
            return
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
        self.chunks[base] = _Chunk(size, False, base + size, None)
        bisect.insort(self.free, (size, base))


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
    for nbytes in resident:
        model.allocate(nbytes)
    for _ in range(2 if warmup else 1):
        model.reset_peak()
        _replay(trace, model)
    return model.peak


def _replay(trace: Trace, model: BFCModel) -> None:
    where: dict[int, int] = {}
    release = model.release
    allocate = model.allocate
    free = int(EventKind.FREE)
    device_allocs = (int(EventKind.ALLOC), int(EventKind.SWAP_IN))
    for kind, _, tensor, nbytes, _, _ in trace.rows:
        if kind in device_allocs:
            where[tensor] = allocate(nbytes)
        elif kind == free:
            release(where.pop(tensor))
