"""Swap-ins as early as the memory allows, and no earlier than the link needs.

The paper's parameters place every swap-in the same number of levels (`lb`..`ub`) before its
reader. Near the memory limit that forces just-in-time swap-ins everywhere (`ub` 1 or 2), and
the backward pass then waits for each copy in turn, although most of it, where tensors are
small, has room to fetch them earlier. `prefetch` moves each swap-in's trigger earlier, one
swap-in at a time in the order of their readers, until it is early enough or the memory is not
there:

- early enough: the host-to-device stream runs its copies one after another, so each copy must
  start by its *latest start*: its reader's start in the stall-free schedule, or the next
  copy's latest start if that is sooner, minus its own transfer time;
- memory: the copy then lives from its new trigger on, so its bytes are added to the live bytes
  of every step in between (`live`, the plan's simulated live bytes per step), which must stay
  within `limit`.

Then, where the memory left still allows, a copy is kept on the device from its last reader
to the next copy of the same tensor, which is dropped: the tensor crosses the link once less
(on ResNet-50 at batch 1131, v100-16gb-pcie3, a plan's host-to-device bytes went from 66.3 to
62.9 GiB and its step from 2.91x to 2.85x the step without swapping).

The copies of tensors the backward pass makes (`PlanParams.backward_swaps`) stay where they
are: their copies to the host run while the backward pass computes, and each device copy is
held until its copy to the host ends, at a step that comes later the fewer stalls there are. The
live bytes simulated before the moves then undercount: on ResNet-50 at batch 1144 such moves
took a plan from 14.52 GiB to 18.80 GiB.

Triggers stay in the backward pass, after the tensor's last forward reader, and before the
level of the copy's first reader (no cycle, as in `derive.check_plan`); a copy is never
triggered before one needed earlier, so that the stream gets them in the order they are needed
(the time model runs the copies one trigger starts in the order of their readers).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.derive import NOT_TRIGGERS, merge_overlapping
from simulator.graph import Graph
from simulator.order import Order
from simulator.plan import Swap, SwapIn, SwapPlan
from simulator.timing import Link, Timeline

__all__ = ["prefetch"]


def prefetch(
    graph: Graph,
    timeline: Timeline,
    plan: SwapPlan,
    live: np.ndarray,
    limit: int,
    link: Link,
    backward_start: int,
    backward: frozenset[str] = frozenset(),
) -> SwapPlan:
    """`plan` with its swap-ins triggered earlier where `live` (bytes per step) has room under
    `limit` (see the module's docstring); `backward_start` is the first step of the backward,
    `backward` its ops."""
    order = timeline.order
    pos = order.position
    items = sorted(
        (min(pos[c] for c in s.consumers), i, k)
        for i, swap in enumerate(plan.swaps)
        for k, s in enumerate(swap.swap_ins)
    )
    latest = _latest_starts(timeline, plan, items, link)
    room = live.astype(np.int64)
    moved: dict[tuple[int, int], str] = {}
    queued = backward_start  # copies are queued in the order they are needed
    for first, i, k in items:
        swap = plan.swaps[i]
        t = pos[swap.swap_ins[k].trigger]
        if graph.tensors[swap.tensor].producer in backward:
            continue  # made in the backward pass: see the module's docstring
        low = max(queued, _freed(graph, pos, swap) + 1)
        q = _earliest(graph, order, timeline, room, swap.nbytes, limit, t, low, first, latest[i, k])
        if q < t:
            room[q:t] += swap.nbytes
            moved[i, k] = order.ops[q]
        queued = max(queued, q)
    plan = _with_triggers(plan, moved, pos) if moved else plan
    return _kept(plan, room, limit, pos)


def _kept(plan: SwapPlan, room: np.ndarray, limit: int, pos: dict[str, int]) -> SwapPlan:
    """`plan` with each swap-in merged into the copy before it where the memory left in `room`
    (edited in place) holds that copy from its last reader to the swap-in's trigger, or where
    it is triggered before that reader (as `merge_overlapping`)."""
    swaps = []
    for swap in plan.swaps:
        ins: list[SwapIn] = []
        for s in swap.swap_ins:
            if ins:
                last, t = max(pos[c] for c in ins[-1].consumers), pos[s.trigger]
                if int(room[last + 1 : t].max(initial=0)) + swap.nbytes <= limit or t <= last:
                    room[last + 1 : t] += swap.nbytes  # (nothing when the copies overlap)
                    ins[-1] = SwapIn(ins[-1].trigger, ins[-1].consumers + s.consumers)
                    continue
            ins.append(s)
        swaps.append(replace(swap, swap_ins=tuple(ins)) if len(ins) < len(swap.swap_ins) else swap)
    return replace(plan, swaps=tuple(swaps))


def _latest_starts(
    timeline: Timeline, plan: SwapPlan, items: list[tuple[int, int, int]], link: Link
) -> dict[tuple[int, int], float]:
    """When each copy must start so that the stream, running them in turn, has every copy
    in before its reader starts (no stalls)."""
    starts = [e - c for e, c in zip(timeline.base_end, timeline.cost)]
    out: dict[tuple[int, int], float] = {}
    after = float("inf")
    for first, i, k in reversed(items):
        after = min(starts[first], after) - plan.swaps[i].nbytes / link.h2d
        out[i, k] = after
    return out


def _freed(graph: Graph, pos: dict[str, int], swap: Swap) -> int:
    """The step of the swapped tensor's last reader that is not rerouted to a copy."""
    tensor = graph.tensors[swap.tensor]
    rerouted = swap.rerouted
    kept = [pos[c] for c in tensor.consumers if c not in rerouted]
    return max([pos[tensor.producer], *kept])


def _earliest(
    graph: Graph,
    order: Order,
    timeline: Timeline,
    room: np.ndarray,
    nbytes: int,
    limit: int,
    t: int,
    low: int,
    first: int,
    latest: float,
) -> int:
    """The trigger step for a copy now triggered at `t`: walking back from it, the first
    valid trigger that ends by `latest`, or the earliest one before the memory runs out."""
    if timeline.base_end[t] <= latest:
        return t
    level = order.level[order.ops[first]]
    best, q = t, t - 1
    while q >= low and room[q] + nbytes <= limit:
        op = order.ops[q]
        if graph.ops[op].type not in NOT_TRIGGERS and order.level[op] < level:
            best = q
            if timeline.base_end[q] <= latest:
                break
        q -= 1
    return best


def _with_triggers(
    plan: SwapPlan, moved: dict[tuple[int, int], str], pos: dict[str, int]
) -> SwapPlan:
    """`plan` with the triggers `moved`; copies of one tensor now live at once are merged."""
    swaps = []
    for i, swap in enumerate(plan.swaps):
        ins = tuple(
            SwapIn(moved.get((i, k), s.trigger), s.consumers) for k, s in enumerate(swap.swap_ins)
        )
        if ins != swap.swap_ins:
            swap = merge_overlapping(replace(swap, swap_ins=ins), pos)
        swaps.append(swap)
    return replace(plan, swaps=tuple(swaps))
