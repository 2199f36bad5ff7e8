"""Write edges: a variable's write waits until the values read from it before the write have
been read for the last time.

TensorFlow writes a variable in place unless such a value is still to be read, and else into a
new buffer, the old one held until then (copy-on-write). AdamW's weight decay
(`var -= lr * wd * var`) reads the variable alone, so it is ready, and runs, once the forward
pass has read the weight, and holds a second copy of each decayed weight until the backward
pass has read it: 0.46 GiB of GPT-2 small's at batch 4. Deferred, it writes in place; the
values read and written are the same (docs/method.md).
"""

from __future__ import annotations

from simulator.graph import Graph
from simulator.order import Order
from simulator.order_edges import Edge, reachable
from simulator.program import reads_before

__all__ = ["write_edges"]


def write_edges(graph: Graph, order: Order) -> tuple[Edge, ...]:
    """Edges `(reader, write)`: each write of a variable (`Op.assigns`) waits for the readers,
    later in `order`, of the values read from the variable before it (see the module's
    docstring). Neither end is an op of `Graph.rewritten`, and no edge closes a cycle (a
    reader that depends on the write keeps its place)."""
    pos, fixed = order.position, graph.rewritten
    out: list[Edge] = []
    for name in order.ops:
        op = graph.ops[name]
        if not op.assigns or name in fixed:
            continue
        p = pos[name]
        readers = {
            c
            for a in reads_before(graph, order, name)
            for c in graph.tensors[a].consumers
            if pos[c] > p and c not in fixed
        }
        if readers:
            after = reachable(graph, name, graph.successors)
            out += [(c, name) for c in sorted(readers, key=pos.__getitem__) if c not in after]
    return tuple(out)
