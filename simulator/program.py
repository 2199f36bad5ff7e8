"""A graph and its order lowered to integer arrays (`Program`), so that each simulation of a
plan is one tight loop over them (`simulator.memory`): per step the outputs it places (new,
forwarded, or an input taken over in place), each tensor's last use, the resident bytes, and
the variable writes that move variables between buffers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from simulator.graph import Graph
from simulator.heap import GRANULARITY, round_up
from simulator.order import Order, categorized_order

__all__ = ["Assignment", "Move", "Program", "added_visits", "compile_program", "reads_before"]

# One output in the compiled program: (tensor id, allocation bytes, forwarded-from id, in-place ids)
PlacedOutput = tuple[int, int, int, tuple[int, ...]]


class Assignment(NamedTuple):
    """A write at `step` to the variable held `held`-th (in `Program.resident_sizes`): it may
    adopt the buffer of tensor `value` (-1: the write is in place), and a read of the variable
    made before it is last consumed at step `release` (-1: none is pending)."""

    step: int
    held: int
    value: int
    release: int


class Move(NamedTuple):
    """An `Assignment` as the walk placed it: `buffer` is the value's buffer (-1: none)."""

    step: int
    held: int
    buffer: int
    release: int


@dataclass(frozen=True)
class Program:
    """A graph and its order lowered to integer arrays: each simulation is then one tight loop."""

    order: Order
    names: list[str]
    #: per step, the outputs it places; one more, empty, for the end of the step
    steps: list[list[PlacedOutput]]
    last_use: list[int]
    alloc_bytes: list[int]
    persistent_bytes: int
    levels: list[int]
    #: the steps a walk has work at, in order: those that place outputs, free a buffer (every
    #: free happens at the last use of an output placed or forwarded) or have swap events, and
    #: the end of the step. Most ops of a training graph (constants, variable reads, shape ops)
    #: have none.
    visits: list[int]
    #: the bytes of each resident tensor (none is added by a plan), as an allocator holds them
    resident_sizes: tuple[int, ...]
    tid: dict[str, int] = field(default_factory=dict)
    #: per step, host copies made (tensor id, bytes) and host copies released
    host_out: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    host_free: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    #: per step, the swap-in copies its op triggers: they start once the op has finished, so
    #: they are allocated after the inputs it was the last to read are freed
    swap_ins: dict[int, list[PlacedOutput]] = field(default_factory=dict)
    #: the variable writes, in step order: TensorFlow moves variables between buffers there
    assignments: tuple[Assignment, ...] = ()
    #: per step, the buffers of the ops a plan re-runs after the op at that step, in order:
    #: (buffer id, bytes, +1 placed / -1 freed), after the step's frees and swap-ins; a
    #: buffer placed there and never freed there lives to its last use
    recomputes: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    #: the buffers that are many of TensorFlow's, not one: a loop's lists and scratch
    #: (`simulator.allocator`)
    lists: frozenset[int] = frozenset()


def added_visits(visits: list[int], steps: Iterable[int]) -> list[int]:
    """`visits` (sorted) with `steps` added: where a swap plan adds frees or swap events."""
    new = set(steps).difference(visits)
    return sorted(visits + list(new)) if new else visits


def _last_uses(graph: Graph, order: Order, tid: dict[str, int]) -> list[int]:
    """Position of each tensor's last consumer; step outputs live to the end of the step."""
    n = len(order.ops)
    last = [0] * len(tid)
    for name, t in graph.tensors.items():
        uses = [order.position[c] for c in t.consumers]
        last[tid[name]] = max(uses) if uses else order.position[t.producer]
    for name in graph.outputs:
        last[tid[name]] = n
    return last


def compile_program(
    graph: Graph,
    order: Order | None = None,
    *,
    granularity: int = GRANULARITY,
    like: Program | None = None,
    resized: Program | None = None,
) -> Program:
    """Lower `graph` in `order` (the categorized order by default) for `simulate_memory`.
    `like` is the program of a graph with the same ops and tensors in another order (its
    control edges may differ, as order edges add): what each op places is taken over, in its
    numbering (a kernel's scratch buffer keeps its id), and only what follows from the
    positions is lowered again. `resized` is the program of this graph at other sizes in
    the same order: only the sizes are taken anew, where the same tensors and kernel
    scratch buffers have bytes (else the graph is lowered in full)."""
    order = order or categorized_order(graph)
    if like is not None and _same_scratch(graph, like, granularity):
        return _reordered(graph, order, like)
    if resized is not None:
        sized = _resized(graph, order, resized, granularity)
        if sized is not None:
            return sized
    names = list(graph.tensors)
    tid = {name: i for i, name in enumerate(names)}
    tensors = [graph.tensors[n] for n in names]
    alloc = [round_up(t.nbytes, granularity) for t in tensors]
    last = _last_uses(graph, order, tid)
    unwalked = [not t.kind.on_device for t in tensors]  # no device buffer of its own to walk
    steps: list[list[PlacedOutput]] = []
    for p, op_name in enumerate(order.ops):
        op = graph.ops[op_name]
        ins = [tid[i] for i in op.inputs]
        outs: list[PlacedOutput] = []
        for j, out in enumerate(op.outputs):
            fwd = ins[op.forwards[j]] if j in op.forwards else -1
            cands = tuple(ins[i] for i in op.takes_over(j))
            if (fwd >= 0 and unwalked[fwd]) or (fwd < 0 and not alloc[tid[out]]):
                unwalked[tid[out]] = True  # an alias of a buffer held across the step, or empty
            if unwalked[tid[out]]:
                continue  # resident, no bytes, or an alias of either: nothing to walk
            outs.append((tid[out], alloc[tid[out]], fwd, cands))
        if op.scratch:
            # the kernel's temporary memory: a buffer that dies at the step that made it
            outs.append((len(names), round_up(op.scratch, granularity), -1, ()))
            names.append(f"{op_name}:scratch")
            alloc.append(outs[-1][1])
            last.append(p)
        steps.append(outs)
    steps.append([])  # the end of the step: its outputs are freed
    return _program(graph, order, names, steps, last, alloc, tid)


def _program(
    graph: Graph,
    order: Order,
    names: list[str],
    steps: list[list[PlacedOutput]],
    last: list[int],
    alloc: list[int],
    tid: dict[str, int],
) -> Program:
    """The program of `steps` (what each step places) and what follows from their order.
    The variables held across the step are its resident tensors with bytes, in tensor order
    (`tid`; a kernel's scratch is never held)."""
    held_names, held = _held(graph, tid, alloc)
    levels = [order.level[o] for o in order.ops]
    placing = {p for p, outs in enumerate(steps) if outs}
    freeing = {last[t] for outs in steps for t, _, _, _ in outs}
    visits = sorted(placing | freeing | {len(order.ops)})
    assignments = _assignments(graph, order, tid, last, held_names)
    lists = _lists(graph, names, tid)
    return Program(
        order, names, steps, last, alloc, sum(held), levels, visits, held, tid,
        assignments=assignments, lists=lists,
    )  # fmt: skip


def _lists(graph: Graph, names: list[str], tid: dict[str, int]) -> frozenset[int]:
    """The buffers that are many of TensorFlow's: a loop's lists, and the scratch of an op
    that runs a function (a loop's iterations' buffers, a branch's)."""
    lists = {tid[n] for n, t in graph.tensors.items() if t.dtype == "variant" and n in tid}
    scratch = range(len(tid), len(names))  # named `op:scratch`
    lists.update(i for i in scratch if graph.ops[names[i][: -len(":scratch")]].calls)
    return frozenset(lists)


def _same_scratch(graph: Graph, like: Program, granularity: int) -> bool:
    """Whether `graph`'s kernels hold the scratch they hold in `like` (a loop run serially
    holds less)."""
    held = {n[: -len(":scratch")]: like.alloc_bytes[i] for i, n in enumerate(like.names)
            if i >= len(like.tid)}  # fmt: skip
    with_scratch = [(n, op.scratch) for n, op in graph.ops.items() if op.scratch]
    return len(with_scratch) == len(held) and all(
        held.get(n) == round_up(b, granularity) for n, b in with_scratch
    )


def _reordered(graph: Graph, order: Order, like: Program) -> Program:
    """`like`'s program with its steps in `order` (see `compile_program`)."""
    placed = dict(zip(like.order.ops, like.steps))
    steps = [placed[name] for name in order.ops]
    steps.append([])
    last = _last_uses(graph, order, like.tid) + like.last_use[len(like.tid) :]
    for p, outs in enumerate(steps):
        for t, _, _, _ in outs:
            if t >= len(like.tid):  # a kernel's scratch buffer: it dies at its own step
                last[t] = p
    return _program(graph, order, like.names, steps, last, like.alloc_bytes, like.tid)


def _resized(graph: Graph, order: Order, other: Program, granularity: int) -> Program | None:
    """`other` (this graph's program at other sizes, in `order`) with this graph's sizes;
    None where a tensor or a kernel's scratch has bytes in one and none in the other (what
    is walked would differ), or the ops, tensors or order differ."""
    if other.order.ops != order.ops or len(other.tid) != len(graph.tensors):
        return None
    tid = other.tid
    alloc = [0] * len(other.alloc_bytes)
    for name, t in graph.tensors.items():
        i = tid.get(name)
        if i is None:
            return None
        alloc[i] = round_up(t.nbytes, granularity)
    for i in range(len(tid), len(alloc)):  # kernels' scratch: named `op:scratch`
        alloc[i] = round_up(graph.ops[other.names[i][: -len(":scratch")]].scratch, granularity)
    scratch = sum(1 for op in graph.ops.values() if op.scratch)
    if scratch != len(alloc) - len(tid) or any(
        bool(a) != bool(b) for a, b in zip(alloc, other.alloc_bytes)
    ):
        return None
    steps = [[(t, alloc[t], f, c) for t, _, f, c in outs] for outs in other.steps]
    held = _held(graph, tid, alloc)[1]
    return replace(
        other, steps=steps, alloc_bytes=alloc, persistent_bytes=sum(held), resident_sizes=held
    )


def _held(graph: Graph, tid: dict[str, int], alloc: list[int]) -> tuple[list[str], tuple[int, ...]]:
    """The resident tensors with bytes, in tensor order (the variables held across the step),
    and their bytes."""
    names = [n for n, i in tid.items() if alloc[i] and graph.tensors[n].kind.resident]
    return names, tuple(alloc[tid[n]] for n in names)


def _assignments(
    graph: Graph, order: Order, tid: dict[str, int], last: list[int], held_names: list[str]
) -> tuple[Assignment, ...]:
    """The writes of held variables (`Op.assigns`; `held_names`: the held tensors in holding
    order) in step order, each with the step at which the reads of the variable made before
    it are last consumed."""
    held = {name: i for i, name in enumerate(held_names)}
    out = []
    for p, name in enumerate(order.ops):
        op = graph.ops[name]
        if not op.assigns:
            continue
        variable = graph.buffer_root(op.inputs[0])
        if variable not in held:
            continue
        release = max((last[tid[a]] for a in reads_before(graph, order, name)), default=-1)
        value = tid[op.inputs[1]] if op.assigns == "adopt" else -1
        out.append(Assignment(p, held[variable], value, release if release > p else -1))
    return tuple(out)


def reads_before(graph: Graph, order: Order, write: str) -> list[str]:
    """The values read, before op `write` in `order`, from the variable it writes (`Op.assigns`,
    input 0): TensorFlow copies the variable at the write while one is still to be read."""
    p, pos = order.position[write], order.position
    variable = graph.buffer_root(graph.ops[write].inputs[0])
    return [a for a in aliases(graph, variable) if pos[graph.tensors[a].producer] < p]


def aliases(graph: Graph, name: str) -> list[str]:
    """The tensors that share tensor `name`'s buffer through forwarding ops."""
    out, todo = [], [name]
    while todo:
        t = todo.pop()
        for consumer in dict.fromkeys(graph.tensors[t].consumers):
            op = graph.ops[consumer]
            for j, i in op.forwards.items():
                if op.inputs[i] == t:
                    out.append(op.outputs[j])
                    todo.append(op.outputs[j])
    return out
