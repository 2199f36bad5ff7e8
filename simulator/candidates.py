"""What plan derivation needs from a graph: the backward pass, the candidates for swapping
(tensors the backward pass reads, made in the forward pass or, with `backward_swaps`, late in
the backward pass), and the ops that may trigger a copy, computed once per graph."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.graph import Graph, TensorKind
from simulator.opsemantics import SHAPE_ONLY, foldable_ops
from simulator.order import Order, categorized_order

__all__ = [
    "BACKWARD_SCOPES",
    "Candidate",
    "PlanContext",
    "backward_ops",
    "can_wait",
    "gradient_flow",
    "in_scopes",
]

#: Name scopes of the backward phase: TF2's GradientTape and TF1-style gradients.
BACKWARD_SCOPES = ("gradient_tape/", "gradients/")
#: a tensor the backward pass makes is a candidate only if no op reads it within this many
#: levels: with a shorter gap its copy back is needed before the copy out has freed it, and both
#: are held (docs/method.md, "Constants")
BACKWARD_GAP = 4
#: op types never used as a swap-in trigger
NOT_TRIGGERS = SHAPE_ONLY | {"Const", "Placeholder", "NoOp", "VarHandleOp"}


def can_wait(graph: Graph, name: str) -> bool:
    """Whether op `name` may trigger a copy or wait for one (a control edge into or out of
    it): not a constant or a shape query, and not an op Grappler rewrites (`Graph.rewritten`:
    a sum or product it regroups, or an op its remapper fuses; both skip nodes a control edge
    touches)."""
    return graph.ops[name].type not in NOT_TRIGGERS and name not in graph.rewritten


@dataclass(frozen=True)
class Candidate:
    tensor: str
    producer: str
    level: int
    readers: tuple[tuple[int, str], ...]  # (level, op) of backward readers, by level
    made_in_backward: bool = False  # made by the backward pass: every reader is rerouted


@dataclass
class PlanContext:
    """What plan derivation needs from a graph, computed once and reused for every plan."""

    graph: Graph
    order: Order
    backward: frozenset[str]
    candidates: list[Candidate]
    by_level: list[list[str]]
    _preds: dict[str, list[str]] = field(default_factory=dict)
    #: per tensor, the position of its last reader in `order` (its producer's when unread)
    last_read: dict[str, int] = field(default_factory=dict)
    unswappable: frozenset[str] = frozenset()
    #: the ops the gradients flow through (`gradient_flow`): the backward pass's own start
    flow: frozenset[str] = frozenset()
    #: ops that may neither wait nor be waited for (`Graph.rewritten`)
    regrouped: frozenset[str] = frozenset()
    #: levels that hold such ops and no other possible trigger (not counted as distance)
    hidden: frozenset[int] = frozenset()
    #: the backward pass's ops and those some op of it needs (through data edges): only
    #: waiting for one of them holds the backward pass back (the loss itself gates nothing,
    #: as its gradient does not read it)
    gates: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls,
        graph: Graph,
        order: Order | None = None,
        backward_scopes: tuple[str, ...] = BACKWARD_SCOPES,
        like: PlanContext | None = None,
    ) -> PlanContext:
        """The context of `graph` in `order`. `like` is the context of a graph with the same
        ops and data edges (its control edges may differ, as order edges add): its gradient
        flow, backward pass and folded ops, which follow data edges alone, are taken over."""
        order = order or categorized_order(graph)
        if like is not None:
            flow, backward = like.flow, like.backward
        else:
            flow = gradient_flow(graph, backward_scopes)
            backward = backward_ops(graph, order, flow)
        regrouped = graph.rewritten
        unswappable = like.unswappable if like is not None else foldable_ops(graph)
        by_level: list[list[str]] = [[] for _ in range(order.n_levels)]
        for name in order.ops:  # an op Grappler folds runs (as a constant) before the step
            if can_wait(graph, name) and name not in unswappable:
                by_level[order.level[name]].append(name)
        hidden = frozenset(order.level[n] for n in regrouped) - {
            lvl for lvl, ops in enumerate(by_level) if ops
        }
        gates = like.gates if like is not None else frozenset(_ancestors(graph, list(backward)))
        ctx = cls(
            graph, order, backward, [], by_level, flow=flow, regrouped=regrouped, hidden=hidden,
            gates=gates,
        )  # fmt: skip
        ctx.unswappable = unswappable
        pos = order.position
        ctx.last_read = {
            name: max((pos[c] for c in t.consumers), default=pos[t.producer])
            for name, t in graph.tensors.items()
        }
        ctx.candidates = ctx._find_candidates()
        return ctx

    def _find_candidates(self) -> list[Candidate]:
        """The forward candidates, then the backward ones (`PlanParams.backward_swaps`), each
        in the order of their producers."""
        forward: list[Candidate] = []
        backward: list[Candidate] = []
        for producer in self.order.ops:
            if producer in self.unswappable:
                continue
            op = self.graph.ops[producer]
            made_in_backward = producer in self.backward
            find = self._late_candidate if made_in_backward else self._candidate
            for name in op.outputs:
                c = find(name, producer)
                if c is not None:
                    (backward if made_in_backward else forward).append(c)
        return forward + backward

    def _late_candidate(self, name: str, producer: str) -> Candidate | None:
        """A tensor of the backward pass that no op reads within `BACKWARD_GAP` levels."""
        if not self._swappable(name):
            return None
        t = self.graph.tensors[name]
        level = self.order.level
        readers = sorted(
            (level[c], c) for c in set(t.consumers) if self.graph.ops[c].type not in SHAPE_ONLY
        )
        if not readers or readers[0][0] - level[producer] < BACKWARD_GAP:
            return None
        return Candidate(name, producer, level[producer], tuple(readers), made_in_backward=True)

    def _candidate(self, name: str, producer: str) -> Candidate | None:
        """A tensor that a backward op reads: a buffer made in the forward pass, or an alias
        of one (a forwarding op's output: a reshape of a convolution's output, say), so that
        a buffer read only through aliases is freed by swapping them."""
        if not self._swappable(name):
            return None
        t = self.graph.tensors[name]
        readers = sorted(
            (self.order.level[c], c)
            for c in set(t.consumers)
            if c in self.backward and self.graph.ops[c].type not in SHAPE_ONLY
        )
        if not readers:
            return None
        return Candidate(name, producer, self.order.level[producer], tuple(readers))

    def _swappable(self, name: str) -> bool:
        """A transient tensor with bytes, not a step output, whose buffer (followed through
        forwarding ops) is transient too: never an alias of a variable. A loop's list
        (`variant`) only where its elements have one dtype and shape (the emulated host
        stacks them into one array)."""
        t = self.graph.tensors[name]
        root = self.graph.tensors[self.graph.buffer_root(name)]
        transient = t.kind is TensorKind.TRANSIENT and root.kind is TensorKind.TRANSIENT
        opaque = t.dtype == "variant" and not t.element_dtype
        return transient and not opaque and t.nbytes > 0 and name not in self.graph.outputs

    def preds(self, name: str) -> list[str]:
        if name not in self._preds:
            self._preds[name] = self.graph.predecessors(name)
        return self._preds[name]


#: ops that make a list with no element values in it
_EMPTY_LISTS = frozenset({"EmptyTensorList", "TensorListReserve"})


def gradient_flow(graph: Graph, scopes: tuple[str, ...] = BACKWARD_SCOPES) -> frozenset[str]:
    """The ops in a gradient name scope and every op that reads, through data edges, what
    they make: a custom gradient's ops (Keras' swish, say) are built outside the
    tape's scope, but they read the gradients that flow into them. An empty list made in the
    scope holds no gradient: the forward loop that fills it for its gradient (TensorFlow
    names it in the tape's scope) is not in the flow."""
    seen = {n for n in graph.ops if in_scopes(n, scopes)}
    todo = [n for n in seen if graph.ops[n].type not in _EMPTY_LISTS]
    while todo:
        for t in graph.ops[todo.pop()].outputs:
            for c in graph.tensors[t].consumers:
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
    return frozenset(seen)


def backward_ops(graph: Graph, order: Order, flow: frozenset[str]) -> frozenset[str]:
    """The ops of the backward pass: the gradient flow (`gradient_flow`) and the ops whose
    outputs only it reads and that no result of the step outside the flow depends on (the
    loss): a custom gradient's recomputation from forward tensors (swish's sigmoid, say),
    which TensorFlow may run early but which serves the backward pass alone. A step with no
    such result (no loss returned) gives no way to tell them from the forward pass: then the
    flow alone."""
    results = [graph.tensors[t].producer for t in graph.outputs]
    forward = _ancestors(graph, [p for p in results if p not in flow])
    if not forward:
        return flow
    out = set(flow)
    for name in reversed(order.ops):
        if name in out or name in forward or not graph.ops[name].inputs:
            continue  # a source (a constant, a captured variable) is neither
        readers = [c for t in graph.ops[name].outputs for c in graph.tensors[t].consumers]
        if readers and all(c in out for c in readers):
            out.add(name)
    return frozenset(out)


def _ancestors(graph: Graph, ops: list[str]) -> set[str]:
    """`ops` and every op whose outputs they need, through data edges."""
    seen, todo = set(ops), list(ops)
    while todo:
        for t in graph.ops[todo.pop()].inputs:
            p = graph.tensors[t].producer
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def in_scopes(name: str, scopes: tuple[str, ...]) -> bool:
    return any(name.startswith(s) or f"/{s}" in name for s in scopes)
