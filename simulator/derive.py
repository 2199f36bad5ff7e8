"""Derive a swap plan from the paper's parameters (pure Python: no TensorFlow needed to run it).

Candidates are tensors produced in the forward phase and read by a backward op at least
`threshold` levels later, counted in topological order from the start; with `backward_swaps`
(ours), after them, tensors the backward pass makes and first reads at least `threshold` levels
later; `n_tensors` of them are swapped (-1 all, 0 none). Each backward reader is rerouted to a
swap-in triggered by an op `lb`..`ub` levels before it, found in the categorized order
(`direct_order`) or by walking up the reader's own inputs (`chain_rule`); swap-ins of one
tensor whose readers lie within `groupby` levels are fused; with `sync_out` the tensor's forward
readers wait for its swap-out (ours: with `sync_lag`, the first op `sync_lag` levels after its
producer waits instead; a forward tensor no forward op reads, by the next level). Shape-only
ops are never rerouted and never triggers.

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
output gradient that a residual block holds for its shortcut (`recompute_chains._Hold`: what
such a chain may hold past its last reader).

The parameters live in `params`, the candidates in `candidates`, the triggers in `triggers`,
the recompute chains in `recompute_chains` and the plan checks in `checks`; this module
derives the plan from them.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.candidates import (
    BACKWARD_SCOPES,
    Candidate,
    PlanContext,
    backward_ops,
    can_wait,
    gradient_flow,
    in_scopes,
)
from simulator.checks import check_plan
from simulator.params import (
    LEAST_MEMORY,
    RECOMPUTE_MAX_OPS,
    RECOMPUTE_MODES,
    TRIGGER_STRATEGIES,
    PlanParams,
    RecomputePrice,
)
from simulator.plan import Swap, SwapIn, SwapPlan
from simulator.recompute_chains import from_swap_ins, plan_recomputes, remake_chain
from simulator.triggers import find_trigger

__all__ = [
    "BACKWARD_SCOPES",
    "LEAST_MEMORY",
    "PlanContext",
    "PlanParams",
    "RECOMPUTE_MAX_OPS",
    "RECOMPUTE_MODES",
    "RecomputePrice",
    "TRIGGER_STRATEGIES",
    "backward_ops",
    "can_wait",
    "check_plan",
    "derive_plan",
    "gradient_flow",
    "merge_overlapping",
    "remake_chain",
    "resolve_sources",
]


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
    recomputes = plan_recomputes(ctx, params, keep, price, late)
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
        recomputes = from_swap_ins(ctx, swaps, recomputes)
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
    return swap.with_swap_ins(tuple(merged)) if len(merged) < len(swap.swap_ins) else swap


def _selected(ctx: PlanContext, cand: Candidate, params: PlanParams) -> bool:
    op_type = ctx.graph.ops[cand.producer].type
    reader = cand.readers[0 if cand.made_in_backward else -1]  # all of them, or any, far
    far = reader[0] - cand.level >= params.threshold
    if not far or op_type in params.exclude_types:
        return False
    if params.include_types and op_type not in params.include_types:
        return False
    if in_scopes(cand.producer, params.exclude_scopes):
        return False
    return not params.include_scopes or in_scopes(cand.producer, params.include_scopes)


def _swap(ctx: PlanContext, cand: Candidate, params: PlanParams) -> Swap | None:
    """Group the far readers, find each group's trigger; None when no group gets one."""
    far = [(lvl, c) for lvl, c in cand.readers if lvl - cand.level >= params.threshold]
    swap_ins = []
    for group in _groups(far, params.groupby):
        trigger = find_trigger(ctx, cand, group[0], params)
        if trigger is not None:
            swap_ins.append(SwapIn(trigger, tuple(c for _, c in group)))
    if not swap_ins:
        return None
    nbytes = ctx.graph.tensors[cand.tensor].nbytes
    waiter = _waiter(ctx, cand, _lag(ctx, cand, params, swap_ins)) if params.sync_out else ""
    return Swap(cand.tensor, nbytes, tuple(swap_ins), params.sync_out, waiter)


def _lag(ctx: PlanContext, cand: Candidate, params: PlanParams, swap_ins: list[SwapIn]) -> int:
    """How many levels after the producer the swap-out is waited for (0: by its readers):
    `sync_lag`, or, where a reader that is not rerouted may not wait (`Graph.rewritten`),
    just after the last such reader; at least 1 where a forward tensor has every reader
    rerouted (only the backward pass reads it: no reader would wait, and its copy could hold
    device memory while the forward pass goes on)."""
    rerouted = {c for s in swap_ins for c in s.consumers}
    kept = [c for c in ctx.graph.tensors[cand.tensor].consumers if c not in rerouted]
    if not kept and cand.producer not in ctx.flow:
        return max(params.sync_lag, 1)
    if params.sync_lag or not ctx.regrouped.intersection(kept):
        return params.sync_lag
    return 1 + max(ctx.order.level[c] for c in kept) - cand.level


def _waiter(ctx: PlanContext, cand: Candidate, lag: int) -> str:
    """The first op at least `lag` levels after the candidate's producer that holds the
    backward pass back (`PlanContext.gates`; '' when `lag` is 0 or there is none: its
    readers then wait)."""
    if not lag:
        return ""
    for level in range(cand.level + lag, len(ctx.by_level)):
        for op in ctx.by_level[level]:
            if op in ctx.gates:
                return op
    return ""


def _groups(readers: list[tuple[int, str]], groupby: int) -> list[list[tuple[int, str]]]:
    groups: list[list[tuple[int, str]]] = []
    for lvl, c in readers:
        if groups and lvl - groups[-1][0][0] <= groupby:
            groups[-1].append((lvl, c))
        else:
            groups.append([(lvl, c)])
    return groups
