"""The lowest peak any swap plan could reach: resident bytes plus the largest single-op need.

Every op needs its inputs and outputs on the device while it runs (and its kernel's scratch), so
no plan can go below the resident bytes plus the largest such working set. Tuning is judged
against this bound.
"""

from __future__ import annotations

from simulator.graph import Graph
from simulator.heap import GRANULARITY, round_up

__all__ = ["lower_bound_bytes"]


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
        best = max(best, need + round_up(op.scratch, granularity))
    return resident + best
