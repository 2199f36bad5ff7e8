"""Simulate one step with a swap plan: time model first, then memory, then the allocator."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.allocator import BFCModel
from simulator.graph import Graph
from simulator.memory import SimResult, paused_gc, simulate_memory
from simulator.plan import SwapPlan
from simulator.program import Program
from simulator.replay import with_allocator
from simulator.swap import lower_plan
from simulator.timing import Link, Timeline, TimeResult, simulate_time

__all__ = ["PlanResult", "simulate_plan"]


@dataclass(frozen=True)
class PlanResult:
    """Device memory (with the allocator's peak), host memory and, given costs, step time."""

    memory: SimResult
    time: TimeResult | None
    plan: SwapPlan

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def host_peak_bytes(self) -> int:
        return self.memory.host_peak_bytes


def simulate_plan(
    program: Program,
    graph: Graph,
    plan: SwapPlan,
    *,
    timeline: Timeline | None = None,
    link: Link | None = None,
    allocator: BFCModel | None = None,
    timing: TimeResult | None = None,
) -> PlanResult:
    """Simulate `plan` on the lowered graph. With a `timeline` (per-op compute seconds in this
    schedule) and a `link`, the time model decides when
    each swapped-out device copy may be freed; without, copies are taken to be instant. With an
    `allocator`, the reported peak is the one it reaches replaying the trace. `timing`, the
    time model's result for this plan, timeline and link if already known, is not made again."""
    with paused_gc():
        return _simulate_plan(program, graph, plan, timeline, link, allocator, timing)


def _simulate_plan(
    program: Program,
    graph: Graph,
    plan: SwapPlan,
    timeline: Timeline | None,
    link: Link | None,
    allocator: BFCModel | None,
    timing: TimeResult | None,
) -> PlanResult:
    if timing is None and timeline is not None and link is not None:
        timing = simulate_time(graph, timeline, plan, link)
    lowered = lower_plan(program, graph, plan, timing.released if timing else None)
    memory = simulate_memory(lowered)
    if allocator is not None:
        memory = with_allocator(memory, allocator)
    return PlanResult(memory, timing, plan)
