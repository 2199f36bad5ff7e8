"""A graph for any batch size from two captures: tensor sizes are affine in the batch size.

Capturing a step anew for every batch size a search probes is too slow (ResNet-50 takes about
15 s a trace). A training step's graph has the same ops and edges at every batch size from 2 on,
and each tensor's shape dimensions, and so its bytes, are affine in the batch size (docs/method.md:
ResNet-50 at 2, 3 and 7). So two captures at batches `a` and `b` fix every size exactly, and
`BatchFamily.at(n)` builds the graph at batch `n` without TensorFlow. `fit` refuses two graphs
that differ in anything but sizes, or sizes that are not whole steps per sample; batch 1 is
refused because its gradient graph differs (some reduction indices are folded there).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

from simulator.bounds import WorkingSets
from simulator.errors import UserError
from simulator.graph import Graph, Op, Tensor

__all__ = ["BatchFamily", "ScalingError", "affine_costs"]

MIN_BATCH = 2

#: the name TensorFlow gives a value a nested function captured without a name: a scope and a
#: process-wide counter (`ops.uid()`), different in every capture
_UID_NAME = re.compile(r"(.*/)?\d+")


class ScalingError(UserError):
    """Two captures do not form an affine family, or a batch size is outside it."""


@dataclass(frozen=True)
class _Slope:
    nbytes: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BatchFamily:
    """The graphs of one step at every batch size >= 2, from captures at batches `a` and `b`."""

    base: Graph
    a: int
    b: int
    slopes: dict[str, _Slope]
    scratch: dict[str, int]

    @classmethod
    def fit(cls, graph_a: Graph, a: int, graph_b: Graph, b: int) -> BatchFamily:
        """The family through two captures; ScalingError naming what differs if there is none."""
        if min(a, b) < MIN_BATCH or a == b:
            raise ScalingError(f"need two different batch sizes of at least 2, got {a} and {b}")
        graph_b = _renamed(graph_b, _uid_names(graph_a, graph_b))
        _same_structure(graph_a, graph_b)
        for name, op in graph_a.ops.items():
            if op.ahead or graph_b.ops[name].ahead:
                raise ScalingError(
                    f"loop {name!r} holds values for the iterations it runs ahead, the most "
                    "over its iterations, which is not affine in the batch size"
                )
        steps = b - a
        slopes = {
            name: _slope(t, graph_b.tensors[name], steps) for name, t in graph_a.tensors.items()
        }
        scratch = {
            name: _per_sample(op.scratch, graph_b.ops[name].scratch, steps, f"scratch of {name}")
            for name, op in graph_a.ops.items()
            if op.scratch or graph_b.ops[name].scratch
        }
        return cls(graph_a, a, b, slopes, scratch)

    def at(self, batch: int) -> Graph:
        """The graph at `batch`: the base graph with every size moved along its slope."""
        if batch < MIN_BATCH:
            raise ScalingError(
                f"batch {batch} is outside the family (batch 1 differs); capture it directly"
            )
        k = batch - self.a
        base = self.base
        graph = Graph(base.name)
        graph.functions = list(base.functions)
        graph.rewritten = base.rewritten
        # the base graph is whole and checked: its tensors and edges are copied as they are (as
        # `Graph.add_op` would link them), with every size moved along its slope; an op whose
        # scratch does not change is shared (no stage changes a graph's ops). A CPU kernel's
        # own scratch (`cpu_scratch`, measured at the captured batch) is not carried over.
        for op in base.ops.values():
            per_sample = self.scratch.get(op.name, 0)
            same = not (k and per_sample) and op.cpu_scratch is None
            scratch = op.scratch + k * per_sample
            graph.ops[op.name] = op if same else replace(op, scratch=scratch, cpu_scratch=None)
        for name, t in base.tensors.items():
            graph.tensors[name] = self._tensor(t, k)
        graph.control_consumers = {n: list(c) for n, c in base.control_consumers.items()}
        graph.mark_outputs(list(base.outputs))
        return graph

    def lower_bound(self, batch: int) -> int:
        """`lower_bound_bytes` of the graph at `batch`, without building it."""
        sets, (sizes, slopes), (scratch, per_sample) = self._bound_terms
        k = batch - self.a
        return sets.bound(sizes + k * slopes, scratch + k * per_sample)

    @functools.cached_property
    def _bound_terms(self) -> tuple[WorkingSets, tuple[Any, Any], tuple[Any, Any]]:
        """The base graph's working sets, and its tensors' and ops' bytes with their slopes."""
        import numpy as np

        sets = WorkingSets.of(self.base)
        slopes = np.array([self.slopes[n].nbytes for n in sets.tensors], np.int64)
        per_sample = np.array([self.scratch.get(n, 0) for n in sets.ops], np.int64)
        return sets, (sets.sizes(self.base), slopes), (sets.scratch(self.base), per_sample)

    def _tensor(self, t: Tensor, k: int) -> Tensor:
        s = self.slopes[t.name]
        shape = tuple(d + k * ds for d, ds in zip(t.shape, s.shape))
        nbytes = t.nbytes + k * s.nbytes
        return Tensor(t.name, t.dtype, shape, nbytes, t.producer, t.kind, list(t.consumers))


def _uid_names(ga: Graph, gb: Graph) -> dict[str, str]:
    """Names of `gb`'s placeholders that differ from `ga`'s at the same place only in
    TensorFlow's counter, mapped to `ga`'s; ScalingError if other ops differ."""
    mapping = {}
    if len(ga.ops) == len(gb.ops):
        for a, b in zip(ga.ops.values(), gb.ops.values()):
            if a.name != b.name and _counter_twins(a, b):
                mapping[b.name] = a.name
    if set(ga.ops) != set(mapping.get(n, n) for n in gb.ops):
        missing = sorted(set(ga.ops) ^ set(gb.ops))[:3]
        raise ScalingError(f"the two captures have different ops (e.g. {missing})")
    return mapping


def _counter_twins(a: Op, b: Op) -> bool:
    ma, mb = _UID_NAME.fullmatch(a.name), _UID_NAME.fullmatch(b.name)
    same_scope = ma is not None and mb is not None and ma.group(1) == mb.group(1)
    return same_scope and a.type == b.type == "Placeholder"


def _renamed(graph: Graph, mapping: dict[str, str]) -> Graph:
    """`graph` with the ops of `mapping` renamed (and their tensors, `op:i`)."""
    if not mapping:
        return graph

    def tensor(name: str) -> str:
        op, _, index = name.rpartition(":")
        return f"{mapping[op]}:{index}" if op in mapping else name

    out = Graph(graph.name)
    out.functions = list(graph.functions)
    out.rewritten = frozenset(mapping.get(n, n) for n in graph.rewritten)
    for op in graph.ops.values():
        new = replace(
            op,
            name=mapping.get(op.name, op.name),
            inputs=[tensor(n) for n in op.inputs],
            outputs=[tensor(n) for n in op.outputs],
            control_inputs=[mapping.get(n, n) for n in op.control_inputs],
        )
        tensors = [replace(graph.tensors[n], name=tensor(n), consumers=[]) for n in op.outputs]
        out.add_op(new, tensors)
    out.mark_outputs([tensor(n) for n in graph.outputs])
    return out


def _same_structure(ga: Graph, gb: Graph) -> None:
    if list(ga.ops) != list(gb.ops):
        raise ScalingError("the two captures have their ops in different orders")
    for name, op in ga.ops.items():
        other = gb.ops[name]
        same = (op.type, op.inputs, op.outputs, op.forwards, op.inplace) == (
            other.type,
            other.inputs,
            other.outputs,
            other.forwards,
            other.inplace,
        ) and set(op.control_inputs) == set(other.control_inputs)
        if not same:
            raise ScalingError(f"op {name!r} differs between the two captures")
    if ga.outputs != gb.outputs:
        raise ScalingError("the two captures return different tensors")


def _slope(ta: Tensor, tb: Tensor, steps: int) -> _Slope:
    if (ta.dtype, ta.kind, len(ta.shape)) != (tb.dtype, tb.kind, len(tb.shape)):
        raise ScalingError(f"tensor {ta.name!r} differs in dtype, kind or rank between captures")
    shape = tuple(
        _per_sample(da, db, steps, f"dimension {i} of {ta.name}")
        for i, (da, db) in enumerate(zip(ta.shape, tb.shape))
    )
    return _Slope(_per_sample(ta.nbytes, tb.nbytes, steps, f"size of {ta.name}"), shape)


def _per_sample(va: int, vb: int, steps: int, what: str) -> int:
    if (vb - va) % steps:
        raise ScalingError(f"the {what} is not affine in the batch size ({va} -> {vb})")
    return (vb - va) // steps


def affine_costs(
    cost_a: dict[str, float], a: int, cost_b: dict[str, float], b: int, batch: int
) -> dict[str, float]:
    """Per-op seconds at `batch`, on the line through the estimates at `a` and `b` (never below
    the smaller of the two: a kernel does not get faster on more data)."""
    out = {}
    for name, ca in cost_a.items():
        cb = cost_b.get(name, ca)
        value = ca + (cb - ca) * (batch - a) / (b - a)
        out[name] = max(value, min(ca, cb))
    return out
