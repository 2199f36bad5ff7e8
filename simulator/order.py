"""The categorized topological order of the ISMM 2019 paper.

A level is one wave of Kahn's algorithm: every op's predecessors lie in earlier levels and the ops
of one level are independent. Inside a level ops keep their insertion order, so the order is
deterministic. The distance between two ops is the difference of their levels.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from simulator.graph import Graph, GraphError

__all__ = ["Order", "categorized_order", "executor_order", "scheduled_order"]


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
    """The order TensorFlow's executor runs `graph` in with one inter-op thread.

    The executor runs a ready op at once and, when it finishes, looks at the ops it made ready
    (its consumers, in edge order). Those whose kernel is inexpensive (`inline(op)`: constants,
    identities, shape ops) queue behind the current run; of the expensive ones the last stays
    on this thread if nothing is queued, and the others go to the thread pool, whose single
    thread takes the most recently added closure first once the current run is done. The
    executor defers, for instance, every filter gradient of a CNN to the end of the backward
    pass, holding the activations they read. Levels stay those of the categorized order.
    """
    base = base or categorized_order(graph)
    pending = {name: len(graph.predecessors(name)) for name in graph.ops}
    pool = deque(name for name, n in pending.items() if n == 0)
    schedule: list[str] = []
    while pool:
        run = deque([pool.popleft()])
        while run:
            name = run.popleft()
            schedule.append(name)
            expensive: str | None = None
            for s in graph.successors(name):
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
