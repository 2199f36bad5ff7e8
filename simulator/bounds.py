"""The lowest peak any swap plan could reach: resident bytes plus the largest single-op need.

Every op needs its inputs and outputs on the device while it runs (and its kernel's scratch), so
no plan can go below the resident bytes plus the largest such working set. An element-wise op may
write its output into an input buffer of the same size (`Op.inplace`): its output then needs no
bytes of its own. Tuning is judged against this bound.

The least step time any plan could reach at a budget (`time_bound_seconds`) is a relaxation.
Take the step's live peak without a plan, at step p: a plan that fits the budget must take at
least `over` = peak - budget of the bytes live at p off the device there (every other change a
plan makes adds bytes), by swapping them out or by freeing them to recompute them later. A
swapped tensor live at p has a reader after p, so its swap-out ends before p starts and its
swap-in is triggered at p or later: the device-to-host stream carries the swapped bytes before
p, the host-to-device stream after it, and the step lasts at least S/d2h + S/h2d for S swapped
bytes, however well the copies overlap compute. A recompute re-runs at least the op that makes
its tensor, so recomputing a tensor adds at least its producer's seconds to the one compute
stream, which already runs the whole step's compute; recomputing R bytes costs at least the
cheapest R bytes, per byte, of the tensors a plan could recompute (`tiers`: the forward
candidates made by a pure op). The bound is the least, over every split of `over` into S + R,
of the larger of the two. Memory counts allocations, rounded
up; the link carries the tensors' own bytes, so `over` is first reduced by what the candidates'
rounding adds (`Engine.time_bound`).
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
    compute: float,
    over: int,
    link: Link,
    tiers: Sequence[tuple[int, float]] = (),
) -> float:
    """The least step time of a plan that takes `over` bytes off the device at the peak (see
    the module's docstring): `compute` is the step's compute seconds, `tiers` the bytes
    recomputes could free, each with the least seconds per byte their recompute takes."""
    if over <= 0:
        return compute
    k = 1 / link.d2h + 1 / link.h2d  # seconds per swapped byte, out before p and in after it
    # the compute side grows with the recomputed bytes x, cheapest first (convex), the
    # transfer side shrinks: the least of their maximum is where they meet, or at an end
    x, added = 0.0, compute
    for nbytes, per_byte in sorted(tiers, key=lambda t: t[1]):
        if added >= (over - x) * k:
            break
        meet = (over * k - added + per_byte * x) / (per_byte + k)
        step = min(nbytes, over - x)
        if meet <= x + step:
            return added + per_byte * (meet - x)
        x, added = x + step, added + per_byte * step
        if x >= over:
            break
    return max(added, (over - x) * k)
