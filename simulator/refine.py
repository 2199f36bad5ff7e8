"""The steps of plan derivation that read a simulation of the plan: which backward tensors to
swap, prefetching, the recompute guard, and swap-ins delayed past the peak.

Each step simulates the plan it is given (the time model on, no allocator), and hands on the
last simulation it made of the plan it returns, so that the engine does not simulate that plan
again (`Planned`). The tensors of the backward pass worth swapping (`late_swaps`) are chosen
once per evaluation, from the plan without them and without guard, and kept through the
guard's rounds and give-backs: those only turn recomputes into swaps, which moves few bytes.
How many simulations each step makes is bounded by the constants below; the figures behind
them are in docs/method.md, "Constants".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from simulator.derive import PlanParams, derive_plan, resolve_sources
from simulator.graph import Graph
from simulator.plan import SwapPlan
from simulator.prefetch import postpone_waits, prefetch, with_triggers
from simulator.run import PlanResult
from simulator.timing import Link
from simulator.trace import copy_name, remade_name

if TYPE_CHECKING:
    from simulator.engine import Engine

__all__ = [
    "DELAY_ROUNDS",
    "GUARD_RELEASES",
    "GUARD_ROUNDS",
    "PREFETCH_ROUNDS",
    "Finish",
    "Planned",
    "delayed",
    "guarded",
    "late_swaps",
    "plan_of",
]

#: at most this many rounds of swapping recomputes that hold bytes at the peak instead
GUARD_ROUNDS = 8
#: then at most this many of the recomputes it swapped instead, the largest, are tried again
GUARD_RELEASES = 32
#: with backward tensors swapped, at most this many rounds of prefetching under a lower limit
PREFETCH_ROUNDS = 3
#: at most this many rounds of delaying the swap-ins live at a peak over the limit
DELAY_ROUNDS = 4


@dataclass(frozen=True)
class Planned:
    """A derived plan, and its simulation (time model on, no allocator) if derivation made one,
    else the live bytes per step derivation counted for it, if it counted them."""

    plan: SwapPlan
    result: PlanResult | None = None
    live: np.ndarray | None = field(default=None, compare=False)


def plan_of(
    engine: Engine,
    params: PlanParams,
    keep: frozenset[str],
    link: Link | None,
    late: frozenset[str] | None,
) -> Planned:
    """The plan of `params` (never recomputing `keep`; of the backward tensors, swapping
    `late`, as `late_swaps` chose them), with its order edges, prefetched."""
    plan = derived(engine, params, keep, late)
    if params.prefetch_bytes and plan.swaps and link and engine.timeline:
        return prefetched(engine, plan, params.prefetch_bytes, link, params.postpone_waits)
    return Planned(plan)


def derived(
    engine: Engine, params: PlanParams, keep: frozenset[str], late: frozenset[str] | None
) -> SwapPlan:
    """The plan of `params` as derived, before prefetching, with the engine's order edges."""
    plan = derive_plan(engine.context, params, keep, late, engine.recompute_price)
    if not engine.edges and not engine.serial_loops:
        return plan
    return replace(plan, order_edges=engine.edges, serial_loops=engine.serial_loops)


def late_swaps(engine: Engine, params: PlanParams, link: Link | None) -> frozenset[str] | None:
    """With `backward_swaps` and a `limit`, the backward pass's candidates live (from their
    producer to their last reader) at a step where the plan of `params` without backward
    swaps passes `limit` live bytes: swapping them can lower those steps, swapping
    the others only costs time. None otherwise (all backward candidates, if any, are swapped)."""
    if not (params.backward_swaps and params.limit):
        return None
    planned = plan_of(engine, replace(params, backward_swaps=False), frozenset(), link, None)
    live = planned.live if planned.live is not None else live_bytes(engine, planned.plan, link)
    over = np.flatnonzero(live > params.limit)
    graph, pos = engine.graph, engine.order.position
    out = set()
    for c in engine.context.candidates:
        if c.made_in_backward:
            tensor = graph.tensors[c.tensor]
            first, last = pos[tensor.producer], max(pos[r] for r in tensor.consumers)
            i = int(np.searchsorted(over, first))
            if i < len(over) and over[i] <= last:
                out.add(c.tensor)
    return frozenset(out)


def live_bytes(engine: Engine, plan: SwapPlan, link: Link | None) -> np.ndarray:
    """The live device bytes at each step of `plan`, timed with a `link`."""
    memory = engine.simulate_bare(plan, link).memory
    return memory.trace.live_by_step(len(engine.order.ops), memory.persistent_bytes)


def prefetched(
    engine: Engine, plan: SwapPlan, limit: int, link: Link, postpone: bool = True
) -> Planned:
    """`plan` with the waits for synchronized swap-outs moved later and swap-ins earlier,
    where its live bytes leave room under `limit` (`simulator.prefetch`; the waits only
    with `postpone`: the live bytes cannot show that later frees may fragment the heap).
    The plan is simulated once, before the waits move; the swap-ins are then moved with the
    live bytes `postpone_waits` counts for its moves (each copy held to its new waiter).

    With tensors of the backward pass swapped, fewer stalls make their device copies live
    longer (until their copies to the host end, at later steps), which the live bytes
    simulated before the moves do not show: while the moved plan's live peak passes
    `limit`, the moves are made again under a limit lower by the excess (at most
    `PREFETCH_ROUNDS` times)."""
    timeline, graph = engine.timeline, engine.graph
    assert timeline is not None
    backward = engine.context.backward
    live = live_bytes(engine, plan, link)
    if postpone and any(s.sync for s in plan.swaps):
        gates = engine.context.gates
        plan, live = postpone_waits(graph, timeline, plan, live, limit, link, backward, gates)
    start, levels = engine.backward_start, engine.trigger_levels
    if not any(graph.tensors[s.tensor].producer in backward for s in plan.swaps):
        moved, counted = prefetch(graph, timeline, plan, live, limit, link, start, levels, backward)
        return Planned(moved, live=counted)
    room = limit
    for _ in range(PREFETCH_ROUNDS):
        moved, _ = prefetch(graph, timeline, plan, live, room, link, start, levels, backward)
        result = engine.simulate_bare(moved, link)
        peak = result.memory.live_peak_bytes
        if peak <= limit:
            break
        room -= peak - limit
    return Planned(moved, result)


def guarded(
    engine: Engine,
    params: PlanParams,
    planned: Planned,
    result: PlanResult,
    late: frozenset[str] | None,
    finish: Finish,
) -> tuple[SwapPlan, PlanResult]:
    """While the peak passes the `limit`, swap instead the recomputes whose chains
    hold bytes at the peak (a chain's intermediates, or a source swap-in brought forward
    for it, can outweigh the tensor it makes), for at most `GUARD_ROUNDS` rounds: alike
    blocks peak alike, one after another, so the peak may first rise; the lowest peak
    found is kept, then `released` gives back the recomputes it did not need. `finish`
    simulates a derived plan as the evaluation does (its allocator, its time model)."""
    keep: frozenset[str] = frozenset()
    plan = planned.plan
    best = (keep, plan, result)
    for _ in range(GUARD_ROUNDS):
        if result.peak_bytes <= params.limit:
            break
        blamed = _at_peak(engine.graph, plan, result) - keep
        if not blamed:
            break
        keep |= blamed
        planned = plan_of(engine, params, keep, finish.link, late)
        plan, made = planned.plan, planned.result
        if (
            made is not None
            and made.memory.live_peak_bytes > params.limit
            and (made.memory.live_peak_bytes >= best[2].peak_bytes)
        ):  # its allocator's peak can neither fit nor be the lowest: not replayed
            result = made
        else:
            result = finish(planned)
        if result.peak_bytes < best[2].peak_bytes:
            best = (keep, plan, result)
    if best[0] and best[2].time is not None and best[2].peak_bytes <= params.limit:
        return released(engine, params, *best, late, finish)
    return best[1], best[2]


def delayed(
    engine: Engine, params: PlanParams, plan: SwapPlan, result: PlanResult, finish: Finish
) -> tuple[SwapPlan, PlanResult]:
    """While the peak passes the `limit`, the swap-ins live at it whose readers all come
    after it wait for the peak's op instead, or the first op after it that may trigger them
    (`_past_peak`): they then arrive once the step that holds the most has freed its inputs,
    with less time for the link. A round is kept only where it lowers the peak; at most
    `DELAY_ROUNDS` rounds. A swap-in a recompute reads stays where it is."""
    for _ in range(DELAY_ROUNDS):
        if result.peak_bytes <= params.limit:
            break
        moved = _past_peak(engine, plan, result)
        if moved is None:
            break
        made = finish(Planned(moved))
        if made.peak_bytes >= result.peak_bytes:
            break
        plan, result = moved, made
    return plan, result


def _past_peak(engine: Engine, plan: SwapPlan, result: PlanResult) -> SwapPlan | None:
    """`plan` with each swap-in live at `result`'s peak step and first read after it
    triggered at that step or the first one after it whose op may trigger it (a level
    before its readers', `trigger_levels`); None if there is none to move."""
    order, levels = engine.order, engine.trigger_levels
    pos, memory = order.position, result.memory
    peak = memory.peak_step
    live = memory.trace.live_at(peak)
    sources = {s for rc in plan.recomputes for s in rc.sources}
    moved: dict[tuple[int, int], str] = {}
    for i, swap in enumerate(plan.swaps):
        for k, s in enumerate(swap.swap_ins):
            if copy_name(swap.tensor, k) not in live or (swap.tensor, k) in sources:
                continue
            first = min(pos[c] for c in s.consumers)
            level = order.level[order.ops[first]]
            start = max(peak, pos[s.trigger] + 1)
            q = next((q for q in range(start, first) if levels[q] < level), None)
            if q is not None:
                moved[i, k] = order.ops[q]
    if not moved:
        return None
    plan = with_triggers(plan, moved, pos)
    return resolve_sources(plan, pos) if plan.recomputes else plan


def released(
    engine: Engine,
    params: PlanParams,
    keep: frozenset[str],
    plan: SwapPlan,
    result: PlanResult,
    late: frozenset[str] | None,
    finish: Finish,
) -> tuple[SwapPlan, PlanResult]:
    """The guard swaps all the recomputes at a peak at once, where fewer would do: recompute
    again each tensor it kept (at most `GUARD_RELEASES`, largest first) where the peak
    stays within the `limit` and the step gets shorter.

    A try is one simulation: the plan derived without that tensor kept, its swaps that
    derivation left as they were given the swap-ins `plan` was prefetched to
    (`transplanted`), its memory walked only if the time model says it is faster. Once the
    tries are done, if any gave a tensor back, the plan is also derived and prefetched in
    full for what stays kept (`plan_of`), and taken if better."""
    tried = sorted(keep, key=lambda t: (-engine.graph.tensors[t].nbytes, t))
    limit, start = params.limit, keep
    raw = derived(engine, params, keep, late)
    for name in tried[:GUARD_RELEASES]:
        again = derived(engine, params, keep - {name}, late)
        moved = transplanted(engine, again, raw, plan)
        timing = engine.timed(moved, finish.link)
        if timing is not None and timing.step_seconds >= _seconds(result):
            continue  # not faster: its memory does not matter
        made = engine.simulate_bare(moved, finish.link, timing)
        if not _may_win(made, limit, result):  # the allocator's peak is not below the live one
            continue
        got = finish(Planned(moved, made))
        if got.peak_bytes <= limit and _seconds(got) < _seconds(result):
            keep, raw, plan, result = keep - {name}, again, moved, got
    if keep != start and params.prefetch_bytes:
        got = finish(full := plan_of(engine, params, keep, finish.link, late))
        if got.peak_bytes <= limit and _seconds(got) < _seconds(result):
            plan, result = full.plan, got
    return plan, result


def transplanted(engine: Engine, plan: SwapPlan, raw: SwapPlan, done: SwapPlan) -> SwapPlan:
    """`plan` (as derived) with each swap that `raw` (derived for another set of kept
    tensors) has as well taken as `done` (`raw` prefetched) has it."""
    before = {s.tensor: s for s in raw.swaps}
    after = {s.tensor: s for s in done.swaps}
    swaps = tuple(
        after[s.tensor] if before.get(s.tensor) == s and s.tensor in after else s
        for s in plan.swaps
    )
    plan = replace(plan, swaps=swaps)
    return resolve_sources(plan, engine.order.position) if plan.recomputes else plan


class Finish:
    """Simulates a derived plan as one evaluation does: its link, allocator and time model."""

    def __init__(self, engine: Engine, link: Link | None, timed: bool, allocator: bool):
        self.engine, self.link, self.timed, self.allocator = engine, link, timed, allocator

    def __call__(self, planned: Planned) -> PlanResult:
        return self.engine.finish(planned, self.link, self.timed, self.allocator)


def _may_win(made: PlanResult, limit: int, best: PlanResult) -> bool:
    """Whether a plan derivation simulated may fit `limit` and beat `best`'s time: the
    allocator's peak is never below the live one, and it does not change the time."""
    return made.memory.live_peak_bytes <= limit and _seconds(made) < _seconds(best)


def _seconds(result: PlanResult) -> float:
    return result.time.step_seconds if result.time else math.inf


def _at_peak(graph: Graph, plan: SwapPlan, result: PlanResult) -> frozenset[str]:
    """The tensors whose recomputes hold bytes at the live peak: a copy the chain made, or a
    swap-in it reads."""
    memory = result.memory
    live = memory.trace.live_at(memory.peak_step)
    out = set()
    for rc in plan.recomputes:
        held = {remade_name(t) for t in rc.made(graph)} | {copy_name(t, k) for t, k in rc.sources}
        if not held.isdisjoint(live):
            out.add(rc.tensor)
    return frozenset(out)
