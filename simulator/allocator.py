"""A model of TensorFlow's best-fit-with-coalescing (BFC) allocator, replaying a trace's events.

The memory walk says which tensors are live; the allocator decides how many bytes that costs. BFC
rounds every request to 256 bytes, takes the smallest free chunk that fits, and only splits it when
the chunk is at least twice the request, so a 1.6 MiB tensor placed in a fresh 2 MiB region holds
all 2 MiB. Regions grow by doubling from 2 MiB when `allow_growth` (TensorFlow's CPU BFC), or are
one region of the whole memory (a GPU without growth). `bytes_in_use` counts whole chunks, exactly
as `tf.config.experimental.get_memory_info(...)['peak']` does. A trace is replayed on it by
`simulator.replay`, with the variables moving between chunks where the step writes them.

Inside the model, sizes and addresses count 256-byte units (BFC's granularity): they stay small
ints, which Python adds, compares and hashes faster than the byte counts of a large device.
The model's attributes and methods speak bytes.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

from simulator.heap import GRANULARITY, round_up
from simulator.trace import DEVICE_ALLOCS, EventKind, Row

__all__ = ["BFCModel", "OutOfMemory"]

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
        #: tensors that are a loop's list: TensorFlow allocates each of its elements, so its
        #: request never holds a chunk beyond its size (it is always split off)
        self.lists: frozenset[int] = frozenset()
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
        self.base_units = 0  # in use when the peak was last reset
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
        self.peak_units = self.base_units = self.in_use_units

    @property
    def peak_above_base(self) -> int:
        """The peak's bytes above those in use when it was last reset: what a step allocated
        at most, as a measurement that reads the allocator around the step takes it."""
        return (self.peak_units - self.base_units) * _UNIT

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
        lists = self.lists
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
                    spare = size - units
                    if size >= 2 * units or spare >= waste or spare and tensor in lists:  # split
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


def _units(nbytes: int) -> int:
    """`nbytes` in units of the allocator's granularity, rounded up (at least one unit)."""
    return round_up(nbytes) // _UNIT or 1
