"""Recomputes: which candidates a chain of pure ops can make again just before their backward
readers, from tensors the step holds then anyway (see `simulator.derive`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.candidates import Candidate, PlanContext
from simulator.opsemantics import RECOMPUTABLE, RECOMPUTABLE_HEAVY, REGROUPABLE
from simulator.params import RECOMPUTE_MAX_OPS, PlanParams, RecomputePrice
from simulator.plan import Recompute, Swap, SwapIn
from simulator.triggers import find_trigger

__all__ = ["from_swap_ins", "plan_recomputes", "remake_chain"]

#: a tensor is recomputed only if it has at least 1/RECOMPUTE_SMALLEST of the largest
#: candidate's bytes: smaller ones save little, and recomputed, their originals die early, so
#: that chains for the large ones could not read them (a batch norm's scale, say)
RECOMPUTE_SMALLEST = 64
#: a backward tensor's chain may hold an input no larger than it past the input's last reader
#: when that reader runs within this many steps of the tensor's producer (`_Hold`): a batch
#: norm's input gradients made again from the output gradient read a few steps after them
#: (docs/method.md, "Constants")
HOLD_STEPS = 4
#: the parameters whose trigger rule places a recompute (`_recompute_step`)
_DEFAULTS = PlanParams()


def plan_recomputes(
    ctx: PlanContext,
    params: PlanParams,
    keep: frozenset[str],
    price: RecomputePrice | None,
    late: frozenset[str] | None,
) -> list[Recompute]:
    """With `recompute="cheap"`, a recompute for every candidate a chain of cheap ops can make
    again (see `simulator.derive`); a tensor a chain reads (kept on the device, or read
    from a swap-in, `from_swap_ins`) is not recomputed itself."""
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


def from_swap_ins(
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
                swaps[index[name]] = swap.with_swap_ins(tuple(ins))
            sources.append((name, k))
        out.append(replace(rc, sources=tuple(sources)) if sources else rc)
    return out


def _swapped_late(cand: Candidate, params: PlanParams, late: frozenset[str] | None) -> bool:
    """Whether the plan would swap `cand`, a tensor the backward pass makes."""
    return params.backward_swaps and (late is None or cand.tensor in late)


def _recompute(
    ctx: PlanContext,
    cand: Candidate,
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
    cand: Candidate,
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
    def of(cls, ctx: PlanContext, cand: Candidate, nbytes: int) -> _Hold:
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


def remake_chain(ctx: PlanContext, cand: Candidate) -> tuple[str, ...] | None:
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


def _recompute_step(ctx: PlanContext, cand: Candidate, first: tuple[int, str]) -> int | None:
    """The step whose op triggers a recompute of `cand` for its reader `first` (the default
    parameters' trigger: the level before it), or None."""
    trigger = find_trigger(ctx, cand, first, _DEFAULTS)
    return None if trigger is None else ctx.order.position[trigger]
