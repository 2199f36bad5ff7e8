"""Swap-in triggers: the op a copy back waits for, `lb`..`ub` levels before its reader, in the
categorized order (`direct_order`) or up the reader's inputs (`chain_rule`)."""

from __future__ import annotations

from collections import deque

from simulator.candidates import Candidate, PlanContext, can_wait
from simulator.params import PlanParams

__all__ = ["find_trigger"]


def find_trigger(
    ctx: PlanContext, cand: Candidate, first: tuple[int, str], params: PlanParams
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


def _chain_rule(ctx: PlanContext, cand: Candidate, reader: str, params: PlanParams) -> str | None:
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
            usable = can_wait(ctx.graph, p) and p not in ctx.unswappable
            if params.lb <= d <= params.ub and usable:
                return p
            if d < params.ub:
                queue.append(p)
    return None
