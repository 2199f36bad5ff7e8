"""The lowest peak any swap plan could reach: resident bytes plus the largest single-op need.

Every op needs its inputs and outputs on the device while it runs (and its kernel's scratch), so
no plan can go below the resident bytes plus the largest such working set. An element-wise op may
write its output into an input buffer of the same size (`Op.inplace`): its output then needs no
bytes of its own. Tuning is judged against this bound.

The least step time any plan could reach at a budget (`time_bound_seconds`) is a relaxation.
Take the step's live peak without a plan, at step p: a plan that fits the budget must take at
least `over` = peak - budget of the bytes live at p off the device there (every other change a
plan makes adds bytes), by swapping them out or by freeing them to recompute them later. A
swapped tensor live at p has a reader after p: its copy to the host ends before p starts (its
device buffer is free only then) and its copy back starts at p or later. So for S swapped
bytes p cannot start before S/d2h nor before the ops ahead of it have run, and the rest of the
step lasts at least S/h2d and at least the compute of p and the ops after it, to which every
recompute adds: a recompute re-runs the chain that makes its tensor again (`remake_chain`: an
op that wrote over its input's buffer, as a bias add over a convolution's output, leaves no
input to start from), after p (made before p, the copy would be live at p). Recomputing R
bytes costs at least the cheapest R bytes, per byte, of the buffers a plan could recompute
(`tiers`; an op several chains share split among them). The bound is the least, over every
split of `over` into S + R, of max(before, S/d2h) + max(after + recompute, S/h2d). Memory
counts allocations, rounded up; the link carries the tensors' own bytes, so `over` is first
reduced by what the candidates' rounding adds (`Engine.time_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.graph import Graph, Op
from simulator.heap import GRANULARITY, round_up
from simulator.timing import Link

__all__ = ["lower_bound_bytes", "time_bound_seconds"]


def lower_bound_bytes(graph: Graph, *, granularity: int = GRANULARITY) -> int:
    """Resident bytes plus the largest working set (inputs, outputs, scratch) of any op."""
    resident = sum(
        round_up(t.nbytes, granularity) for t in graph.tensors.values() if t.kind.resident
    )
    best = 0
    for op in graph.ops.values():
        roots = {graph.buffer_root(n) for n in [*op.inputs, *op.outputs]}
        need = sum(
            round_up(graph.tensors[r].nbytes, granularity)
            for r in roots
            if graph.tensors[r].kind.on_device
        )
        need -= _reused_in_place(graph, op, granularity)
        best = max(best, need + round_up(op.scratch, granularity))
    return resident + best


def _reused_in_place(graph: Graph, op: Op, granularity: int) -> int:
    """The bytes of `op`'s first output when it may take over an input buffer of its size."""
    if not op.inplace or not op.outputs:
        return 0
    out = graph.tensors[op.outputs[0]]
    if graph.buffer_root(out.name) != out.name or not out.kind.on_device:
        return 0  # forwarded: counted once with its root already
    size = round_up(out.nbytes, granularity)
    inputs = (graph.tensors[graph.buffer_root(op.inputs[i])] for i in op.inplace)
    sizes = (round_up(t.nbytes, granularity) for t in inputs if t.kind.on_device)
    return size if size in sizes else 0


def time_bound_seconds(
    before: float,
    after: float,
    over: int,
    link: Link,
    tiers: Sequence[tuple[int, float]] = (),
) -> float:
    """The least step time of a plan that takes `over` bytes off the device at the peak step
    p (see the module's docstring): `before` and `after` are the compute seconds of the ops
    before p and of p and the ops after it, `tiers` the bytes recomputes could free, each
    with the least seconds per byte their recompute takes."""
    if over <= 0:
        return before + after
    cheapest = sorted(tiers, key=lambda t: t[1])
    most = min(over, sum(n for n, _ in cheapest))

    def step(swapped: float) -> float:  # convex in the swapped bytes: a ternary search
        recomputed = _recompute_seconds(cheapest, over - swapped)
        return max(before, swapped / link.d2h) + max(after + recomputed, swapped / link.h2d)

    lo, hi = float(over - most), float(over)
    for _ in range(_SEARCH_STEPS):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, b) if step(a) <= step(b) else (a, hi)
    return min(step(lo), step(over - most), step(over))


#: a ternary search's steps: the interval shrinks to (2/3)^100 of `over`, far below a byte
_SEARCH_STEPS = 100


def _recompute_seconds(cheapest: Sequence[tuple[int, float]], nbytes: float) -> float:
    """The least seconds recomputing `nbytes` takes, the cheapest tiers first."""
    seconds = 0.0
    for n, per_byte in cheapest:
        if nbytes <= 0:
            break
        seconds += per_byte * min(n, nbytes)
        nbytes -= n
    return seconds
