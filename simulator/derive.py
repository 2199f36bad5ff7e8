"""Derive a swap plan from the paper's parameters (pure Python: no TensorFlow needed to run it).

Candidates are tensors produced in the forward phase and read by a backward op at least
`threshold` levels later, counted in topological order from the start; with `backward_swaps`
(ours), after them, tensors the backward pass makes and first reads at least `threshold` levels
later; `n_tensors` of them are swapped (-1 all, 0 none). Each backward reader is rerouted to a
swap-in triggered by an op `lb`..`ub` levels before it, found in the categorized order
(`direct_order`) or by walking up the reader's own inputs (`chain_rule`); swap-ins of one
tensor whose readers lie within `groupby` levels are fused; with `sync_out` the tensor's forward
readers wait for its swap-out (ours: with `sync_lag`, the first op `sync_lag` levels after its
producer waits instead). Shape-only ops are never rerouted and never triggers.

With `recompute="cheap"` (ours), every candidate made by a cheap element-wise op
(`opsemantics.RECOMPUTABLE`) is recomputed instead, when a chain of at most `recompute_ops`
such ops makes it again from tensors the step holds anyway just before its first backward
reader; the rest are swapped as above. A chain input that is swapped is read from the swap-in
that serves its first reader after the recompute, then triggered no later than it. With
`recompute_heavy` (and a cost model and link, `RecomputePrice`), chains may also re-run
convolutions and matrix products (`opsemantics.RECOMPUTABLE_HEAVY`), where they cost at most
that share of the transfer time that recomputing instead of swapping saves. With
`backward_swaps`, a backward tensor the plan would swap is recomputed the same way where its
chain needs no backward op but its own: a batch norm's input gradient, made again from the
output gradient that a residual block holds for its shortcut (`_Hold`: what such a chain may
hold past its last reader).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from simulator.errors import UserError
from simulator.graph import Graph, TensorKind
from simulator.opsemantics import (
    RECOMPUTABLE,
    RECOMPUTABLE_HEAVY,
    REGROUPABLE,
    SHAPE_ONLY,
    foldable_ops,
)
from simulator.order import Order, categorized_order
from simulator.plan import InvalidPlan, Recompute, Swap, SwapIn, SwapPlan
from simulator.timing import Link

__all__ = [
    "BACKWARD_SCOPES",
    "LEAST_MEMORY",
    "PlanContext",
    "PlanParams",
    "RECOMPUTE_MAX_OPS",
    "RecomputePrice",
    "backward_ops",
    "gradient_flow",
    "check_plan",
    "derive_plan",
    "merge_overlapping",
    "remake_chain",
    "resolve_sources",
]

#: Name scopes of the backward phase: TF2's GradientTape and TF1-style gradients.
BACKWARD_SCOPES = ("gradient_tape/", "gradients/")
TRIGGER_STRATEGIES = ("direct_order", "chain_rule")
RECOMPUTE_MODES = ("none", "cheap")
#: the longest chain the search (and the time bound) lets a recompute re-run
RECOMPUTE_MAX_OPS = 8
#: a tensor is recomputed only if it has at least 1/RECOMPUTE_SMALLEST of the largest
#: candidate's bytes: smaller ones save little, and recomputed, their originals die early, so
#: that chains for the large ones could not read them (a batch norm's scale, say)
RECOMPUTE_SMALLEST = 64
#: a tensor the backward pass makes is a candidate only if no op reads it within this many
#: levels: with a shorter gap its copy back is needed before the copy out has freed it, and both
#: are held (docs/method.md, "Constants")
BACKWARD_GAP = 4
#: a backward tensor's chain may hold an input no larger than it past the input's last reader
#: when that reader runs within this many steps of the tensor's producer (`_Hold`): a batch
#: norm's input gradients made again from the output gradient read a few steps after them
#: (docs/method.md, "Constants")
HOLD_STEPS = 4
#: op types never used as a swap-in trigger
NOT_TRIGGERS = SHAPE_ONLY | {"Const", "Placeholder", "NoOp", "VarHandleOp"}


def can_wait(graph: Graph, name: str) -> bool:
    """Whether op `name` may trigger a copy or wait for one (a control edge into or out of
    it): not a constant or a shape query, and not an op Grappler rewrites (`Graph.rewritten`:
    a sum or product it regroups, or an op its remapper fuses; both skip nodes a control edge
    touches)."""
    return graph.ops[name].type not in NOT_TRIGGERS and name not in graph.rewritten


@dataclass(frozen=True)
class PlanParams:
    """The swap parameters; the defaults are the original tool's (n_tensors=-1, lb=1, ub=10000).

    `serialize` (ours, not the original tool's) adds the order edges that lower the step's
    least-memory peak (`simulator.order_edges`); the engine that evaluates the plan finds them.
    """

    n_tensors: int = -1
    lb: int = 1
    ub: int = 10000
    threshold: int = 1
    groupby: int = 0
    trigger: str = "direct_order"
    sync_out: bool = False
    serialize: bool = False
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    include_scopes: tuple[str, ...] = ()
    exclude_scopes: tuple[str, ...] = ()
    recompute: str = "none"
    recompute_ops: int = 5  # a batch norm's application and its activation
    #: with a time model, move swap-ins earlier while the live bytes stay within this many
    #: bytes (`simulator.prefetch`; 0: never)
    prefetch_bytes: int = 0
    #: with `prefetch_bytes` and `sync_out`, first move the waits for forward swap-outs later,
    #: to where their copies should end (`simulator.prefetch.postpone_waits`)
    postpone_waits: bool = True
    #: with recomputes, while the plan's simulated peak passes this many
    #: bytes, the recomputes whose chains hold bytes at the peak are swapped instead, as long
    #: as that lowers the peak (`Engine`; 0: never)
    recompute_limit: int = 0
    #: with `sync_out`, the first op at least this many levels after a swapped tensor's
    #: producer waits for its swap-out instead of its readers (0: the readers wait); the
    #: forward pass may then run ahead of the link by that many levels
    sync_lag: int = 0
    #: also swap tensors the backward pass makes and first reads at least `threshold` levels
    #: later (weight gradients held for the optimizer, a branch's input gradient held for the
    #: sum with the other branch's): they come after the forward candidates, so `n_tensors`
    #: reaches them last (ours; the original tool swapped forward tensors only)
    backward_swaps: bool = False
    #: with `backward_swaps`, swap only the backward tensors live at a step where the plan
    #: without them passes this many live bytes (`Engine`; 0: all of them)
    backward_limit: int = 0
    #: with recomputes, also re-run convolutions and matrix products where the chain costs at
    #: most this many times the transfer time of its tensor, out and back (`RecomputePrice`;
    #: 0: never; on a link-bound step 1 trades them even, below 1 leaves room for overlap)
    recompute_heavy: float = 0.0

    def __post_init__(self) -> None:
        if self.n_tensors < -1:
            raise UserError(f"n_tensors must be -1 (all), 0 (none) or more, got {self.n_tensors}")
        if not 1 <= self.lb <= self.ub:
            raise UserError(f"need 1 <= lb <= ub, got lb={self.lb}, ub={self.ub}")
        if self.sync_lag < 0:
            raise UserError(f"sync_lag must be 0 (the readers wait) or more, got {self.sync_lag}")
        if self.threshold < 1 or self.groupby < 0:
            raise UserError("threshold must be at least 1 and groupby at least 0")
        if self.trigger not in TRIGGER_STRATEGIES:
            raise UserError(f"trigger must be one of {', '.join(TRIGGER_STRATEGIES)}")
        if self.recompute not in RECOMPUTE_MODES:
            raise UserError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}")
        if self.recompute_limit < 0:
            raise UserError(f"recompute_limit must be 0 (off) or more, got {self.recompute_limit}")
        if self.backward_limit < 0:
            raise UserError(f"backward_limit must be 0 (off) or more, got {self.backward_limit}")
        if self.prefetch_bytes < 0:
            raise UserError(f"prefetch_bytes must be 0 (off) or more, got {self.prefetch_bytes}")
        if not self.recompute_heavy >= 0:
            raise UserError(f"recompute_heavy must be 0 (off) or more, got {self.recompute_heavy}")
        if self.recompute_ops < 1:
            raise UserError(f"recompute_ops must be at least 1, got {self.recompute_ops}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanParams:
        """The parameters `to_dict` wrote (lists back to tuples)."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


#: The corner that saves the most memory: every candidate, synchronized swap-outs, swap-ins
#: just before their readers.
LEAST_MEMORY = PlanParams(ub=1, sync_out=True)


@dataclass(frozen=True)
class RecomputePrice:
    """What a recompute through heavy ops is weighed with: per-op seconds and the host link."""

    cost: Mapping[str, float]
    link: Link

    def worth(self, ops: tuple[str, ...], nbytes: int, ratio: float) -> bool:
        """Whether re-running `ops` costs at most `ratio` times moving `nbytes` out and back."""
        seconds = sum(self.cost.get(o, 0.0) for o in ops)
        return seconds <= ratio * (nbytes / self.link.d2h + nbytes / self.link.h2d)


@dataclass(frozen=True)
class _Candidate:
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
    candidates: list[_Candidate]
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

    @classmethod
    def build(
        cls,
        graph: Graph,
        order: Order | None = None,
        backward_scopes: tuple[str, ...] = BACKWARD_SCOPES,
    ) -> PlanContext:
        order = order or categorized_order(graph)
        flow = gradient_flow(graph, backward_scopes)
        backward = backward_ops(graph, order, flow)
        regrouped = graph.rewritten
        by_level: list[list[str]] = [[] for _ in range(order.n_levels)]
        for name in order.ops:
            if can_wait(graph, name):
                by_level[order.level[name]].append(name)
        hidden = frozenset(order.level[n] for n in regrouped) - {
            lvl for lvl, ops in enumerate(by_level) if ops
        }
        ctx = cls(
            graph, order, backward, [], by_level, flow=flow, regrouped=regrouped, hidden=hidden
        )
        ctx.unswappable = foldable_ops(graph)
        pos = order.position
        ctx.last_read = {
            name: max((pos[c] for c in t.consumers), default=pos[t.producer])
            for name, t in graph.tensors.items()
        }
        ctx.candidates = ctx._find_candidates()
        return ctx

    def _find_candidates(self) -> list[_Candidate]:
        """The forward candidates, then the backward ones (`PlanParams.backward_swaps`), each
        in the order of their producers."""
        forward: list[_Candidate] = []
        backward: list[_Candidate] = []
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

    def _late_candidate(self, name: str, producer: str) -> _Candidate | None:
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
        return _Candidate(name, producer, level[producer], tuple(readers), made_in_backward=True)

    def _candidate(self, name: str, producer: str) -> _Candidate | None:
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
        return _Candidate(name, producer, self.order.level[producer], tuple(readers))

    def _swappable(self, name: str) -> bool:
        """A transient tensor with bytes, not a step output, whose buffer (followed through
        forwarding ops) is transient too: never an alias of a variable."""
        t = self.graph.tensors[name]
        root = self.graph.tensors[self.graph.buffer_root(name)]
        transient = t.kind is TensorKind.TRANSIENT and root.kind is TensorKind.TRANSIENT
        return transient and t.nbytes > 0 and name not in self.graph.outputs

    def preds(self, name: str) -> list[str]:
        if name not in self._preds:
            self._preds[name] = self.graph.predecessors(name)
        return self._preds[name]


def gradient_flow(graph: Graph, scopes: tuple[str, ...] = BACKWARD_SCOPES) -> frozenset[str]:
    """The ops in a gradient name scope and every op that reads, through data edges, what
    they make: a custom gradient's ops (Keras' swish, say) are built outside the
    tape's scope, but they read the gradients that flow into them."""
    seen = {n for n in graph.ops if _in_scopes(n, scopes)}
    todo = list(seen)
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


def _in_scopes(name: str, scopes: tuple[str, ...]) -> bool:
    return any(name.startswith(s) or f"/{s}" in name for s in scopes)


def derive_plan(
    ctx: PlanContext,
    params: PlanParams,
    keep: frozenset[str] = frozenset(),
    late: frozenset[str] | None = None,
    price: RecomputePrice | None = None,
) -> SwapPlan:
    """The plan `params` gives on the graph of `ctx`: recomputes first, then swaps; the
    tensors in `keep` are never recomputed (they are swapped, or kept, as without recomputes);
    with `backward_swaps`, of the backward pass's tensors only those in `late` are swapped
    (None: all); heavy ops are recomputed only with a `price` to weigh them."""
    recomputes = _recomputes(ctx, params, keep, price, late)
    made = {r.tensor for r in recomputes}
    swaps: list[Swap] = []
    for cand in ctx.candidates:
        if params.n_tensors != -1 and len(swaps) >= params.n_tensors:
            break
        if cand.made_in_backward and not params.backward_swaps:
            break  # they come last
        if cand.made_in_backward and late is not None and cand.tensor not in late:
            continue
        if cand.tensor in made or not _selected(ctx, cand, params):
            continue
        swap = _swap(ctx, cand, params)
        if swap is not None:
            swaps.append(swap)
    if recomputes:  # a source's swap-in brought forward may now overlap the next copy
        recomputes = _from_swap_ins(ctx, swaps, recomputes)
        swaps = [merge_overlapping(s, ctx.order.position) for s in swaps]
    plan = SwapPlan(tuple(swaps), params.to_dict(), ctx.graph.name)
    if not recomputes:
        return plan
    return resolve_sources(replace(plan, recomputes=tuple(recomputes)), ctx.order.position)


def resolve_sources(plan: SwapPlan, pos: dict[str, int]) -> SwapPlan:
    """`plan` with each recompute reading each swapped tensor of its chain from the last of
    its swap-ins placed by the recompute's trigger (after swap-ins were moved or merged, their
    indices change)."""
    by_tensor = {s.tensor: s for s in plan.swaps}
    out = []
    for rc in plan.recomputes:
        at = pos[rc.trigger]
        sources = tuple((name, _copy_at(by_tensor[name], at, pos)) for name, _ in rc.sources)
        out.append(rc if sources == rc.sources else replace(rc, sources=sources))
    return replace(plan, recomputes=tuple(out))


def _copy_at(swap: Swap, at: int, pos: dict[str, int]) -> int:
    placed = [k for k, s in enumerate(swap.swap_ins) if pos[s.trigger] <= at]
    return placed[-1] if placed else 0


def merge_overlapping(swap: Swap, pos: dict[str, int]) -> Swap:
    """`swap` with each swap-in triggered before the previous copy's last reader merged into
    that copy: two copies of one tensor would be live at once, one serves both groups of
    readers with no more bytes live at any step, and the tensor crosses the link once less.
    (Recomputes then read their sources from the copies `resolve_sources` finds.)"""
    merged: list[SwapIn] = []
    for s in swap.swap_ins:
        if merged and pos[s.trigger] <= max(pos[c] for c in merged[-1].consumers):
            merged[-1] = SwapIn(merged[-1].trigger, merged[-1].consumers + s.consumers)
        else:
            merged.append(s)
    return replace(swap, swap_ins=tuple(merged)) if len(merged) < len(swap.swap_ins) else swap


def _from_swap_ins(
    ctx: PlanContext, swaps: list[Swap], recomputes: list[Recompute]
) -> list[Recompute]:
    """Recomputes whose chains read swapped tensors from a swap-in: the one that serves the
    tensor's first reader after the recompute's trigger, brought forward to that trigger
    where it came later (`swaps` edited in place), or the last one when no reader follows:
    the tensor then crosses the link once, and the recompute's output not at all. The
    sources name the tensors (their copies are found by `resolve_sources`)."""
    pos = ctx.order.position
    index = {s.tensor: i for i, s in enumerate(swaps)}
    out = []
    for rc in recomputes:
        at = pos[rc.trigger]
        sources = []
        for name in sorted(rc.reads(ctx.graph) & index.keys()):
            swap = swaps[index[name]]
            ins = list(swap.swap_ins)
            ends = [max(pos[c] for c in s.consumers) for s in ins]
            k = next((k for k, end in enumerate(ends) if end >= at), len(ins) - 1)
            if pos[ins[k].trigger] > at:
                ins[k] = SwapIn(rc.trigger, ins[k].consumers)
                swaps[index[name]] = replace(swap, swap_ins=tuple(ins))
            sources.append((name, k))
        out.append(replace(rc, sources=tuple(sources)) if sources else rc)
    return out


def _recomputes(
    ctx: PlanContext,
    params: PlanParams,
    keep: frozenset[str],
    price: RecomputePrice | None,
    late: frozenset[str] | None,
) -> list[Recompute]:
    """With `recompute="cheap"`, a recompute for every candidate a chain of cheap ops can make
    again (see the module's docstring); a tensor a chain reads (kept on the device, or read
    from a swap-in, `_from_swap_ins`) is not recomputed itself."""
    out: list[Recompute] = []
    held: set[str] = set()
    if params.recompute == "none" or not ctx.candidates:
        return out
    sizes = [ctx.graph.tensors[c.tensor].nbytes for c in ctx.candidates if not c.made_in_backward]
    floor = max(sizes, default=0) // RECOMPUTE_SMALLEST
    for cand in ctx.candidates:
        if cand.made_in_backward and not _swapped_late(cand, params, late):
            continue
        nbytes = ctx.graph.tensors[cand.tensor].nbytes
        if cand.tensor in held or nbytes < floor or cand.tensor in keep:
            continue  # read where it is by a chain made earlier, too small to matter, or kept
        found = _recompute(ctx, cand, params, {r.tensor for r in out}, price)
        if found is not None:
            out.append(found[0])
            held |= found[1]
    return out


def _swapped_late(cand: _Candidate, params: PlanParams, late: frozenset[str] | None) -> bool:
    """Whether the plan would swap `cand`, a tensor the backward pass makes."""
    return params.backward_swaps and (late is None or cand.tensor in late)


def _recompute(
    ctx: PlanContext,
    cand: _Candidate,
    params: PlanParams,
    recomputed: set[str],
    price: RecomputePrice | None,
) -> tuple[Recompute, set[str]] | None:
    """The recompute of `cand` for all its backward readers and the tensors its chain reads,
    or None when no chain of at most `recompute_ops` cheap ops (or heavy ones worth their
    cost, `RecomputePrice`) makes it from tensors live anyway at its trigger, or when it would
    free nothing (no step between its last forward reader and that trigger)."""
    pos = ctx.order.position
    readers = tuple(c for _, c in cand.readers)
    tensor = ctx.graph.tensors[cand.tensor]
    kept = [pos[c] for c in tensor.consumers if c not in readers]
    found = _recompute_group(ctx, cand, cand.readers[0], params, recomputed, price)
    if found is None or max(kept, default=pos[cand.producer]) >= found[1]:
        return None  # no copy, or the original would live until it is made: none freed
    ops, at, reads = found
    return Recompute(cand.tensor, tensor.nbytes, ops, ctx.order.ops[at], readers), reads


def _recompute_group(
    ctx: PlanContext,
    cand: _Candidate,
    first: tuple[int, str],
    params: PlanParams,
    recomputed: set[str],
    price: RecomputePrice | None,
) -> tuple[tuple[str, ...], int, set[str]] | None:
    """The chain that makes `cand` again for its reader `first`, its trigger's step and the
    tensors it reads, or None."""
    at = _recompute_step(ctx, cand, first)
    if at is None:
        return None
    heavy = price is not None and params.recompute_heavy > 0
    kinds = RECOMPUTABLE | RECOMPUTABLE_HEAVY if heavy else RECOMPUTABLE
    nbytes = ctx.graph.tensors[cand.tensor].nbytes
    hold = _Hold.of(ctx, cand, nbytes)
    chain = _chain(ctx, cand.producer, at, params.recompute_ops, recomputed, kinds, hold)
    if chain is None:
        return None
    ops, reads = chain
    costly = any(ctx.graph.ops[o].type in RECOMPUTABLE_HEAVY for o in ops)
    if costly and not (price and price.worth(ops, nbytes, params.recompute_heavy)):
        return None
    return ops, at, reads


@dataclass(frozen=True)
class _Hold:
    """Which tensors dead by its trigger a chain may hold until then: none for a forward
    tensor's; for a backward tensor's (`made` bytes, by the op at step `step`), one under
    1/RECOMPUTE_SMALLEST of it (a batch norm's scale, say), or one no larger whose last reader
    runs within HOLD_STEPS of `step` (the gradient that a batch norm's input gradient is
    made from): held instead of the tensor made, it holds no more bytes for about as long."""

    made: int = 0
    step: int = -1

    @classmethod
    def of(cls, ctx: PlanContext, cand: _Candidate, nbytes: int) -> _Hold:
        if not cand.made_in_backward:
            return cls()
        return cls(nbytes, ctx.order.position[cand.producer])

    def holds(self, nbytes: int, last_read: int) -> bool:
        if not self.made:
            return False
        small = nbytes * RECOMPUTE_SMALLEST <= self.made
        beside = self.step <= last_read <= self.step + HOLD_STEPS
        return small or (nbytes <= self.made and beside)


def _chain(
    ctx: PlanContext,
    producer: str,
    at: int,
    budget: int,
    recomputed: set[str],
    kinds: frozenset[str],
    hold: _Hold,
) -> tuple[tuple[str, ...], set[str]] | None:
    """The ops, in order, that make `producer`'s output again at step `at` (at most `budget`
    of them, of the op types `kinds`) and the tensors they read (live then, or held until
    then as `hold` allows), or None. No sum or product Grappler regroups in the original step
    (`Graph.rewritten`) is copied: the copy, which carries a control edge, would be computed as
    written (a batch norm's sum and the residual sum after it as two adds, where the original
    sums the three terms as one tree) and round otherwise. (A convolution and its bias fused
    into one kernel are copied: the copies fuse alike.)"""
    graph = ctx.graph
    op = graph.ops[producer]
    if op.type not in kinds or len(op.outputs) != 1 or producer in ctx.unswappable:
        return None
    if producer in graph.rewritten and op.type in REGROUPABLE:
        return None
    ops: list[str] = []
    reads: set[str] = set()
    for name in dict.fromkeys(op.inputs):
        t = graph.tensors[name]
        last = ctx.last_read[name]
        live = (last >= at or hold.holds(t.nbytes, last)) and name not in recomputed
        held = not graph.tensors[graph.buffer_root(name)].kind.on_device  # a variable's, say
        if not t.kind.on_device or held or live:
            reads.add(name)
            continue
        if budget <= 1 + len(ops) or t.producer in ctx.backward:
            return None
        inner = _chain(ctx, t.producer, at, budget - 1 - len(ops), recomputed, kinds, hold)
        if inner is None:
            return None
        ops += [o for o in inner[0] if o not in ops]
        reads |= inner[1]
    return (*ops, producer), reads


def remake_chain(ctx: PlanContext, cand: _Candidate) -> tuple[str, ...] | None:
    """The fewest ops a recompute of `cand` re-runs: its chain of pure ops (at most
    RECOMPUTE_MAX_OPS, heavy ones too) back to tensors still read at its trigger, as
    `_recompute_group` builds it. An op that wrote its output over an input dead by then (a
    bias add over its convolution's output) leaves no input to start from: the chain goes on
    to that input's producer. None where no recompute can make it."""
    at = _recompute_step(ctx, cand, cand.readers[0])
    if at is None:
        return None
    kinds = RECOMPUTABLE | RECOMPUTABLE_HEAVY
    found = _chain(ctx, cand.producer, at, RECOMPUTE_MAX_OPS, set(), kinds, _Hold())
    return found[0] if found is not None else None


def _recompute_step(ctx: PlanContext, cand: _Candidate, first: tuple[int, str]) -> int | None:
    """The step whose op triggers a recompute of `cand` for its reader `first` (the default
    parameters' trigger: the level before it), or None."""
    trigger = _trigger(ctx, cand, first, PlanParams())
    return None if trigger is None else ctx.order.position[trigger]


def _selected(ctx: PlanContext, cand: _Candidate, params: PlanParams) -> bool:
    op_type = ctx.graph.ops[cand.producer].type
    reader = cand.readers[0 if cand.made_in_backward else -1]  # all of them, or any, far
    far = reader[0] - cand.level >= params.threshold
    if not far or op_type in params.exclude_types:
        return False
    if params.include_types and op_type not in params.include_types:
        return False
    if _in_scopes(cand.producer, params.exclude_scopes):
        return False
    return not params.include_scopes or _in_scopes(cand.producer, params.include_scopes)


def _swap(ctx: PlanContext, cand: _Candidate, params: PlanParams) -> Swap | None:
    """Group the far readers, find each group's trigger; None when no group gets one."""
    far = [(lvl, c) for lvl, c in cand.readers if lvl - cand.level >= params.threshold]
    swap_ins = []
    for group in _groups(far, params.groupby):
        trigger = _trigger(ctx, cand, group[0], params)
        if trigger is not None:
            swap_ins.append(SwapIn(trigger, tuple(c for _, c in group)))
    if not swap_ins:
        return None
    nbytes = ctx.graph.tensors[cand.tensor].nbytes
    waiter = _waiter(ctx, cand, _lag(ctx, cand, params, swap_ins)) if params.sync_out else ""
    return Swap(cand.tensor, nbytes, tuple(swap_ins), params.sync_out, waiter)


def _lag(ctx: PlanContext, cand: _Candidate, params: PlanParams, swap_ins: list[SwapIn]) -> int:
    """How many levels after the producer the swap-out is waited for (0: by its readers):
    `sync_lag`, or, where a reader that is not rerouted may not wait (`Graph.rewritten`),
    just after the last such reader."""
    rerouted = {c for s in swap_ins for c in s.consumers}
    kept = [c for c in ctx.graph.tensors[cand.tensor].consumers if c not in rerouted]
    if params.sync_lag or not ctx.regrouped.intersection(kept):
        return params.sync_lag
    return 1 + max(ctx.order.level[c] for c in kept) - cand.level


def _waiter(ctx: PlanContext, cand: _Candidate, lag: int) -> str:
    """The first op at least `lag` levels after the candidate's producer ('' when `lag` is 0
    or there is none: its readers then wait)."""
    if not lag:
        return ""
    for level in range(cand.level + lag, len(ctx.by_level)):
        if ctx.by_level[level]:
            return ctx.by_level[level][0]
    return ""


def _groups(readers: list[tuple[int, str]], groupby: int) -> list[list[tuple[int, str]]]:
    groups: list[list[tuple[int, str]]] = []
    for lvl, c in readers:
        if groups and lvl - groups[-1][0][0] <= groupby:
            groups[-1].append((lvl, c))
        else:
            groups.append([(lvl, c)])
    return groups


def _trigger(
    ctx: PlanContext, cand: _Candidate, first: tuple[int, str], params: PlanParams
) -> str | None:
    """The first op `lb`..`ub` levels before the reader `first` (direct order) or up its
    inputs (chain rule). A level whose every op may not be waited for (`Graph.rewritten`)
    is not counted: a swap-in of the least-memory corner (`ub` 1) then waits for the level
    before it rather than being dropped."""
    level, reader = first
    if params.trigger == "chain_rule":
        return _chain_rule(ctx, cand, reader, params)
    d, at = params.lb, level - params.lb
    while d <= params.ub and at > cand.level:
        if ctx.by_level[at]:
            return ctx.by_level[at][0]
        d += at not in ctx.hidden
        at -= 1
    return None


def _chain_rule(ctx: PlanContext, cand: _Candidate, reader: str, params: PlanParams) -> str | None:
    """Walk up the reader's backward inputs (breadth first) to an op `lb`..`ub` levels before
    it: the swap-in then follows the chain of gradients that leads to its reader."""
    level = ctx.order.level
    seen, queue = {reader}, deque([reader])
    while queue:
        op = queue.popleft()
        for p in ctx.preds(op):
            if p in seen or level[p] <= cand.level or p not in ctx.backward:
                continue
            seen.add(p)
            d = level[reader] - level[p]
            usable = can_wait(ctx.graph, p)
            if params.lb <= d <= params.ub and usable:
                return p
            if d < params.ub:
                queue.append(p)
    return None


def check_plan(graph: Graph, order: Order, plan: SwapPlan) -> None:
    """Raise InvalidPlan unless every swap-in and recompute is triggered strictly before all
    its readers (so no trigger can depend on its own copy: no cycle), no shape-only op is
    involved, and every op a plan re-runs is pure and cheap (`RECOMPUTABLE`: never a random,
    stateful or variable-reading op)."""
    for rc in plan.recomputes:
        _check_recompute(graph, order, rc)
    for swap in plan.swaps:
        _check_waiter(graph, order, swap)
        for s in swap.swap_ins:
            if s.trigger not in graph.ops or any(c not in graph.ops for c in s.consumers):
                raise InvalidPlan(f"swap-in of {swap.tensor!r} names ops missing from the graph")
            first = min(order.level[c] for c in s.consumers)
            if order.level[s.trigger] >= first:
                raise InvalidPlan(
                    f"trigger {s.trigger!r} of {swap.tensor!r} is not before its readers: cycle"
                )
            involved = [s.trigger, *s.consumers]
            if any(graph.ops[o].type in SHAPE_ONLY for o in involved):
                raise InvalidPlan(f"swap-in of {swap.tensor!r} involves a shape-only op")


def _check_waiter(graph: Graph, order: Order, swap: Swap) -> None:
    if not swap.waiter:
        return
    if swap.waiter not in graph.ops:
        raise InvalidPlan(f"swap-out of {swap.tensor!r} names a waiter missing from the graph")
    producer = graph.tensors[swap.tensor].producer
    if order.level[swap.waiter] <= order.level[producer]:
        raise InvalidPlan(f"waiter {swap.waiter!r} of {swap.tensor!r} is not after its producer")
    if graph.ops[swap.waiter].type in SHAPE_ONLY:
        raise InvalidPlan(f"waiter {swap.waiter!r} of {swap.tensor!r} is a shape-only op")


def _check_recompute(graph: Graph, order: Order, rc: Recompute) -> None:
    named = [rc.trigger, *rc.ops, *rc.consumers]
    if any(o not in graph.ops for o in named):
        raise InvalidPlan(f"recompute of {rc.tensor!r} names ops missing from the graph")
    pure = RECOMPUTABLE | RECOMPUTABLE_HEAVY
    impure = [o for o in rc.ops if graph.ops[o].type not in pure]
    if impure:
        kinds = ", ".join(f"{o} ({graph.ops[o].type})" for o in impure)
        raise InvalidPlan(
            f"recompute of {rc.tensor!r} would re-run ops that are not pure and cheap: {kinds}"
        )
    if not rc.ops or rc.tensor not in graph.ops[rc.ops[-1]].outputs:
        raise InvalidPlan(f"recompute of {rc.tensor!r}: its last op does not produce it")
    first = min(order.level[c] for c in rc.consumers)
    if order.level[rc.trigger] >= first:
        raise InvalidPlan(f"trigger {rc.trigger!r} of {rc.tensor!r} is not before its readers")
    if any(graph.ops[o].type in SHAPE_ONLY for o in (rc.trigger, *rc.consumers)):
        raise InvalidPlan(f"recompute of {rc.tensor!r} involves a shape-only op")
