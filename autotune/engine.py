"""Everything a graph needs to evaluate swap parameters fast, computed once and reused.

The order, the lowered program, the plan context and the per-op timeline do not depend on the
parameters, so a search (or one `simulate`) builds them once and then derives and simulates as
many plans as it likes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rewriter.plan import PlanContext, PlanParams, derive_plan
from simulator import (
    BFCModel,
    DevicePreset,
    Graph,
    Order,
    PlanResult,
    Program,
    SwapPlan,
    Timeline,
    categorized_order,
    compile_program,
    lower_bound_bytes,
    simulate_plan,
)
from simulator.memory import paused_gc

__all__ = ["Engine", "Evaluation"]


@dataclass(frozen=True)
class Evaluation:
    """One set of parameters, its plan, and what the simulator predicts for it."""

    params: PlanParams
    plan: SwapPlan
    result: PlanResult
    seconds: float

    @property
    def peak_bytes(self) -> int:
        return self.result.peak_bytes

    @property
    def step_seconds(self) -> float | None:
        return self.result.time.step_seconds if self.result.time else None

    @property
    def overhead(self) -> float | None:
        return self.result.time.overhead if self.result.time else None


@dataclass
class Engine:
    """A graph ready for evaluating plans on one device (or on the CPU, without a device)."""

    graph: Graph
    order: Order
    program: Program
    context: PlanContext
    device: DevicePreset | None
    timeline: Timeline | None
    lower_bound: int

    @classmethod
    def build(
        cls,
        graph: Graph,
        *,
        order: Order | None = None,
        device: DevicePreset | None = None,
        cost: dict[str, float] | None = None,
    ) -> Engine:
        """Lower `graph`; with `cost` (per-op seconds) the time model is on. A cost model that
        gives no op any time (Grappler's resolution is a microsecond, so a tiny step can cost
        nothing) leaves it off: no step time is then predicted rather than a made-up one."""
        order = order or categorized_order(graph)
        context = PlanContext.build(graph, categorized_order(graph))
        timeline = Timeline.build(order, cost) if cost and any(cost.values()) else None
        program = compile_program(graph, order)
        return cls(graph, order, program, context, device, timeline, lower_bound_bytes(graph))

    def allocator(self) -> BFCModel:
        """TensorFlow's GPU BFC (one region) on a device preset, its CPU BFC (growing) without."""
        return BFCModel(allow_growth=self.device is None)

    def evaluate(
        self, params: PlanParams, *, allocator: bool = True, timed: bool = True
    ) -> Evaluation:
        """Derive the plan for `params` and simulate it (time model on if costs were given and
        `timed`; without it copies count as instant, as in the original tool's simulator)."""
        start = time.perf_counter()
        link = self.device.link if self.device and timed else None
        with paused_gc():
            plan = derive_plan(self.context, params)
            result = simulate_plan(
                self.program,
                self.graph,
                plan,
                timeline=self.timeline if timed else None,
                link=link,
                allocator=self.allocator() if allocator else None,
            )
        return Evaluation(params, plan, result, time.perf_counter() - start)
