"""Check a plan against its graph before it is simulated or applied: no cycle, no shape-only op,
nothing impure re-run."""

from __future__ import annotations

from simulator.graph import Graph
from simulator.opsemantics import RECOMPUTABLE, RECOMPUTABLE_HEAVY, SHAPE_ONLY
from simulator.order import Order
from simulator.plan import InvalidPlan, Recompute, Swap, SwapPlan

__all__ = ["check_plan"]


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
