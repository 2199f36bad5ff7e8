"""Everything a graph needs to evaluate swap parameters fast, computed once and reused.

The order, the lowered program, the plan context and the per-op timeline do not depend on the
parameters, so a search (or one `simulate`) builds them once and then derives and simulates as
many plans as it likes. Parameters with `serialize` are evaluated on a second engine: the graph
with the order edges that lower its least-memory peak, found once and shared by the engines of
one step at batch sizes near the one they were found at (`shared`, `EDGE_REUSE`; found again
for a graph that lacks one of their ops).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

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
    reuse,
    simulate_plan,
)
from simulator.bounds import time_bound_seconds
from simulator.derive import (
    PlanContext,
    PlanParams,
    RecomputePrice,
    remake_chain,
)
from simulator.edge_search import order_edges
from simulator.heap import GRANULARITY, round_up
from simulator.memory import paused_gc
from simulator.opsemantics import (
    SHAPE_ONLY,
)
from simulator.order_edges import Edge
from simulator.prefetch import trigger_levels
from simulator.refine import Finish, Planned, delayed, guarded, late_swaps, plan_of
from simulator.replay import with_allocator
from simulator.timing import Link, TimeResult, simulate_time

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
    def host_peak_bytes(self) -> int:
        """Swapped tensors' bytes held on the host at once."""
        return self.result.host_peak_bytes

    @property
    def step_seconds(self) -> float | None:
        return self.result.time.step_seconds if self.result.time else None

    @property
    def overhead(self) -> float | None:
        return self.result.time.overhead if self.result.time else None

    @property
    def recompute_seconds(self) -> float | None:
        """Compute time the plan's recomputes add per step (None without the time model)."""
        return self.result.time.recompute_seconds if self.result.time else None

    @property
    def waits_seconds(self) -> dict[str, float] | None:
        """What the step waits for, in seconds (`TimeResult.waits`; None without the time
        model)."""
        return self.result.time.waits() if self.result.time else None


#: order edges found for one batch are reused for the same step at a batch whose lower bound is
#: within this factor: the edges that lower the peak change with the share of activations in it
#: (docs/method.md, "Constants")
EDGE_REUSE = 1.5


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
    cost: dict[str, float] | None = None
    recorded: bool = False
    shared: dict[str, Any] = field(default_factory=dict)
    edges: tuple[Edge, ...] = ()
    #: the loops this engine's graph runs one iteration at a time (`serialized`)
    serial_loops: tuple[str, ...] = ()
    _serialized: Engine | None = None
    _bare: dict[Any, PlanResult] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        graph: Graph,
        *,
        order: Order | None = None,
        device: DevicePreset | None = None,
        cost: dict[str, float] | None = None,
        shared: dict[str, Any] | None = None,
        lower_bound: int | None = None,
        like: Engine | None = None,
        resized: Engine | None = None,
    ) -> Engine:
        """Lower `graph`; with `cost` (per-op seconds) the time model is on. A cost model that
        gives no op any time (Grappler's resolution is a microsecond, so a tiny step can cost
        nothing) leaves it off: no step time is then predicted rather than a made-up one.
        An `order` given (a recorded schedule) is kept: such an engine is never serialized.
        `lower_bound` saves its computation when it is known (it does not depend on order);
        `like`, an engine of this graph without some of its control edges, saves what follows
        data edges alone (`PlanContext.build`) and what each op places (`compile_program`);
        `resized`, an engine of this graph at other sizes (its ops and edges), saves the levels,
        what follows data edges alone, and the lowering but for the sizes."""
        same = like or resized
        levels = resized.context.order if resized else categorized_order(graph)
        walk = order or levels
        context = PlanContext.build(graph, levels, like=same.context if same else None)
        timeline = Timeline.build(walk, cost) if cost and any(cost.values()) else None
        program = compile_program(
            graph,
            walk,
            like=like.program if like else None,
            resized=resized.program if resized else None,
        )
        bound = lower_bound_bytes(graph) if lower_bound is None else lower_bound
        engine = cls(graph, walk, program, context, device, timeline, bound, cost)
        engine.recorded = order is not None
        engine.shared = {} if shared is None else shared
        return engine

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the simulations kept for reuse (a cache, and large)."""
        return {**self.__dict__, "_bare": {}}

    def serialized(self) -> Engine:
        """This step with the order edges that lower its least-memory peak and its loops run
        one iteration at a time (itself when there are neither, or when its order was
        recorded)."""
        if self.recorded or self.edges or self.serial_loops:
            return self
        if self._serialized is None:
            edges = self._shared_edges()
            if edges is None:
                edges = order_edges(self._with_edges(()))
                self.shared.setdefault("edges", {})[self.lower_bound] = edges
            self._serialized = self._with_edges(edges)
        return self._serialized

    def ordered_like(self, other: Engine) -> Engine:
        """This step with the order edges `other` (the same step at another size) runs with:
        one plan's parameters evaluated across sizes without a search of edges at each (that
        search is most of such an evaluation). `serialized()` when this graph lacks one of
        their ops, or when either engine keeps a recorded order."""
        edges = other.serialized().edges
        if self.recorded or not edges or not all(n in self.graph.ops for e in edges for n in e):
            return self.serialized()
        return self._with_edges(edges)

    def _shared_edges(self) -> tuple[Edge, ...] | None:
        """Edges found for a graph of this step whose lower bound is within `EDGE_REUSE` of
        this one's (the nearest), if they name only ops this graph has."""
        found: dict[int, tuple[Edge, ...]] = self.shared.get("edges", {})
        near = [
            (abs(bound - self.lower_bound), edges)
            for bound, edges in found.items()
            if max(bound, self.lower_bound) <= EDGE_REUSE * max(1, min(bound, self.lower_bound))
            and all(n in self.graph.ops for e in edges for n in e)
        ]
        return min(near, key=lambda x: x[0])[1] if near else None

    def backward_level(self) -> int:
        """The first level of the backward pass: its first op that reads anything."""
        return min((self.order.level[n] for n in self._backward_readers), default=0)

    @functools.cached_property
    def trigger_levels(self) -> list[int]:
        """`prefetch.trigger_levels` of this engine's graph and order."""
        return trigger_levels(self.graph, self.order)

    @functools.cached_property
    def _backward_readers(self) -> tuple[str, ...]:
        """The backward pass's ops that read anything."""
        return tuple(n for n in self.context.flow if self.graph.predecessors(n))

    @functools.cached_property
    def backward_start(self) -> int:
        """The step of the backward pass's first op that reads a forward candidate (not only
        its shape), or else its first op that reads anything: an op of the gradient tape that
        reads only constants (ResNet-50's padding specs) runs long before the backward pass."""
        pos, graph, backward = self.order.position, self.graph, self.context.flow
        firsts = [
            pos[r]
            for c in self.context.candidates
            if not c.made_in_backward
            for r in graph.tensors[c.tensor].consumers
            if r in backward and graph.ops[r].type not in SHAPE_ONLY
        ]
        return min(firsts or [pos[n] for n in self._backward_readers] or [0])

    def _with_edges(self, edges: tuple[Edge, ...]) -> Engine:
        """This step with `edges` and its loops run one iteration at a time."""
        loops = self.graph.parallel_loops
        if not edges and not loops:
            return self
        graph = self.graph.with_control_edges(edges).with_serial_loops(loops)
        engine = Engine.build(
            graph,
            device=self.device,
            cost=self.cost,
            shared=self.shared,
            lower_bound=self.lower_bound,
            like=self,
        )
        engine.edges, engine.serial_loops = edges, loops
        return engine

    def time_bound(
        self, budget_bytes: int, *, ordered: bool = True, ordered_by: Engine | None = None
    ) -> float | None:
        """The least step time any plan could reach within `budget_bytes` (see
        `simulator.bounds`), over plans in this order and, `ordered`, with order edges: those
        of `ordered_by` (this step with another size's edges, `ordered_like`) if given, else
        its own (`serialized`); None without the time model or when no plan fits (the budget
        under the lower bound)."""
        if self.timeline is None or self.device is None or budget_bytes < self.lower_bound:
            return None
        compute = self.timeline.baseline_seconds
        bound = self._order_time_bound(budget_bytes)
        if ordered and bound > compute:
            other = ordered_by or self.serialized()
            bound = min(bound, other._order_time_bound(budget_bytes))
        return max(bound, compute)  # the two orders' sums of the same costs may differ in ulps

    def _order_time_bound(self, budget_bytes: int) -> float:
        """The time bound over plans in this engine's order: split at its live peak's step."""
        assert self.timeline is not None and self.device is not None
        bare = self.evaluate(PlanParams(n_tensors=0), allocator=False, timed=False)
        memory, timeline = bare.result.memory, self.timeline
        # memory counts allocations (rounded up), a link carries a tensor's own bytes: the
        # candidates' rounding could fill this many of the bytes to remove with no transfer
        over = memory.live_peak_bytes - budget_bytes - self._rounding()
        p = memory.peak_step
        before = timeline.base_end[p] - timeline.cost[p]
        after = timeline.baseline_seconds - before
        return time_bound_seconds(before, after, over, self.device.link, self._recompute_tiers)

    def _rounding(self) -> int:
        """The bytes the candidate tensors' allocations hold beyond the tensors themselves."""
        sizes = [self.graph.tensors[c.tensor].nbytes for c in self.context.candidates]
        return sum(round_up(n, GRANULARITY) - n for n in sizes)

    @functools.cached_property
    def _recompute_tiers(self) -> list[tuple[int, float]]:
        """Per buffer of a forward candidate a plan could recompute, its allocated bytes and
        the least seconds per byte any recompute of it costs: the ops its chain must re-run
        (`remake_chain`: a bias add's output, written over its convolution's, is made again
        by the convolution too), each op's seconds split among the chains that share it (a
        plan recomputing several of them may run it once)."""
        cost = self.cost or {}
        chains: dict[str, tuple[str, ...]] = {}
        for c in self.context.candidates:
            root = self.graph.buffer_root(c.tensor)
            if not c.made_in_backward and root not in chains:
                ops = remake_chain(self.context, c)
                if ops is not None:
                    chains[root] = ops
        sharing = Counter(o for ops in chains.values() for o in ops)
        out = []
        for root, ops in chains.items():
            n = round_up(self.graph.tensors[root].nbytes, GRANULARITY)
            out.append((n, sum(cost.get(o, 0.0) / sharing[o] for o in ops) / n))
        return out

    def allocator(self) -> BFCModel:
        """TensorFlow's GPU BFC (one region) on a device preset, its CPU BFC (growing) without."""
        return BFCModel(allow_growth=self.device is None)

    def evaluate(
        self, params: PlanParams, *, allocator: bool = True, timed: bool = True
    ) -> Evaluation:
        """Derive the plan for `params` and simulate it (time model on if costs were given and
        `timed`; without it copies count as instant, as in the original tool's simulator)."""
        if params.serialize and not (self.edges or self.serial_loops):
            target = self.serialized()
            if target is not self:
                return target.evaluate(params, allocator=allocator, timed=timed)
        start = time.perf_counter()
        link = self.device.link if self.device and timed else None
        with paused_gc():
            late = late_swaps(self, params, link)
            planned = plan_of(self, params, frozenset(), link, late)
            finish = Finish(self, link, timed, allocator)
            plan, result = planned.plan, finish(planned)
            if params.limit and plan.recomputes:
                plan, result = guarded(self, params, planned, result, late, finish)
            if params.limit and plan.swaps:
                plan, result = delayed(self, params, plan, result, finish)
        return Evaluation(params, plan, result, time.perf_counter() - start)

    def simulate(self, plan: SwapPlan) -> PlanResult:
        """Simulate a given plan (derived elsewhere) with the allocator and the time model."""
        link = self.device.link if self.device else None
        with paused_gc():
            return self._simulate(plan, link, True, True)

    @functools.cached_property
    def recompute_price(self) -> RecomputePrice | None:
        """What heavy recomputes are weighed with (None without a cost model or a device)."""
        if not self.cost or self.device is None:
            return None
        return RecomputePrice(self.cost, self.device.link)

    def _simulate(
        self,
        plan: SwapPlan,
        link: Link | None,
        timed: bool,
        allocator: bool,
        timing: TimeResult | None = None,
    ) -> PlanResult:
        return simulate_plan(
            self.program,
            self.graph,
            plan,
            timeline=self.timeline if timed else None,
            link=link,
            allocator=self.allocator() if allocator else None,
            timing=timing,
        )

    def timed(self, plan: SwapPlan, link: Link | None) -> TimeResult | None:
        """The time model alone on `plan` (None without one or a `link`): a step of
        derivation that keeps a plan only if it is faster reads this before simulating its
        memory."""
        if self.timeline is None or link is None:
            return None
        return simulate_time(self.graph, self.timeline, plan, link)

    def simulate_bare(
        self, plan: SwapPlan, link: Link | None, timing: TimeResult | None = None
    ) -> PlanResult:
        """`plan` simulated with the time model (given a `link`; `timing`, its result from
        `timed`, if known) and without the allocator, as plan derivation reads it.
        Derivation's steps often simulate a plan another step or evaluation has (a prefetch
        that moved nothing, a guard's round that gave back nothing, a neighbour's plan without
        its backward swaps): the last `reuse.BARE_MEMO` such simulations are kept."""
        key = (plan.swaps, plan.recomputes, plan.order_edges, plan.serial_loops, link)
        got = self._bare.get(key)
        if got is None:
            got = self._bare[key] = self._simulate(plan, link, True, False, timing)
        reuse.keep(self._bare, key)
        return got if got.plan is plan else replace(got, plan=plan)

    def finish(
        self, planned: Planned, link: Link | None, timed: bool, allocator: bool
    ) -> PlanResult:
        """A derived plan simulated as an evaluation reports it: derivation's own simulation
        of it, with the allocator's peak added, where it made one (with the same link)."""
        made = planned.result
        if made is None or not timed or link is None:
            return self._simulate(planned.plan, link, timed, allocator)
        memory = with_allocator(made.memory, self.allocator()) if allocator else made.memory
        return PlanResult(memory, made.time, planned.plan)
