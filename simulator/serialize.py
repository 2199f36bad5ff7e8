"""Order edges: control edges that keep parallel branches from holding large tensors at once.

In the categorized order, independent branches advance level by level together. In ResNet-50's
backward pass the two branches of a block each run an unfused BatchNorm gradient, and the eight
activation-sized tensors they hold at once are the step's peak under every swap plan, as each
is made and read within a few levels. One edge that lets the second branch's gradient start
after the first has freed its tensors leaves five of them (ResNet-50 at batch 1000 on the
least-memory plan: 24.9 GiB without, 15.9 GiB with).

`find_order_edges` searches such edges greedily, driven by the simulation: at the peak, for each
pair of large live tensors made by independent ops, it tries to delay the second tensor's
branch until the first tensor's last reader ran, and keeps the edge that lowers the simulated
peak most, until no edge lowers it.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.graph import Graph
from simulator.memory import SimResult
from simulator.order import Order

__all__ = ["Edge", "find_order_edges"]

Edge = tuple[str, str]
#: The simulation of a graph: its result and the order it walked.
PeakOf = Callable[[Graph], tuple[SimResult, Order]]
#: Tensors live at the peak that count as large: at least this share of the peak.
LARGE_SHARE = 0.02


def find_order_edges(
    graph: Graph, peak_of: PeakOf, *, start_level: int = 0, rounds: int = 8, largest: int = 8
) -> tuple[Edge, ...]:
    """Edges `(before, after)` that lower `peak_of`'s peak, found greedily (at most `rounds`).

    Only ops at `start_level` or later (in the order `peak_of` walks) are delayed, so a
    backward-pass schedule never holds up the forward pass; `largest` caps the tensors live
    at the peak that are paired.
    """
    edges: list[Edge] = []
    current = graph
    result, order = peak_of(current)
    for _ in range(rounds):
        best: tuple[int, Edge, Graph, SimResult, Order] | None = None
        for edge in _candidates(current, result, order, start_level, largest):
            trial = current.with_control_edges((edge,))
            r, o = peak_of(trial)
            if r.peak_bytes < (best[0] if best else result.peak_bytes):
                best = (r.peak_bytes, edge, trial, r, o)
        if best is None:
            break
        _, edge, current, result, order = best
        edges.append(edge)
    return tuple(edges)


def _candidates(
    graph: Graph, result: SimResult, order: Order, start_level: int, largest: int
) -> list[Edge]:
    """For large live tensors `a`, `b` at the peak: `b`'s branch waits for `a`'s last reader."""
    floor = result.peak_bytes * LARGE_SHARE
    live = [n for n, nb in result.largest_at_peak(largest) if nb >= floor and n in graph.tensors]
    out: dict[Edge, None] = {}
    for a in live:
        last = max(graph.tensors[a].consumers, key=order.position.__getitem__, default=None)
        if last is None:
            continue
        before = _ancestors(graph, last) | {last}
        for b in live:
            producer = graph.tensors[b].producer
            if b == a or producer in before or order.level[producer] < start_level:
                continue
            out[(last, _branch_root(graph, producer, before, order, start_level))] = None
    return list(out)


def _branch_root(graph: Graph, op: str, before: set[str], order: Order, start_level: int) -> str:
    """Walk up from `op` to its earliest predecessor that does not run before the edge's
    source anyway (and lies at `start_level` or later): where its branch starts. Source ops
    (constants) are never targets: they run when the step starts."""
    while True:
        ups = [
            p
            for p in graph.predecessors(op)
            if p not in before and order.level[p] >= start_level and graph.predecessors(p)
        ]
        if not ups:
            return op
        op = min(ups, key=order.position.__getitem__)


def _ancestors(graph: Graph, op: str) -> set[str]:
    """Every op `op` depends on (data and control edges)."""
    seen: set[str] = set()
    stack = [op]
    while stack:
        for p in graph.predecessors(stack.pop()):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen
