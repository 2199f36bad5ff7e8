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

Before that, `postpone_waits` moves the other way the waits of synchronized swap-outs of the
forward pass (`PlanParams.sync_out`): a reader waiting for its tensor's copy to the host stalls
the forward pass wherever the link is slower than the compute (ResNet-50's early stages make
3.5 GiB tensors at batch 1145, 55 ms of NVLink each, in less compute than that). Each wait moves
to the first op that starts, in the stall-free schedule, after the copy would end with the
device-to-host stream running the copies one after another in the order they are made, as far
as the memory allows: the device copy may then live until that op, and through its step (a
stalled waiter runs at its own step when the copy ends), so its bytes are added to the live
bytes of every step up to the waiter's, which must stay within the limit. On ResNet-50 at
batch 1145 (v100-16gb-nvlink2, least-memory plan with backward swaps and prefetching) the
forward pass's stalls went from 2.0 s to 0.07 s, and the step from 1.58x to 1.33x.

Triggers stay in the backward pass, after the tensor's last forward reader, and before the
level of the copy's first reader (no cycle, as in `derive.check_plan`); a copy is never
triggered before one needed earlier, so that the stream gets them in the order they are needed
(the time model runs the copies one trigger starts in the order of their readers).
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np

from simulator.derive import can_wait, merge_overlapping, resolve_sources
from simulator.graph import Graph
from simulator.order import Order
from simulator.plan import Swap, SwapIn, SwapPlan
from simulator.timing import Link, Timeline

__all__ = ["postpone_waits", "prefetch", "trigger_levels", "with_triggers"]


def prefetch(
    graph: Graph,
    timeline: Timeline,
    plan: SwapPlan,
    live: np.ndarray,
    limit: int,
    link: Link,
    backward_start: int,
    levels: list[int],
    backward: frozenset[str] = frozenset(),
) -> tuple[SwapPlan, np.ndarray]:
    """`plan` with its swap-ins triggered earlier where `live` (bytes per step) has room under
    `limit` (see the module's docstring), and the live bytes it counts for that plan (`live`
    with each moved or kept copy added where it now lives); `backward_start` is the first
    step of the backward, `levels` the `trigger_levels` of the graph and the timeline's
    order, `backward` the backward pass's ops."""
    order = timeline.order
    pos = order.position
    reads = plan.first_reads(pos)
    items = sorted(
        (reads[swap.tensor, k], i, k)
        for i, swap in enumerate(plan.swaps)
        for k in range(len(swap.swap_ins))
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
        due = latest[i, k]
        q = _earliest(levels, order, timeline, room, swap.nbytes, limit, t, low, first, due)
        if q < t:
            room[q:t] += swap.nbytes
            moved[i, k] = order.ops[q]
        queued = max(queued, q)
    plan = with_triggers(plan, moved, pos) if moved else plan
    plan = _kept(plan, room, limit, pos)
    return (resolve_sources(plan, pos) if plan.recomputes else plan), room


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
        swaps.append(swap.with_swap_ins(tuple(ins)) if len(ins) < len(swap.swap_ins) else swap)
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


def trigger_levels(graph: Graph, order: Order) -> list[int]:
    """Per step of `order`, its op's level where the op may trigger a copy (`can_wait`), else
    a level past every other."""
    never = order.n_levels
    return [order.level[op] if can_wait(graph, op) else never for op in order.ops]


def _earliest(
    levels: list[int],
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
        if levels[q] < level:  # a valid trigger
            best = q
            if timeline.base_end[q] <= latest:
                break
        q -= 1
    return best


def with_triggers(
    plan: SwapPlan, moved: dict[tuple[int, int], str], pos: dict[str, int]
) -> SwapPlan:
    """`plan` with the triggers `moved`; copies of one tensor now live at once are merged."""
    swaps = []
    for i, swap in enumerate(plan.swaps):
        ins = tuple(
            SwapIn(moved.get((i, k), s.trigger), s.consumers) for k, s in enumerate(swap.swap_ins)
        )
        if ins != swap.swap_ins:
            swap = merge_overlapping(swap.with_swap_ins(ins), pos)
        swaps.append(swap)
    return replace(plan, swaps=tuple(swaps))


def postpone_waits(
    graph: Graph,
    timeline: Timeline,
    plan: SwapPlan,
    live: np.ndarray,
    limit: int,
    link: Link,
    backward: frozenset[str] = frozenset(),
    gates: frozenset[str] | None = None,
) -> tuple[SwapPlan, np.ndarray]:
    """`plan` with the synchronized swap-outs of forward tensors waited for later, by a waiter
    where the copy should have ended, as far as `live` (bytes per step) has room under `limit`
    (see the module's docstring), and the live bytes it counts for that plan: `live` with
    each device copy held to its waiter; `backward` holds the backward pass's ops, `gates`
    (if given) the ops a waiter may be (`PlanContext.gates`)."""
    pos = timeline.order.position
    starts = [e - c for e, c in zip(timeline.base_end, timeline.cost)]
    room = live.astype(np.int64)
    waiters: dict[int, str] = {}
    free = 0.0  # when the device-to-host stream is next free
    for produced, i in sorted(
        (pos[graph.tensors[s.tensor].producer], i) for i, s in enumerate(plan.swaps)
    ):
        swap = plan.swaps[i]
        end = max(timeline.base_end[produced], free) + swap.nbytes / link.d2h
        free = end
        if not swap.sync or graph.tensors[swap.tensor].producer in backward:
            continue
        last = _freed(graph, pos, swap)
        cap = min(pos[s.trigger] for s in swap.swap_ins)
        if cap <= last + 1:
            continue  # a copy is triggered before the wait could move
        due = bisect.bisect_left(starts, end, last + 1, cap)  # the first op after the copy
        after = timeline.order.level[graph.tensors[swap.tensor].producer]
        w = _latest_waiter(
            graph, timeline.order, room, (swap.nbytes, limit), (last, due), after, gates
        )
        now = pos[swap.waiter] if swap.waiter else last
        if w > max(now, last):
            waiters[i] = timeline.order.ops[w]
        room[last + 1 : max(w, now) + 1] += swap.nbytes
    if not waiters:
        return plan, room
    swaps = tuple(
        replace(s, waiter=waiters[i]) if i in waiters else s for i, s in enumerate(plan.swaps)
    )
    return replace(plan, swaps=swaps), room


def _latest_waiter(
    graph: Graph,
    order: Order,
    room: np.ndarray,
    size: tuple[int, int],
    steps: tuple[int, int],
    after: int,
    gates: frozenset[str] | None,
) -> int:
    """The latest step up to `due` whose op, of a level past `after` (and among `gates`), can
    wait for a copy of `nbytes` while the copy, held on the device from after step `last`
    through that step (a stalled waiter runs when the copy ends, at its own step), fits in
    `room` under `limit` (`size`: nbytes, limit; `steps`: last, due); `last` (the readers
    wait) when there is none."""
    (nbytes, limit), (last, due) = size, steps
    if room[last + 1] + nbytes > limit:
        return last
    w = last + 1
    while w < due and room[w + 1] + nbytes <= limit:
        w += 1

    def unusable(op: str) -> bool:
        gated = gates is None or op in gates
        return not gated or not can_wait(graph, op) or order.level[op] <= after

    while w > last and unusable(order.ops[w]):
        w -= 1
    return w if w > last else last
