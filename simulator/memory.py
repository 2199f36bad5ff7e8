"""The memory interpreter: walk the schedule, allocate outputs, free buffers after their last use.

The schedule is compiled once per graph and order (`simulator.program`). The walk decides when
each buffer is allocated and freed and hands those events to a heap (`simulator.heap`), which
owns the accounting and the peak, after XLA's HeapSimulator: the walk runs with the live-bytes
heap; the BFC allocator replays its trace (`simulator.replay`). Liveness comes from a reverse
walk (last use). Buffers, not tensors, are allocated: a forwarding op (Identity, Reshape,
ReadVariableOp) shares its input's buffer, and an element-wise op may take over an input
buffer that dies at that op.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from simulator.heap import LiveBytes
from simulator.order import Order
from simulator.program import Move, Program
from simulator.trace import EventKind, Trace

__all__ = [
    "SEARCH_GC_THRESHOLD",
    "SimResult",
    "fewer_collections",
    "paused_gc",
    "simulate_memory",
]


_SWAP_OUT = int(EventKind.SWAP_OUT)
_SWAP_IN = int(EventKind.SWAP_IN)
_HOST_FREE = int(EventKind.HOST_FREE)
_RECOMPUTE = int(EventKind.RECOMPUTE)


@dataclass(frozen=True)
class SimResult:
    """What a simulation predicts: the peaks, where the live peak happens, what was resident,
    and the trace."""

    #: the most bytes of live buffers at once (the live-bytes heap)
    live_peak_bytes: int
    peak_step: int
    peak_op: str
    peak_level: int
    persistent_bytes: int
    trace: Trace
    order: Order
    resident_sizes: tuple[int, ...]
    host_peak_bytes: int = 0
    #: the program's assignments with the buffers their values had (for the allocator)
    moves: tuple[Move, ...] = ()
    #: the peak an allocator model reached replaying the trace, if one did
    allocator_peak_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        """The predicted peak: the allocator's when one replayed the trace, else the live one."""
        if self.allocator_peak_bytes is None:
            return self.live_peak_bytes
        return self.allocator_peak_bytes

    @property
    def transient_peak_bytes(self) -> int:
        """Peak bytes above what was resident before the step."""
        return self.peak_bytes - self.persistent_bytes

    def largest_at_peak(self, n: int = 10) -> list[tuple[str, int]]:
        """The `n` largest tensors live at the peak of the walk, largest first, with bytes."""
        live = self.trace.live_at(self.peak_step)
        return sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


class _Walk:
    """The interpreter's state while it walks one schedule: buffers and liveness. It accounts
    for nothing itself: each allocation and release goes to the heap (`simulator.heap`), here
    the live-bytes policy, which records the trace.

    `run` keeps the hot state in locals (it runs for every op of a graph of thousands, in every
    trial of a search); the few steps a swap plan adds events to go through `_plan_*`.
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        #: per buffer, the step of its last use while it is allocated, else -1
        self.buf_last = [-1] * len(program.last_use)
        self.frees: list[list[int] | None] = [None] * len(program.steps)
        self.trace = Trace(program.order.ops, program.levels, program.names, program.lists)
        self.heap = LiveBytes(program.persistent_bytes, self.trace.rows.append)
        self.buf: list[int] = []

    def run(self) -> None:
        """Walk every step: place its outputs (forwarded, an input reused in place, or new),
        then free the buffers whose last use it is; step outputs are freed after the last."""
        program = self.program
        last, sizes, buf = program.last_use, program.alloc_bytes, list(range(len(self.buf_last)))
        buf_last, frees = self.buf_last, self.frees
        alloc, free = self.heap.alloc, self.heap.free
        planned = [False] * len(program.steps)  # steps with swap or recompute events
        for q in (
            program.host_out.keys()
            | program.swap_ins.keys()
            | program.host_free.keys()
            | program.recomputes.keys()
        ):
            planned[q] = True
        steps = program.steps
        self.buf = buf
        for p in program.visits:
            outs = steps[p]
            for t, nbytes, fwd, cands in outs:
                if fwd < 0:  # an input whose live buffer dies here and has the output's size
                    for c in cands:
                        b = buf[c]
                        if buf_last[b] == p and sizes[b] == nbytes:
                            fwd = c
                            break
                end = last[t]
                if fwd >= 0:
                    b = buf[t] = buf[fwd]
                    if end <= buf_last[b]:
                        continue
                    buf_last[b] = end
                else:  # compile_program keeps only outputs that need new device memory here
                    b = t
                    buf_last[t] = end
                    alloc(p, t, nbytes)
                waiting = frees[end]
                if waiting is None:
                    frees[end] = [b]
                else:
                    waiting.append(b)
            held: frozenset[int] = frozenset()
            if planned[p]:
                self._host_events(p, program.host_out.get(p, ()), _SWAP_OUT, 1)
                held = self._chain_inputs(p)
            waiting = frees[p]
            if waiting is not None:
                for b in waiting:
                    if buf_last[b] == p and b not in held:
                        buf_last[b] = -1
                        free(p, b, sizes[b])
            if planned[p]:
                self._plan_in(p, held)

    def _chain_inputs(self, p: int) -> frozenset[int]:
        """The buffers that the chains re-run after step `p` read (recompute events of sign
        0): those whose last use is `p` are freed after the chains, not before."""
        events = self.program.recomputes.get(p, ())
        return frozenset(self.buf[t] for t, _, sign in events if sign == 0)

    def _plan_in(self, p: int, held: frozenset[int]) -> None:
        """Swap-ins the op at step `p` triggers, once the inputs it was the last to read are
        freed, then the ops it triggers to re-run (the buffers `held` for them freed after
        their last reader among them, when `p` is their last use), then the host copies
        released at `p`. A swapped-in or recomputed copy is always a new buffer."""
        for t, nbytes, _, _ in self.program.swap_ins.get(p, ()):
            self._place(p, t, nbytes, _SWAP_IN)
        sizes = self.program.alloc_bytes
        for t, nbytes, sign in self.program.recomputes.get(p, ()):
            if sign > 0:
                self._place(p, t, nbytes, _RECOMPUTE)
            elif sign < 0:  # an intermediate of the chain, after its last reader there
                self.buf_last[t] = -1
                self.heap.free(p, t, nbytes)
            elif self.buf[t] in held and self.buf_last[self.buf[t]] == p:  # read last there
                b = self.buf[t]
                self.buf_last[b] = -1
                self.heap.free(p, b, sizes[b])
        self._host_events(p, self.program.host_free.get(p, ()), _HOST_FREE, -1)

    def _place(self, p: int, t: int, nbytes: int, kind: int) -> None:
        """A new buffer for tensor `t` at step `p`, freed after its last use."""
        end = self.program.last_use[t]
        self.buf_last[t] = end
        if end > p:
            waiting = self.frees[end]
            if waiting is None:
                self.frees[end] = [t]
            else:
                waiting.append(t)
        self.heap.alloc(p, t, nbytes, kind)

    def _host_events(self, p: int, events: Iterable[tuple[int, int]], kind: int, sign: int) -> None:
        """Copies to the host (sign +1; the op at `p` starts them, before the step's frees) or
        their release (sign -1) at step `p`."""
        for t, nbytes in events:
            self.heap.host_event(kind, p, t, nbytes, sign)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: the hot loops allocate many small tuples, and in a
    process holding TensorFlow's millions of objects each collection they trigger is slow."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: during a search, the cyclic collector looks at its youngest objects after this many
#: allocations (Python's default: 700). A search allocates mostly short-lived tuples between
#: its paused simulations; at the default, ResNet-50's main job spent 5.1 s of its 84 s in
#: the collector (3.6 s in 22 full passes), at this figure 1.5 s (one full pass), with the
#: same peak resident memory (docs/method.md, "Constants")
SEARCH_GC_THRESHOLD = 20_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic collector's young passes every `SEARCH_GC_THRESHOLD` allocations (and
    its full passes as much rarer); the thresholds are restored after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], SEARCH_GC_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def simulate_memory(program: Program) -> SimResult:
    """Run the interpreter over the compiled schedule and return the peak and the trace."""
    with paused_gc():
        return _simulate_memory(program)


def _simulate_memory(program: Program) -> SimResult:
    walk = _Walk(program)
    walk.run()
    heap = walk.heap
    moves = tuple(
        Move(a.step, a.held, walk.buf[a.value] if a.value >= 0 else -1, a.release)
        for a in program.assignments
    )
    order = program.order
    step = heap.peak_step
    return SimResult(
        live_peak_bytes=heap.peak,
        peak_step=step,
        peak_op=order.ops[step],
        peak_level=program.levels[step],
        persistent_bytes=program.persistent_bytes,
        trace=walk.trace,
        order=order,
        resident_sizes=program.resident_sizes,
        host_peak_bytes=heap.host_peak,
        moves=moves,
    )
