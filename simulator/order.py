"""The categorized topological order of the ISMM 2019 paper.

A level is one wave of Kahn's algorithm: every op's predecessors lie in earlier levels and the ops
of one level are independent. Inside a level ops keep their insertion order, so the order is
deterministic. The distance between two ops is the difference of their levels.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from simulator.graph import Graph, GraphError

__all__ = [
    "EDGE_ARRAY",
    "Order",
    "categorized_order",
    "executor_order",
    "executor_orders",
    "scheduled_order",
]


@dataclass(frozen=True)
class Order:
    """The schedule (ops in execution order) with each op's level and position."""

    ops: tuple[str, ...]
    level: dict[str, int]
    position: dict[str, int]
    n_levels: int

    def distance(self, a: str, b: str) -> int:
        """Levels from op `a` to op `b` (positive when `b` comes later)."""
        return self.level[b] - self.level[a]

    def level_ops(self, level: int) -> list[str]:
        """The ops of one level, in order."""
        return [name for name in self.ops if self.level[name] == level]


def categorized_order(graph: Graph) -> Order:
    """Levels by Kahn's waves in O(ops + edges); raise GraphError naming an op on a cycle."""
    index = {name: i for i, name in enumerate(graph.ops)}
    succs = {name: graph.successors(name) for name in graph.ops}
    indeg = {name: 0 for name in graph.ops}
    for targets in succs.values():
        for s in targets:
            indeg[s] += 1
    wave = [name for name, d in indeg.items() if d == 0]
    schedule: list[str] = []
    level: dict[str, int] = {}
    depth = 0
    while wave:
        for name in wave:
            level[name] = depth
        schedule.extend(wave)
        nxt: list[str] = []
        for name in wave:
            for s in succs[name]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    nxt.append(s)
        nxt.sort(key=index.__getitem__)
        wave = nxt
        depth += 1
    return Order(tuple(schedule), level, _positions(schedule, indeg), depth)


def _positions(schedule: list[str], waiting: dict[str, int]) -> dict[str, int]:
    """Each op's position in `schedule`; raise GraphError naming an op still `waiting` for a
    predecessor (the graph has a cycle) when the schedule left ops out."""
    if len(schedule) != len(waiting):
        stuck = next(name for name, n in waiting.items() if n > 0)
        raise GraphError(f"graph has a cycle through op {stuck!r}")
    return {name: i for i, name in enumerate(schedule)}


def scheduled_order(graph: Graph, priority: dict[str, float], base: Order | None = None) -> Order:
    """An order that runs ops as `priority` says (e.g. the order a device executed them).

    Kahn's algorithm with a heap: among ready ops the lowest priority runs first. An op without a
    priority (fused or pruned by TensorFlow's optimizer) takes its latest predecessor's, so it runs
    as soon as it is ready. Levels (and so distances) stay those of the categorized order.
    """
    base = base or categorized_order(graph)
    index = {name: i for i, name in enumerate(graph.ops)}
    indeg = {name: len(graph.predecessors(name)) for name in graph.ops}
    key: dict[str, float] = {}
    heap: list[tuple[float, int, str]] = []

    def push(name: str, inherited: float) -> None:
        key[name] = priority.get(name, inherited)
        heapq.heappush(heap, (key[name], index[name], name))

    for name, d in indeg.items():
        if d == 0:
            push(name, -1.0)
    schedule: list[str] = []
    while heap:
        _, _, name = heapq.heappop(heap)
        schedule.append(name)
        for s in graph.successors(name):
            indeg[s] -= 1
            if indeg[s] == 0:
                push(s, max(key[p] for p in graph.predecessors(s)))
    position = {name: i for i, name in enumerate(schedule)}
    return Order(tuple(schedule), base.level, position, base.n_levels)


def executor_order(graph: Graph, inline: Callable[[str], bool], base: Order | None = None) -> Order:
    """The order TensorFlow's executor runs `graph` in with one inter-op thread, its ops and
    out-edges in the graph's own order (see `executor_orders` for the orders a process takes).

    The executor runs a ready op at once and, when it finishes, looks at the ops it made ready
    (its consumers, in edge order). Those whose kernel is inexpensive (`inline(op)`: constants,
    identities, shape ops) queue behind the current run; of the expensive ones the last stays
    on this thread if nothing is queued, and the others go to the thread pool, whose single
    thread takes the most recently added closure first once the current run is done. The
    executor defers, for instance, every filter gradient of a CNN to the end of the backward
    pass, holding the activations they read. Levels stay those of the categorized order.
    """
    succ = {name: graph.successors(name) for name in graph.ops}
    return _executor_run(graph, list(graph.ops), succ, _waiting(graph), inline, base)


def executor_orders(
    graph: Graph,
    inline: Callable[[str], bool],
    rewritten: Callable[[str], bool],
    samples: int,
    seed: int = 0,
) -> list[Order]:
    """Orders TensorFlow's executor takes for `graph` in different processes, `samples` of them
    drawn with `seed` (reproducible).

    The executor sees the ops and their out-edges in the order of the graph it was built from,
    and that order is not the same in every process:

    - A graph pass that re-creates ops (oneDNN's renames every op of `rewritten`) makes them in
      the reverse post-order of a depth-first search from the graph's source. The search takes
      an op's out-edges in their order, except where TensorFlow keeps them in a hash set (the
      source's, and those of ops with more than `EDGE_ARRAY` out-edges), iterated in an order
      of pointers that differs between processes. Re-created ops come after all others.
    - The executor's graph is imported from that list (`_imported`): each op's out-edges come
      in the order its consumers were created, so of two expensive consumers of a tensor the
      one re-created later runs first.

    The step's roots keep their order. They were seen to start in different orders in
    different processes, but drawing their order at random, with the variables' moves
    between buffers modelled (`replay_peak`), drew tiny-cnn (batch 128) orders peaking at up
    to 66 MiB, 6 of 15 above 61 MiB, where 30 of 34 processes measured 51.3 to 53.5 MiB and 4
    took 58.0 to 62.0; with their order kept, 40 draws span 51.8 to 57.6 MiB, and the 3-D
    U-Net's (batch 8) median is 7.20 MiB against 7.30 measured in 30 processes.
    """
    rng = random.Random(seed)
    succ = {name: graph.successors(name) for name in graph.ops}
    waiting = _waiting(graph)
    first = _imported(list(graph.ops), succ, waiting)
    sources = [n for n in first if not waiting[n]]
    fanout = {n: _out_edges(graph, n) > EDGE_ARRAY for n in graph.ops}
    base = categorized_order(graph)
    orders = []
    for _ in range(samples):
        post = _reverse_post_order(sources, succ, fanout, rng)
        created = [n for n in post if rewritten(n)]
        made = set(created)
        listed = [n for n in first if n not in made] + created
        ids = _imported(listed, succ, waiting)
        position = {n: i for i, n in enumerate(ids)}
        edges = {n: sorted(s, key=position.__getitem__) for n, s in succ.items()}
        orders.append(_executor_run(graph, ids, edges, waiting, inline, base))
    return orders


#: out-edges TensorFlow keeps in an array, in the order they were added; an op with more keeps
#: them in a hash set (tensorflow/core/graph/edgeset.h)
EDGE_ARRAY = 8


def _out_edges(graph: Graph, name: str) -> int:
    """Out-edges of op `name` as TensorFlow counts them: one per consuming input and control
    edge."""
    op = graph.ops[name]
    data = sum(len(graph.tensors[t].consumers) for t in op.outputs)
    return data + len(graph.control_consumers.get(name, []))


def _waiting(graph: Graph) -> dict[str, int]:
    """The number of distinct ops each op waits for."""
    return {name: len(graph.predecessors(name)) for name in graph.ops}


def _imported(listed: list[str], succ: dict[str, list[str]], inputs: dict[str, int]) -> list[str]:
    """The order in which TensorFlow's GraphConstructor creates the ops of a graph listed in
    `listed` order (`inputs`: how many ops each waits for): topologically, the ready op listed
    first each time."""
    rank = {name: i for i, name in enumerate(listed)}
    waiting = dict(inputs)
    ready = [(rank[n], n) for n in listed if waiting[n] == 0]
    heapq.heapify(ready)
    made: list[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        made.append(name)
        for s in succ[name]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    _positions(made, waiting)
    return made


def _reverse_post_order(
    roots: list[str], succ: dict[str, list[str]], fanout: dict[str, bool], rng: random.Random
) -> list[str]:
    """TensorFlow's `GetReversePostOrder`: a depth-first search from the source (an edge to each
    of the `roots`) that stacks an op's successors in edge order and takes the last stacked
    first; the source's edges and those of `fanout` ops come in a random order."""
    stack: list[tuple[str, bool]] = [(n, False) for n in rng.sample(roots, len(roots))]
    seen: set[str] = set()
    post: list[str] = []
    while stack:
        name, done = stack.pop()
        if done:
            post.append(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        stack.append((name, True))
        nxt = succ[name]
        if fanout[name]:
            nxt = rng.sample(nxt, len(nxt))
        stack.extend((s, False) for s in nxt if s not in seen)
    post.reverse()
    return post


def _executor_run(
    graph: Graph,
    ids: list[str],
    succ: dict[str, list[str]],
    inputs: dict[str, int],
    inline: Callable[[str], bool],
    base: Order | None,
) -> Order:
    """Emulate the executor (see `executor_order`) on ops created in `ids` order, each op's
    out-edges in `succ` order (`inputs`: how many ops each waits for)."""
    base = base or categorized_order(graph)
    pending = {name: inputs[name] for name in ids}
    pool = deque(name for name in ids if pending[name] == 0)
    schedule: list[str] = []
    while pool:
        run = deque([pool.popleft()])
        while run:
            name = run.popleft()
            schedule.append(name)
            expensive: str | None = None
            for s in succ[name]:
                pending[s] -= 1
                if pending[s]:
                    continue
                if inline(s):
                    run.append(s)
                    continue
                if expensive is not None:
                    pool.appendleft(expensive)
                expensive = s
            if expensive is not None:
                if run:
                    pool.appendleft(expensive)
                else:
                    run.append(expensive)
    return Order(tuple(schedule), base.level, _positions(schedule, pending), base.n_levels)
