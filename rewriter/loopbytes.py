"""The bytes a loop's lists gain or lose in one iteration, and what the iterations running
ahead of each other hold (`rewriter.loops`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import UserError

__all__ = [
    "PASS",
    "Change",
    "Held",
    "LoopError",
    "ahead_bytes",
    "delta",
    "element",
    "owners",
    "passed",
    "sharing",
    "tensor_bytes",
]

_SHARED = frozenset({"TensorListGetItem", "TensorListPopBack", "ReadVariableOp", "Const"})
PASS = frozenset({"Identity", "Snapshot", "StopGradient", "IdentityN"})


class LoopError(UserError):
    """A loop of the step cannot be sized; the message names it and what to supply."""


def tensor_bytes(t: Any) -> int:
    """Bytes of a statically shaped dense tensor; LoopError naming its op otherwise."""
    if not t.shape.is_fully_defined():
        raise LoopError(
            f"tensor {t.name!r} of op {t.op.name!r} ({t.op.type}) in a loop has shape "
            f"{t.shape}; give fully defined input shapes (tf.TensorSpec with no None)"
        )
    return int(t.shape.num_elements()) * t.dtype.size


def delta(t: Any, start: Any, body: Any, held: Held, memo: dict[str, Any]) -> Change | None:
    """(bytes, elements) list `t` holds more than list `start`, a loop variable, after one
    iteration of `body`: None when `t` is not made from `start`. A sum of lists (AddN, the
    gradient of a list read twice) holds as many as each of them."""
    if t.name in memo:
        return memo[t.name]
    kind = t.op.type
    ins = t.op.inputs
    out: Change | None
    if t is start:
        out = (0, 0)
    elif kind == "Placeholder":
        out = None
    elif kind in PASS or kind in ("ZerosLike", "OnesLike"):
        out = delta(ins[t.value_index if kind == "IdentityN" else 0], start, body, held, memo)
    elif kind in _LIST_CHANGE:
        out = delta(ins[0], start, body, held, memo)
        if out is not None:
            change = _LIST_CHANGE[kind](t.op, body, held)
            out = (out[0] + change[0], out[1] + change[1])
    elif kind in ("AddN", "Add", "AddV2"):
        found = (delta(x, start, body, held, memo) for x in ins if x.dtype.name == "variant")
        out = next((d for d in found if d is not None), None)
    else:
        raise LoopError(
            f"op {t.op.name!r} ({kind}) in the body of a loop changes a list in a way that is "
            "not simulated yet (push, pop, set and sums are)"
        )
    memo[t.name] = out
    return out


#: (bytes, elements)
Change = tuple[int, int]


@dataclass(frozen=True)
class Held:
    """What a list holds when a loop starts: whether every slot has an element, and the
    bytes an element it holds has on average (what popping one frees); which loop variable
    it is, and which list counts each buffer several lists hold (`owners`)."""

    full: bool
    element: int | None
    index: int = -1
    owners: dict[str, int] = field(default_factory=dict)


def _pop(op: Any, body: Any, held: Held) -> Change:
    freed = tensor_bytes(op.outputs[1]) if held.element is None else held.element
    return -freed, -1


#: what one list op adds to its input list's bytes and elements
_LIST_CHANGE: dict[str, Callable[[Any, Any, Held], Change]] = {
    "TensorListPushBack": lambda op, body, held: (_new_bytes(op.inputs[1], body, held), 1),
    "TensorListSetItem": lambda op, body, held: (
        (0, 0) if held.full else (_new_bytes(op.inputs[2], body, held), 1)
    ),
    "TensorListPopBack": _pop,
}


def element(t: Any) -> tuple[str, tuple[int, ...]] | None:
    """(dtype, shape) of what the body output `t`, a list, has pushed or set in it (through
    the ops that pass a list on), if that has a static shape; None otherwise."""
    while True:
        kind = t.op.type
        if kind in ("TensorListPushBack", "TensorListSetItem"):
            item = t.op.inputs[1 if kind == "TensorListPushBack" else 2]
            if not item.shape.is_fully_defined():
                return None
            return item.dtype.name, tuple(int(d) for d in item.shape.as_list())
        if kind not in PASS and kind not in _LIST_CHANGE:
            return None
        t = t.op.inputs[0]


def passed(body: Any) -> dict[int, int]:
    """Outputs of the loop that are its input unchanged (a handle, an invariant value)."""
    index = {x.name: i for i, x in enumerate(body.inputs)}
    out = {}
    for i, t in enumerate(body.outputs):
        while t.op.type in PASS and t.name not in index:
            t = t.op.inputs[0]
        if index.get(t.name) == i:
            out[i] = i
    return out


def _new_bytes(t: Any, body: Any, held: Held) -> int:
    """Bytes a list element `t` pushed in `body` adds: none when its buffer outlives the
    iteration anyway (a variable's, a constant's, a value the loop does not change) or
    another list counts it (`owners`: the state of a recurrence is pushed as the output of
    one step and as the input of the next)."""
    unchanged = {body.inputs[i].name for i in passed(body)}
    captured = {x.name for x in getattr(body, "internal_captures", ())}
    index = {x.name: i for i, x in enumerate(body.inputs)}
    owner = held.owners.get(_buffer(t, body, index).name, held.index)
    if owner != held.index:
        return 0
    while True:
        if t.name in unchanged or t.name in captured or t.op.type in _SHARED:
            return 0
        if t.op.type not in PASS:
            return tensor_bytes(t)
        t = t.op.inputs[0]


def _buffer(item: Any, body: Any, index: dict[str, int]) -> Any:
    """The tensor whose buffer a list element `item` of `body` is: a loop variable's value is
    the one the body made for it in the iteration before."""
    root = _root(item)
    if root.name in index:
        root = _root(body.outputs[index[root.name]])
    return root


def _root(t: Any) -> Any:
    """`t` through the ops that pass their input on."""
    while t.op.type in PASS:
        t = t.op.inputs[0]
    return t


def owners(body: Any, lasting: set[int]) -> dict[str, int]:
    """For each buffer several lists of `body` hold (by the tensor that made it), the loop
    variable of the list that counts its bytes: one the step keeps (`lasting`: read by
    another loop, the gradient's), which outlives the others (a layer's output sequence,
    stacked right after the loop)."""
    out = {}
    for key, held in _holders(body).items():
        if len(held) > 1:
            out[key] = min(held & lasting or held)
    return out


def sharing(body: Any, counted: dict[str, int], dying: set[int]) -> set[int]:
    """The lists of `body` (by loop variable) whose elements another list holds too: the
    previous state of a recurrence pushed where the state itself was pushed or set, an
    element read from one list pushed onto another. Copying one of them to the host frees
    nothing while the other holds the same buffers; but the list that counts them
    (`counted`, see `owners`) is free to go where the others are `dying` (only stacked)."""
    index = {x.name: i for i, x in enumerate(body.inputs)}
    out: set[int] = set()
    for key, held in _holders(body).items():
        if len(held) > 1:
            others = held - {counted.get(key, -1)}
            out |= held if others - dying else others
    for i, item in _all_items(body, index):
        root = _buffer(item, body, index)
        if root.op.type in _ELEMENT_READS:
            source = _root(root.op.inputs[0])
            out |= {i, index[source.name]} if source.name in index else {i}
    return out


def _all_items(body: Any, index: dict[str, int]) -> list[tuple[int, Any]]:
    """(loop variable, element) of everything `body` pushes or sets into its lists."""
    return [
        (i, item)
        for i, t in enumerate(body.outputs)
        if t.dtype.name == "variant"
        for item in _items(t, index)
    ]


def _holders(body: Any) -> dict[str, set[int]]:
    """The lists (by loop variable) holding each buffer `body` puts into lists."""
    index = {x.name: i for i, x in enumerate(body.inputs)}
    holders: dict[str, set[int]] = {}
    for i, item in _all_items(body, index):
        holders.setdefault(_buffer(item, body, index).name, set()).add(i)
    return holders


_ELEMENT_READS = ("TensorListGetItem", "TensorListPopBack")


def _items(t: Any, index: dict[str, int]) -> list[Any]:
    """What is pushed or set into the list `t` of a body (through the ops that pass a list
    on, change it, or sum lists) since the loop variable it comes from."""
    out, todo, seen = [], [t], set()
    while todo:
        t = todo.pop()
        if t.name in seen or t.name in index:
            continue
        seen.add(t.name)
        kind = t.op.type
        if kind == "TensorListPushBack":
            out.append(t.op.inputs[1])
        elif kind == "TensorListSetItem":
            out.append(t.op.inputs[2])
        todo.extend(x for x in t.op.inputs if x.dtype.name == "variant")
    return out


def ahead_bytes(body: Any, fast: set[int]) -> int:
    """Bytes one iteration of `body` holds for the iterations running ahead of it.

    TensorFlow's executor runs up to `parallel_iterations` iterations at once: an op of a
    later iteration runs as soon as its inputs are there. So a chain of values the loop
    carries runs ahead of the chains that depend on it, and each value passed from one chain
    to a later one waits for it: an input's product with a weight for the recurrence of a
    recurrent cell (the input is there at once), the weight gradient of one step for the
    loop's sum of them (the recurrence of the gradient loop runs ahead of the sum)."""
    index = {t.name: i for i, t in enumerate(body.inputs)}
    carried = {
        i for i, t in enumerate(body.inputs) if i not in fast and t.dtype.name not in _HANDLES
    }
    deps: dict[str, frozenset[int]] = {}
    for op in body.get_operations():  # in creation order: inputs first
        found: set[int] = set()
        for t in op.inputs:
            i = index.get(t.name)
            found |= {i} if i in carried else deps.get(t.op.name, frozenset())
        deps[op.name] = frozenset(found)
    feeds = {j: deps[body.outputs[j].op.name] for j in carried}
    chain = {op: _chain(d, feeds) for op, d in deps.items()}
    total = 0
    for op in body.get_operations():
        if op.type in _SHARED or op.type == "Placeholder":
            continue
        for t in op.outputs:
            waits = any(chain[c.name] != chain[op.name] for c in t.consumers())
            if waits and t.dtype.name not in _HANDLES and t.shape.is_fully_defined():
                total += tensor_bytes(t)
    return total


_HANDLES = ("variant", "resource")


def _chain(start: frozenset[int], feeds: dict[int, frozenset[int]]) -> frozenset[int]:
    """The carried variables whose earlier values `start` depend on, over any iterations."""
    out, todo = set(start), list(start)
    while todo:
        for j in feeds.get(todo.pop(), frozenset()) - out:
            out.add(j)
            todo.append(j)
    return frozenset(out)
