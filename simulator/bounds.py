"""The lowest peak any swap plan could reach: resident bytes plus the largest single-op need.

Every op needs its inputs and outputs on the device while it runs (and its kernel's scratch), so
no plan can go below the resident bytes plus the largest such working set. An element-wise op may
write its output into an input buffer of the same size (`Op.inplace`), and a loop's carried
value the buffer of its value before (`Op.carried`): such an output then needs no bytes of its
own. Tuning is judged against this bound.

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
from dataclasses import dataclass

import numpy as np

from simulator.graph import Graph
from simulator.heap import GRANULARITY, round_up_all
from simulator.timing import Link

__all__ = ["WorkingSets", "lower_bound_bytes", "time_bound_seconds"]


def lower_bound_bytes(graph: Graph, *, granularity: int = GRANULARITY) -> int:
    """Resident bytes plus the largest working set (inputs, outputs, scratch) of any op."""
    sets = WorkingSets.of(graph)
    return sets.bound(sets.sizes(graph), sets.scratch(graph), granularity)


@dataclass(frozen=True)
class WorkingSets:
    """What `lower_bound_bytes` adds up, as index arrays over a graph's tensors and ops, so that
    the bound of the same graph at other sizes (a batch family's) needs no graph built: per op
    the buffers it needs on the device, and the output that may take over one of its inputs'
    buffers where they are the same size (`Op.inplace`)."""

    tensors: tuple[str, ...]
    ops: tuple[str, ...]
    resident: np.ndarray
    #: (op, buffer) pairs: the buffers each op needs on the device
    need_op: np.ndarray
    need_buffer: np.ndarray
    #: (op, output, input) triples: the output may take over the input's buffer
    reuse_op: np.ndarray
    reuse_out: np.ndarray
    reuse_in: np.ndarray
    #: each output that may take over a buffer once, with its op (what `bound` credits)
    reusing_out: np.ndarray
    reusing_op: np.ndarray

    @classmethod
    def of(cls, graph: Graph) -> WorkingSets:
        tensors = tuple(graph.tensors)
        index = {n: i for i, n in enumerate(tensors)}
        root = {n: graph.buffer_root(n) for n in tensors}
        on_device = {n for n, t in graph.tensors.items() if t.kind.on_device}
        pairs: list[tuple[int, int]] = []
        triples: list[tuple[int, int, int]] = []
        for k, op in enumerate(graph.ops.values()):
            roots = {root[n] for n in [*op.inputs, *op.outputs]} & on_device
            pairs += [(k, index[r]) for r in sorted(roots)]
            for j, out in enumerate(op.outputs):
                if root[out] == out and out in on_device:
                    ins = {root[op.inputs[i]] for i in op.takes_over(j)} & on_device
                    triples += [(k, index[out], index[r]) for r in sorted(ins)]
        resident = [index[n] for n, t in graph.tensors.items() if t.kind.resident]
        pair, triple = np.array(pairs, np.int64), np.array(triples, np.int64)
        need = pair.T if len(pairs) else np.zeros((2, 0), np.int64)
        reuse = triple.T if len(triples) else np.zeros((3, 0), np.int64)
        outs, first = np.unique(reuse[1], return_index=True)
        return cls(
            tensors,
            tuple(graph.ops),
            np.array(resident, np.int64),
            need_op=need[0],
            need_buffer=need[1],
            reuse_op=reuse[0],
            reuse_out=reuse[1],
            reuse_in=reuse[2],
            reusing_out=outs,
            reusing_op=reuse[0][first],
        )

    def sizes(self, graph: Graph) -> np.ndarray:
        """The bytes of each tensor of `graph` (this one, or one with its tensors)."""
        return np.array([graph.tensors[n].nbytes for n in self.tensors], np.int64)

    def scratch(self, graph: Graph) -> np.ndarray:
        """The scratch bytes of each op of `graph`, a loop's run one iteration at a time (as
        a plan with `serialize` runs it: `Op.ahead`)."""
        return np.array([graph.ops[n].scratch - graph.ops[n].ahead for n in self.ops], np.int64)

    def bound(self, sizes: np.ndarray, scratch: np.ndarray, granularity: int = GRANULARITY) -> int:
        """`lower_bound_bytes` for tensors of `sizes` and ops of `scratch` bytes."""
        rounded = round_up_all(sizes, granularity)
        need = round_up_all(scratch, granularity)
        np.add.at(need, self.need_op, rounded[self.need_buffer])
        fits = rounded[self.reuse_out] == rounded[self.reuse_in]
        taken = np.zeros(len(rounded), np.int64)  # per output: the buffer it takes over
        np.maximum.at(taken, self.reuse_out[fits], rounded[self.reuse_out[fits]])
        reused = np.zeros(len(self.ops), np.int64)
        np.add.at(reused, self.reusing_op, taken[self.reusing_out])
        best = int(max(0, (need - reused).max(initial=0)))
        return int(rounded[self.resident].sum()) + best


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
