"""Loops of a captured step: how many times each runs, and the bytes its lists hold.

A `tf.while_loop` (and a Keras recurrent layer, which is one) is a functional `While` op whose
body runs once per iteration. What its gradient needs from each iteration, the body pushes onto
a `TensorList` (TensorFlow's accumulators), and the gradient's loop pops them back in reverse.
A list is one `variant` scalar in the graph, but it holds its elements' buffers; so capture
gives each list the bytes of the elements it holds: its producer's, plus, for a loop's output,
the iterations times what one iteration pushes (less what it pops). The trip count comes from
the loop's control values (its counter and the values its condition reads), evaluated from the
constants of the step before the loop runs; a loop whose trip count depends on the step's data
is refused with what to supply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewriter.loopbytes import (
    PASS,
    Change,
    Held,
    LoopError,
    ahead_bytes,
    delta,
    element,
    owners,
    passed,
    sharing,
    tensor_bytes,
)
from rewriter.loopvalues import Evaluator, Unknown, closure, reads
from simulator.graph import Tensor, TensorKind
from simulator.opsemantics import LOOP_TYPES

__all__ = ["Loop", "LoopError", "Loops"]

#: a guard against a loop that runs away in the trip-count evaluation (Python steps it)
MAX_TRIPS = 1_000_000

_FIXED = (
    "its trip count must follow from the step's constants: give fixed shapes (a sequence "
    "length in the input's TensorSpec) and a loop bound that does not depend on the data"
)


@dataclass(frozen=True)
class Loop:
    """One loop op as capture sees it: its trip count, the bytes of each output list, the
    outputs that are their input unchanged, and the working set of one iteration."""

    trips: int
    list_bytes: dict[int, int]
    passed: dict[int, int]
    body: Any  # the body's FuncGraph
    #: bytes one iteration holds for the iterations running ahead of it (`ahead_bytes`),
    #: how many may run at once (`parallel_iterations`), and the bytes the loop's lists gain
    #: and lose in one iteration
    ahead: int = 0
    parallel: int = 1
    grow: int = 0
    shrink: int = 0
    body_scratch: int = 0

    @property
    def scratch(self) -> int:
        """Bytes the loop holds while it runs beyond its inputs and its outputs' final size:
        one iteration's working set, and, at the worst iteration k of the chain that lags,
        the values waiting for it from the iterations running ahead (as many as `parallel`
        allows and are left), with the lists' pushes made at k and their pops as far as the
        chain running ahead has got."""
        last = self.trips

        def held(k: int) -> int:
            ahead = min(self.parallel - 1, last - k)
            return ahead * self.ahead - (k + ahead) * self.shrink + k * self.grow - last * self.grow

        lag = min(self.parallel - 1, last)
        return self.body_scratch + max(0, *(held(k) for k in {0, last - lag, last}))


class Loops:
    """The loops and lists of one function graph, visited in topological order."""

    def __init__(self, graph: Any, root: Any = None) -> None:
        self.graph = graph
        self.root = root if root is not None else graph
        #: variant tensor -> bytes of the elements it holds (a list's; a branch's optional's,
        #: `capture._branch_scratch`)
        self.list_bytes: dict[str, int] = {}
        self.full: set[str] = set()  # lists whose every slot holds an element
        self.elements: dict[str, int] = {}  # list -> elements it holds
        #: list -> (dtype, shape) of its elements, where all have one static shape
        self.element: dict[str, tuple[str, tuple[int, ...]]] = {}
        #: lists whose elements another list holds too (`loopbytes.sharing`)
        self.shared: set[str] = set()
        self.finals: dict[str, Any] = {}  # loop output -> its final value (control values)
        self.loops: dict[str, Loop] = {}

    def function(self, name: str) -> Any:
        """The FuncGraph of function `name` of this step."""
        for g in (self.graph, self.root):
            fn = getattr(g, "_functions", {}).get(name)
            if fn is not None and getattr(fn, "graph", None) is not None:
                return fn.graph
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        for g in (self.graph, self.root):
            for fdef in g.as_graph_def().library.function:
                if fdef.signature.name == name:
                    return function_def_to_graph(fdef)
        raise LoopError(f"function {name!r} of the step is not in its library")

    def visit(self, op: Any) -> Loop | None:
        """Record the list bytes of `op`'s outputs; for a loop, what it is."""
        if op.type in LOOP_TYPES:
            loop = self._loop(op)
            self.loops[op.name] = loop
            for i, t in enumerate(op.outputs):
                if t.dtype.name == "variant":
                    self.list_bytes[t.name] = loop.list_bytes.get(i, 0)
                    self._element(t, element(loop.body.outputs[i]), op.inputs[i].name)
            return loop
        for t in op.outputs:
            if t.dtype.name == "variant":
                self.list_bytes[t.name] = self._list_op(op, t)
        return None

    def list_tensor(self, t: Any) -> Tensor:
        """The IR tensor of list `t`, holding its elements' buffers: shaped (elements, *their
        shape) where they have one static shape and no other list holds them, and then with
        their dtype (which makes it a swap candidate)."""
        nbytes = self.list_bytes[t.name]
        element = self.element.get(t.name)
        if element is None or t.name in self.shared:
            return Tensor(t.name, "variant", (), nbytes, t.op.name, TensorKind.TRANSIENT)
        dtype, shape = element
        count = (self.elements.get(t.name, 0),)
        return Tensor(
            t.name, "variant", count + shape, nbytes, t.op.name, TensorKind.TRANSIENT,
            element_dtype=dtype,
        )  # fmt: skip

    def _list_op(self, op: Any, t: Any) -> int:
        """Bytes of the list `t` made by an op outside a loop body."""
        kind = op.type
        if kind in ("EmptyTensorList", "TensorListReserve"):
            return 0
        if kind == "TensorListFromTensor":
            self.full.add(t.name)
            shape = op.inputs[0].shape
            self.elements[t.name] = int(shape[0]) if shape.rank else 0
            if shape.is_fully_defined() and shape.rank:
                dims = tuple(int(d) for d in shape.as_list()[1:])
                self.element[t.name] = (op.inputs[0].dtype.name, dims)
            return tensor_bytes(op.inputs[0])
        if kind in ("ZerosLike", "OnesLike") or kind in PASS:
            src = op.inputs[t.value_index if kind == "IdentityN" else 0].name
            if src in self.full:
                self.full.add(t.name)
            self.elements[t.name] = self.elements.get(src, 0)
            self._element(t, None, src)
            return self.list_bytes.get(src, 0)
        return 0

    def _element(self, t: Any, pushed: tuple[str, tuple[int, ...]] | None, src: str) -> None:
        """Record the elements of list `t`: those `pushed` into list `src` to make it, which
        must be like those `src` holds already (if it holds any)."""
        before = self.element.get(src) if self.elements.get(src) else None
        kinds = {k for k in (before, pushed) if k is not None}
        if len(kinds) == 1:
            self.element[t.name] = kinds.pop()

    # -- trip count ------------------------------------------------------------------------

    def _loop(self, op: Any) -> Loop:
        cond = self.function(op.get_attr("cond").name)
        body = self.function(op.get_attr("body").name)
        try:
            control = closure(reads(cond, cond.outputs), body)
            trips, finals = self._trips(op, cond, body, control)
        except Unknown as err:
            raise LoopError(
                f"loop {op.name!r} ({op.type}): its condition depends on op "
                f"{err.op.name!r} ({err.op.type}), which is not a constant of the step; {_FIXED}"
            ) from None
        for i, value in finals.items():
            self.finals[op.outputs[i].name] = value
        unchanged = passed(body)
        readers = [[c.type for c in t.consumers()] for t in op.outputs]
        counted = owners(body, {i for i, r in enumerate(readers) if set(r) & LOOP_TYPES})
        lists, deltas = {}, []
        for i, t in enumerate(op.inputs):
            if t.dtype.name == "variant":
                change = self._per_trip(op, body, i, counted)
                deltas.append(change[0])
                lists[i] = max(0, self.list_bytes.get(t.name, 0) + trips * change[0])
                self.elements[op.outputs[i].name] = max(
                    0, self.elements.get(t.name, 0) + trips * change[1]
                )
        dying = {i for i, r in enumerate(readers) if set(r) <= {"TensorListStack"}}
        for i in sharing(body, counted, dying):
            self.shared |= {op.inputs[i].name, op.outputs[i].name}
        attrs = op.node_def.attr
        parallel = op.get_attr("parallel_iterations") if "parallel_iterations" in attrs else 1
        ahead = ahead_bytes(body, control | set(unchanged))
        grow = sum(d for d in deltas if d > 0)
        shrink = -sum(d for d in deltas if d < 0)
        return Loop(trips, lists, unchanged, body, ahead, max(1, parallel), grow, shrink)

    def _trips(
        self, op: Any, cond: Any, body: Any, control: set[int]
    ) -> tuple[int, dict[int, Any]]:
        """(iterations, final value of each control variable) of loop `op`, whose condition
        reads the loop variables `control` (through the body's updates of them)."""
        values = {i: self.value(op.inputs[i]) for i in sorted(control)}
        values.update(self._counters(op, body, control))
        outer = Evaluator(cond, self.finals)
        inner = Evaluator(body, self.finals)
        trips = 0
        while bool(outer.run(cond.outputs[0], cond.inputs, values)):
            values = {i: inner.run(body.outputs[i], body.inputs, values) for i in values}
            trips += 1
            if trips > MAX_TRIPS:
                raise LoopError(
                    f"loop {op.name!r} ({op.type}) runs more than {MAX_TRIPS} times; {_FIXED}"
                )
        return trips, values

    def _counters(self, op: Any, body: Any, control: set[int]) -> dict[int, Any]:
        """Initial values of the loop's other scalar integers that follow from constants (its
        counter, whose final value is the trip count of the loop of its gradient)."""
        out = {}
        for i, t in enumerate(body.inputs):
            if i in control or t.shape.rank != 0 or not t.dtype.is_integer:
                continue
            if closure({i}, body) - {i} - control:
                continue
            try:
                out[i] = self.value(op.inputs[i])
            except Unknown:
                continue
        return out

    def value(self, t: Any) -> Any:
        """The value of a scalar control tensor of this graph, from its constants."""
        return Evaluator(self.graph, self.finals).run(t, [], {})

    # -- list growth per iteration ----------------------------------------------------------

    def _per_trip(self, op: Any, body: Any, index: int, counted: dict[str, int]) -> Change:
        """(bytes, elements) list `index` of loop `op` gains (negative: loses) in one
        iteration (`counted`: which list counts each buffer several hold, `owners`)."""
        t = op.inputs[index]
        count = self.elements.get(t.name, 0)
        element = self.list_bytes.get(t.name, 0) // count if count else None
        held = Held(t.name in self.full, element, index, counted)
        change = delta(body.outputs[index], body.inputs[index], body, held, {})
        if change is None:
            raise LoopError(
                f"loop {op.name!r}: list {index} of its body comes from another loop "
                "variable; lists moved between loop variables are not simulated yet"
            )
        return change
