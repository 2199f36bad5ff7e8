"""The lowest peak any swap plan could reach: resident bytes plus the largest single-op need.

Every op needs its inputs and outputs on the device while it runs (and its kernel's scratch), so
no plan can go below the resident bytes plus the largest such working set. An element-wise op may
write its output into an input buffer of the same size (`Op.inplace`): its output then needs no
bytes of its own. Tuning is judged against this bound.
"""

from __future__ import annotations

from simulator.graph import Graph, Op
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
