"""The control values of a loop (its counter, the bounds its condition compares), evaluated
with numpy from the step's constants: what gives a loop its trip count (`rewriter.loops`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Evaluator", "Unknown", "closure", "reads"]

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Less": np.less,
    "LessEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterEqual": np.greater_equal,
    "Equal": np.equal,
    "NotEqual": np.not_equal,
    "LogicalAnd": np.logical_and,
    "LogicalOr": np.logical_or,
    "Add": np.add,
    "AddV2": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "FloorDiv": np.floor_divide,
    "FloorMod": np.mod,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "Identity": lambda x: x,
    "StopGradient": lambda x: x,
    "Snapshot": lambda x: x,
    "LogicalNot": np.logical_not,
    "Neg": np.negative,
}
_REDUCE: dict[str, Callable[..., Any]] = {
    "Max": np.max,
    "Min": np.min,
    "Sum": np.sum,
    "Prod": np.prod,
}
#: ops whose output is a buffer the loop already holds (an element of a list, a variable)


class Unknown(Exception):
    """A control value that does not follow from constants (carries the op that stops it)."""

    def __init__(self, op: Any) -> None:
        super().__init__(op.name)
        self.op = op


class Evaluator:
    """Evaluates scalar control values of one function graph with numpy (`finals`: the
    values the graph's loops ended with, by their output tensors)."""

    def __init__(self, graph: Any, finals: dict[str, Any]) -> None:
        self.finals = finals  # the values loops of the graph ended with
        self.graph = graph
        captures = zip(
            getattr(graph, "internal_captures", ()), getattr(graph, "external_captures", ())
        )
        self.captured = {inner.name: outer for inner, outer in captures}

    def run(self, t: Any, inputs: list[Any], values: dict[int, Any]) -> Any:
        index = {x.name: i for i, x in enumerate(inputs)}
        memo: dict[str, Any] = {}
        return self._value(t, index, values, memo)

    def _value(
        self, t: Any, index: dict[str, int], values: dict[int, Any], memo: dict[str, Any]
    ) -> Any:
        if t.name in memo:
            return memo[t.name]
        op = t.op
        if t.name in index and index[t.name] in values:
            out = values[index[t.name]]
        elif t.name in self.captured:
            out = _captured_value(self.captured[t.name], op)
        elif t.name in self.finals:
            out = self.finals[t.name]
        else:
            args = [self._value(x, index, values, memo) for x in op.inputs]
            out = _apply(op, t, args)
        memo[t.name] = out
        return out


def _captured_value(outer: Any, op: Any) -> Any:
    """The value of a tensor the function captured from the caller: known for an eager
    constant, unknown (a variable, a placeholder) otherwise."""
    dtype = getattr(outer, "dtype", None)
    if dtype is not None and dtype.name not in ("resource", "variant") and hasattr(outer, "numpy"):
        return outer.numpy()
    raise Unknown(op)


def _apply(op: Any, t: Any, args: list[Any]) -> Any:
    """`op`'s output `t` from its input values, for the ops a loop's control uses."""
    from tensorflow.python.framework import tensor_util

    kind = op.type
    if kind == "Const":
        return tensor_util.MakeNdarray(op.get_attr("value"))
    if kind in _BINARY:
        return _BINARY[kind](args[0], args[1])
    if kind in _UNARY:
        return _UNARY[kind](args[0])
    if kind in _REDUCE:
        axes = tuple(np.atleast_1d(args[1]).tolist())
        return _REDUCE[kind](args[0], axis=axes, keepdims=op.get_attr("keep_dims"))
    if kind == "Range":
        return np.arange(args[0], args[1], args[2])
    if kind == "Cast":
        return np.asarray(args[0]).astype(op.get_attr("DstT").as_numpy_dtype)
    if kind in ("Select", "SelectV2"):
        return np.where(args[0], args[1], args[2])
    if kind == "Pack":
        return np.stack(args, axis=op.get_attr("axis"))
    value = tensor_util.constant_value(t)
    if value is None:
        raise Unknown(op)
    return value


def reads(graph: Any, roots: list[Any]) -> set[int]:
    """Indices of `graph`'s inputs that `roots` depend on (through data edges)."""
    index = {x.name: i for i, x in enumerate(graph.inputs)}
    seen: set[str] = set()
    found: set[int] = set()
    stack = list(roots)
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        if t.name in index:
            found.add(index[t.name])
        stack.extend(t.op.inputs)
    return found


def closure(control: set[int], body: Any) -> set[int]:
    """The loop variables the control values depend on, through any number of iterations."""
    todo, done = list(control), set(control)
    while todo:
        i = todo.pop()
        for j in reads(body, [body.outputs[i]]) - done:
            done.add(j)
            todo.append(j)
    return done
