"""Order edges: control edges that keep the backward pass from holding large tensors at once.

In the categorized order, independent branches advance level by level together, and every op
runs as early as it can. In ResNet-50's backward pass the two branches of a block each run an
unfused BatchNorm gradient: eight activation-sized tensors are held at once, under every swap
plan, as each is made and read within a few levels. And inside one BatchNorm gradient, the
terms its final AddN sums are each made as early as possible and held until the last is ready.

`find_order_edges` searches edges greedily, driven by the simulation. At the peak, for the
large live buffers, it tries two kinds:

- *after*: another buffer's branch waits for the reader that frees this one (one branch's
  gradient runs after the other's has freed its tensors);
- *sink*: a buffer is made only after another input of the reader that frees it (a term is
  made when the sum is near, not held for levels).

It keeps the edge that lowers the simulated peak most, and repeats until no edge lowers it.
On ResNet-50 at batch 1000, the least-memory plan's peak goes from 24.9 GiB to 12.9 GiB.

`deferral_edges` are found without a search. An op made from variables and constants alone
(directly or through other such ops) is ready when the step starts, and TensorFlow's executor
runs it then; its output is held until the first op it reaches that is not such an op runs.
An optimizer's terms such as `momentum * velocity` are such ops: in ResNet-50's step with SGD
and momentum, 98 MiB of them are made at the start of the step and read only by the updates at
its end. So are a Keras dropout's random numbers and mask, made from its seed generator's
state. The edge (the latest other input of that first op, the op) makes each when it is
needed (the figures are in docs/method.md).

`feeder_edges` defer the same way the ops that compute, from forward tensors alone, what only
the backward pass reads: a custom gradient's recomputation (Keras' swish recomputes its
sigmoid in its gradient). Ready during the forward pass, they run then and their outputs are
held until the gradient reaches them; deferred, they run when it does.

`write_edges` (`simulator.writes`) defer a variable's write until the values read from it
before the write have been read for the last time.

`held_input_edges` defer, the same way, an op whose inputs stay live past its first reader
anyway (read again later, or resident): run later, it holds no input longer and its output
for less time. In an unrolled recurrent layer every time step's input projection is ready as
soon as the layer below has made its input, and runs then: one projection per time step held
at once until the recurrence reaches it. The edge waits for the latest input of the reader or
of the ops deferred with it to that reader (a recurrence's sum reads two products: the input
projection waits for the state's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Set

from simulator.graph import Graph, GraphError, TensorKind
from simulator.memory import SimResult
from simulator.order import Order

__all__ = [
    "Edge",
    "deferral_edges",
    "feeder_edges",
    "find_order_edges",
    "grouped",
    "held_input_edges",
    "reachable",
]

Edge = tuple[str, str]
#: The simulation of a graph: its result and the order it walked.
PeakOf = Callable[[Graph], tuple[SimResult, Order]]
#: Tensors live at the peak that count as large: at least this share of the peak.
LARGE_SHARE = 0.02


def find_order_edges(
    graph: Graph,
    peak_of: PeakOf,
    *,
    start_level: int = 0,
    rounds: int = 8,
    largest: int = 8,
    together: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[Edge, ...]:
    """Edges `(before, after)` that lower `peak_of`'s peak, found greedily (at most `rounds`).

    Only ops at `start_level` or later (in the order `peak_of` walks) are delayed, so a
    backward-pass schedule never holds up the forward pass; `largest` caps the tensors live
    at the peak that are paired. `together` maps an op to the ops run as one kernel with it:
    an edge into or out of one is added for each of them.
    No edge touches an op Grappler rewrote in the original step (`Graph.rewritten`).
    """
    edges: list[Edge] = []
    current = graph
    result, order = peak_of(current)
    fixed = graph.rewritten
    for _ in range(rounds):
        best: tuple[int, tuple[Edge, ...], Graph, SimResult, Order] | None = None
        for edge in _candidates(current, result, order, start_level, largest):
            group = grouped(edge, together or {})
            if fixed.intersection(n for e in group for n in e):
                continue
            trial = current.with_control_edges(group)
            try:
                r, o = peak_of(trial)
            except GraphError:  # a cycle through ops run together
                continue
            if r.peak_bytes < (best[0] if best else result.peak_bytes):
                best = (r.peak_bytes, group, trial, r, o)
        if best is None:
            break
        _, group, current, result, order = best
        edges.extend(group)
    return tuple(edges)


def deferral_edges(graph: Graph, order: Order, *, past_rewritten: bool = False) -> tuple[Edge, ...]:
    """Edges `(source, op)` that make each op ready when the step starts (`_early`) with
    device outputs wait until its output is needed: `source` is the latest other input of the
    first op its outputs reach that is not ready then (the op's deadline, `_deadline_edges`).
    A chain made from variables alone, such as a dropout's random numbers and mask, made from
    its seed generator's state, thus runs where the layer does. See the module's docstring.
    No edge touches an op Grappler rewrote in the original step (`Graph.rewritten`); with
    `past_rewritten`, the ops such an op reads wait instead (`_targets`)."""
    emit = functools.partial(_makes_device_bytes, graph)
    return _deadline_edges(graph, order, _early(graph, order), emit, past_rewritten)


def held_input_edges(graph: Graph, order: Order) -> tuple[Edge, ...]:
    """Edges `(source, op)` that make an op whose inputs are held past its deadline anyway
    wait until its output is needed: run later, it holds no input longer and its output for
    less time. In an unrolled recurrent layer every time step's input projection
    (`x_t @ W`) is ready once the layer below has made `x_t`, and in the categorized order
    all of them run before the recurrence reads the first: one per time step held at once.
    No edge touches an op Grappler rewrote in the original step (`Graph.rewritten`)."""
    pos = order.position
    early = _early(graph, order)
    movable = frozenset(
        name for name in order.ops
        if name not in early and _makes_device_bytes(graph, name)
        and _held_until(graph, pos, name, min((pos[c] for c in graph.successors(name)),
                                              default=-1))
    )  # fmt: skip
    deadline = _deadlines(graph, order, movable)
    feeding: dict[str, list[str]] = {}
    for name, end in deadline.items():
        feeding.setdefault(end, []).append(name)
    out: list[Edge] = []
    fixed = graph.rewritten
    for end, ops in feeding.items():
        # the latest input of the deadline or of an op run for it: where every input of the
        # deadline is such an op (a recurrence's two products), the one made last
        found = (_latest_input(graph, n, movable, pos) for n in (end, *ops))
        source = max((f for f in found if f is not None), key=pos.__getitem__, default=None)
        if source is None:
            continue
        out += [(source, n) for n in ops if n not in fixed and pos[source] > pos[n]
                and _held_until(graph, pos, n, pos[end])]  # fmt: skip
    return tuple(out)


def _held_until(graph: Graph, pos: Mapping[str, int], name: str, step: int) -> bool:
    """Whether every input of op `name` is resident or read again at `step` or later."""
    if step < 0:
        return False
    for t in graph.ops[name].inputs:
        tensor = graph.tensors[t]
        if tensor.kind.resident:
            continue
        if max(pos[c] for c in tensor.consumers) < step:
            return False
    return True


def feeder_edges(graph: Graph, order: Order, feeders: frozenset[str]) -> tuple[Edge, ...]:
    """Edges `(source, op)` for each op of `feeders` (ops whose outputs only the backward
    pass reads, computed from forward tensors), to the first non-feeder op its outputs reach
    (`_deadline_edges`). No edge touches an op Grappler rewrote in the original step."""
    return _deadline_edges(graph, order, feeders, lambda name: True)


def _deadline_edges(
    graph: Graph,
    order: Order,
    movable: Set[str],
    emit: Callable[[str], bool],
    past_rewritten: bool = False,
) -> tuple[Edge, ...]:
    """Edges `(source, op)` for each op of `movable` that `emit` accepts: its deadline is the
    first op (in `order`) not in `movable` that it reaches, by data or control edges, through
    ops of `movable`; `source` is the latest other input of the deadline, when it comes later
    than the op (`_latest_input`). Neither end is an op of `Graph.rewritten`.

    No cycle: give a movable op the position of its deadline and any other op its own. Every
    edge of the graph leads to an op of no lower position (a movable op's deadline is the
    least of its successors'), and every new edge to a higher one (a source precedes its
    deadline), so a cycle would have to stay at one position along edges of the graph alone.
    """
    pos = order.position
    deadline = _deadlines(graph, order, movable)
    out: list[Edge] = []
    targets = _targets(graph, movable, emit, past_rewritten)
    for name in order.ops:
        end = deadline.get(name)
        if end is None or name not in targets:
            continue
        source = _latest_input(graph, end, movable, pos)
        if source is not None and pos[source] > pos[name]:
            out.append((source, name))
    return tuple(out)


def _targets(
    graph: Graph, movable: Set[str], emit: Callable[[str], bool], past_rewritten: bool
) -> set[str]:
    """The ops of `movable` that wait: those `emit` accepts, and, `past_rewritten`, for one of
    them that Grappler rewrote (an edge may not end there), the nearest ops of `movable` it
    reads that it did not (a weight decay's `(var * wd) * lr`, regrouped, waits by its read
    of the variable). Not in general: under MirroredStrategy, a dropout's read of its seed
    state made to wait so changed a step's loss in its last bits (docs/method.md)."""
    fixed = graph.rewritten
    emitted = [n for n in movable if emit(n)]
    out = {n for n in emitted if n not in fixed}
    stack = [n for n in emitted if n in fixed] if past_rewritten else []
    seen = set(stack)
    while stack:
        for p in graph.predecessors(stack.pop()):
            if p in movable and p not in seen:
                seen.add(p)
                if p in fixed:
                    stack.append(p)
                elif graph.predecessors(p):  # a source (a constant) runs before the step
                    out.add(p)
    return out


def _deadlines(graph: Graph, order: Order, movable: Set[str]) -> dict[str, str]:
    """Each op of `movable`'s deadline: the first op (in `order`) not in `movable` that it
    reaches, by data or control edges, through ops of `movable` (none if it reaches none)."""
    pos = order.position
    deadline: dict[str, str] = {}
    for name in reversed(order.ops):
        if name in movable:
            ends = [deadline.get(c) if c in movable else c for c in graph.successors(name)]
            known = [e for e in ends if e is not None]
            if known:
                deadline[name] = min(known, key=pos.__getitem__)
    return deadline


def _latest_input(graph: Graph, op: str, movable: Set[str], pos: Mapping[str, int]) -> str | None:
    """The latest (in `pos`) predecessor of `op` outside `movable` that an edge may leave:
    where that is an op of `Graph.rewritten` (gone from the step TensorFlow runs), the
    latest of its own predecessors instead, and so on up."""
    fixed = graph.rewritten
    found: str | None = None
    seen: set[str] = set()
    stack = [p for p in graph.predecessors(op) if p not in movable]
    while stack:
        p = stack.pop()
        if p in seen or (found is not None and pos[p] <= pos[found]):
            continue
        seen.add(p)
        if p not in fixed:
            found = p
        else:
            stack += [q for q in graph.predecessors(p) if q not in movable]
    return found


def _early(graph: Graph, order: Order) -> frozenset[str]:
    """The ops ready when the step starts that are made from variables and constants alone:
    their predecessors are all such ops (an op with none is one) and they read none of the
    step's inputs (what those are read into is the step's own flow)."""
    early: set[str] = set()
    for name in order.ops:
        if any(p not in early for p in graph.predecessors(name)):
            continue
        inputs = (graph.tensors[graph.buffer_root(t)] for t in graph.ops[name].inputs)
        if all(t.kind is not TensorKind.INPUT for t in inputs):
            early.add(name)
    return frozenset(early)


def _makes_device_bytes(graph: Graph, name: str) -> bool:
    """Whether op `name` reads anything and makes bytes on the device (not a view)."""
    op = graph.ops[name]
    made = [graph.tensors[t] for j, t in enumerate(op.outputs) if j not in op.forwards]
    return bool(op.inputs) and any(t.nbytes and t.kind.on_device for t in made)


def grouped(edge: Edge, together: Mapping[str, tuple[str, ...]]) -> tuple[Edge, ...]:
    """`edge` into and out of each op run as one kernel with its ends (`together`)."""
    before, after = edge
    return tuple(
        (a, b) for a in together.get(before, (before,)) for b in together.get(after, (after,))
    )


def _candidates(
    graph: Graph, result: SimResult, order: Order, start_level: int, largest: int
) -> list[Edge]:
    """Edges worth trying for the large buffers live at the peak: see `_after_edges` and
    `_sink_edges`."""
    floor = result.peak_bytes * LARGE_SHARE
    live = [n for n, nb in result.largest_at_peak(largest) if nb >= floor and n in graph.tensors]
    freed = result.trace.freed_at()
    last = {n: order.ops[freed[n]] for n in live if freed.get(n, len(order.ops)) < len(order.ops)}
    out: dict[Edge, None] = {}
    for a in live:
        if a in last:
            out.update(dict.fromkeys(_after_edges(graph, order, a, last[a], live, start_level)))
    for b in live:
        if b in last:
            out.update(dict.fromkeys(_sink_edges(graph, order, b, last[b], start_level)))
    return list(out)


def _after_edges(
    graph: Graph, order: Order, a: str, last: str, live: list[str], start_level: int
) -> list[Edge]:
    """Each other live buffer's branch waits for `last`, the reader that frees buffer `a`."""
    before = _ancestors(graph, last) | {last}
    out = []
    for b in live:
        producer = graph.tensors[b].producer
        if b == a or producer in before or order.level[producer] < start_level:
            continue
        out.append((last, _branch_root(graph, producer, before, order, start_level)))
    return out


def _sink_edges(graph: Graph, order: Order, b: str, last: str, start_level: int) -> list[Edge]:
    """Buffer `b` is made only after another input of `last` (the reader that frees it) is:
    a tensor made long before its reader needs it is not held meanwhile."""
    producer = graph.tensors[b].producer
    if order.level[producer] < start_level or not graph.predecessors(producer):
        return []
    return [
        (other, producer)
        for other in graph.predecessors(last)
        if order.position[other] > order.position[producer]
        and producer not in _ancestors(graph, other)
    ]


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
    return reachable(graph, op, graph.predecessors)


def reachable(graph: Graph, op: str, step: Callable[[str], list[str]]) -> set[str]:
    """Every op reached from `op` by `step` (`graph.predecessors`: what it depends on;
    `graph.successors`: what depends on it), not `op` itself unless on a cycle."""
    seen: set[str] = set()
    stack = [op]
    while stack:
        for p in step(stack.pop()):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen
