"""The public Python API: capture a step, simulate its memory, measure it on the real device."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from autotune.calibration import resolve_device
from rewriter.capture import Captured, CaptureError, capture_function
from rewriter.keras_step import input_specs, is_keras_model, training_step
from simulator import (
    DevicePreset,
    Graph,
    Order,
    SimResult,
    SwapPlan,
    Trace,
    executor_order,
    executor_orders,
    scheduled_order,
)
from simulator.derive import PlanParams
from simulator.engine import Engine, Evaluation
from simulator.errors import UserError
from simulator.opsemantics import LOOP_TYPES

if TYPE_CHECKING:
    from autotune.run.profile import Profile
    from rewriter.cpukernels import CpuKernels

__all__ = ["Simulation", "capture", "simulate"]


PLAN_OPTIONS = frozenset(f.name for f in fields(PlanParams))


@dataclass(frozen=True)
class Simulation:
    """A simulated step: device and host peaks, step time, where the peak is, and the trace."""

    graph: Graph
    evaluation: Evaluation
    baseline: Evaluation
    lower_bound_bytes: int
    simulate_seconds: float
    trace_seconds: float
    schedule: str = "categorized"
    device: str | None = None
    profiled_peak_bytes: int | None = None
    cpu_kernels: dict[str, Any] | None = None  # the CPU kernels modelled (no device preset)
    order_peaks: tuple[int, ...] = ()  # each sampled executor order's peak, smallest first
    #: the least step time any plan in this order could reach within the preset's memory
    #: times the default safety ratio (`simulator.bounds`); None without a preset
    time_bound_seconds: float | None = None

    @property
    def result(self) -> SimResult:
        return self.evaluation.result.memory

    @property
    def plan(self) -> SwapPlan:
        return self.evaluation.plan

    @property
    def peak_bytes(self) -> int:
        return self.result.peak_bytes

    @property
    def persistent_bytes(self) -> int:
        return self.result.persistent_bytes

    @property
    def host_peak_bytes(self) -> int:
        return self.result.host_peak_bytes

    @property
    def trace(self) -> Trace:
        return self.result.trace

    @property
    def step_seconds(self) -> float | None:
        return self.evaluation.step_seconds

    @property
    def baseline_step_seconds(self) -> float | None:
        return self.baseline.step_seconds

    @property
    def overhead(self) -> float | None:
        return self.evaluation.overhead

    @property
    def swapped_tensors(self) -> int:
        return len(self.plan.swaps)

    @property
    def recompute_seconds(self) -> float | None:
        """Compute time the plan's recomputes add per step (None without the time model)."""
        return self.evaluation.recompute_seconds

    def to_dict(self) -> dict[str, Any]:
        """The fields of `autotune simulate --json`."""
        r = self.result
        return {
            "ops": len(self.graph.ops),
            "levels": r.order.n_levels,
            "persistent_bytes": r.persistent_bytes,
            "peak_bytes": r.peak_bytes,
            "live_peak_bytes": r.live_peak_bytes,
            "host_peak_bytes": r.host_peak_bytes,
            "baseline_peak_bytes": self.baseline.peak_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "step_seconds": self.step_seconds,
            "baseline_step_seconds": self.baseline_step_seconds,
            "overhead": self.overhead,
            "swapped_tensors": self.swapped_tensors,
            "swapped_bytes": self.plan.swapped_bytes,
            "recomputed_tensors": self.plan.recomputed_tensors,
            "recomputed_bytes": self.plan.recomputed_bytes,
            "recompute_seconds": self.recompute_seconds,
            "waits_seconds": self.evaluation.waits_seconds,
            "time_bound_seconds": self.time_bound_seconds,
            "order_edges": [list(e) for e in self.plan.order_edges],
            "serial_loops": list(self.plan.serial_loops),
            "params": self.evaluation.params.to_dict(),
            **{k: getattr(r, k) for k in ("peak_op", "peak_level", "peak_step")},
            "largest_at_peak": [
                {"tensor": t, "bytes": b} for t, b in r.largest_at_peak(PEAK_TENSORS)
            ],
            "simulate_seconds": self.simulate_seconds,
            "trace_seconds": self.trace_seconds,
            "schedule": self.schedule,
            "device": self.device,
            "profiled_peak_bytes": self.profiled_peak_bytes,
            "cpu_kernels": self.cpu_kernels,
            "order_peaks": list(self.order_peaks),
        }


def capture(
    step: Any,
    *example_args: Any,
    loss: Any = None,
    optimizer: Any = None,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    distributed: Any = None,
) -> Captured:
    """Capture a tf.function step with example args, or a Keras model with loss and optimizer
    (a step captured already is returned as it is). With `distributed`
    (`rewriter.replicas.Distributed`) the step runs on several replicas and takes each
    replica's tensors (`Distributed.flat`)."""
    if isinstance(step, Captured):
        return step
    if not is_keras_model(step):
        if not example_args:
            raise CaptureError("give example arguments (tensors or tf.TensorSpecs) for the step")
        return capture_function(step, *example_args, distributed=distributed)
    if loss is None or optimizer is None:
        raise CaptureError("a Keras model needs loss= and optimizer= to build its training step")
    if not example_args:
        if batch_size is None:
            raise CaptureError("a Keras model needs batch_size= (or example x, y) to size tensors")
        example_args = input_specs(step, loss, batch_size, input_shape)
    return capture_function(training_step(step, loss, optimizer), *example_args)


SCHEDULES = ("auto", "categorized", "executor", "recorded")
#: Executor orders `simulate` draws for the CPU (TensorFlow's differs between processes); the
#: prediction is the one whose peak is their median. Odd, so that the median is one of them.
ORDER_SAMPLES = 15
#: How many of the largest tensors live at the peak `simulate --json` lists.
PEAK_TENSORS = 10
COSTS = ("analytical", "measured")


def simulate(
    step: Any,
    *example_args: Any,
    schedule: str = "auto",
    device: str | DevicePreset | None = None,
    costs: str = "analytical",
    **options: Any,
) -> Simulation:
    """Capture `step` (see `capture`) and simulate one training step, with a swap plan when
    plan options (`n_tensors=`, `lb=`, `ub=`, `threshold=`, `groupby=`, `trigger=`, ...) are
    given, on a device preset (`device=`) for the time model.

    `schedule="categorized"` walks the paper's categorized order and needs no device;
    `schedule="executor"` walks the graph TensorFlow runs (after Grappler and, on a oneDNN
    CPU, after oneDNN's graph pass) in the order its executor takes with one inter-op thread,
    emulated without running the step (the real peak of the step as it is, see results/). On
    a oneDNN CPU that order differs between processes (`simulator.executor_orders`): the
    result is the one of `ORDER_SAMPLES` drawn orders whose peak is their median, and
    `order_peaks` holds the peak of each;
    `schedule="recorded"` first runs the step once on the current device under the profiler
    and walks the order TensorFlow executed. Plans are simulated in the categorized order only,
    the order their rewritten step is pinned to; the default, "auto", is the executor's order
    for the step as it is on this CPU (no plan, no device preset), and the categorized order
    otherwise.
    `costs` are per-op times: Grappler's analytical estimates for the preset, or those measured
    in a profiled step on the current device.
    """
    plan_kw = {k: options.pop(k) for k in list(options) if k in PLAN_OPTIONS}
    captured = capture(step, *example_args, **options)
    params = PlanParams(**plan_kw) if plan_kw else None
    return simulate_captured(captured, schedule=schedule, device=device, params=params, costs=costs)


def simulate_captured(
    captured: Captured,
    *,
    schedule: str = "auto",
    device: str | DevicePreset | None = None,
    params: PlanParams | None = None,
    costs: str = "analytical",
) -> Simulation:
    """Simulate an already captured step: see `simulate`."""
    _check_choice("schedule", schedule, SCHEDULES)
    _check_choice("costs", costs, COSTS)
    preset = resolve_device(device)
    from autotune.run.measure import current_device
    from rewriter.cpukernels import cpu_kernels

    device_name = current_device()
    kernels = cpu_kernels() if preset is None and device_name == "CPU:0" else None
    schedule = _resolved_schedule(schedule, params, kernels, _loops(captured.graph))
    graph = _simulated_graph(captured, schedule, device_name, kernels)
    profile = None
    if schedule == "recorded" or (preset is not None and costs == "measured"):
        from autotune.run.profile import record_profile

        profile = record_profile(captured, graph=graph)
    orders = _schedule_orders(schedule, graph, device_name, profile, kernels)
    runs, seconds = [], 0.0
    for engine in _engines(captured, preset, costs, orders, profile, graph):
        start = time.perf_counter()
        runs.append((engine, engine.evaluate(params or PlanParams(n_tensors=0))))
        seconds += time.perf_counter() - start
    runs.sort(key=lambda run: run[1].result.memory.peak_bytes)
    engine, evaluation = runs[len(runs) // 2]
    baseline = evaluation if params is None else engine.evaluate(PlanParams(n_tensors=0))
    sampled = len(runs) > 1
    return Simulation(
        graph,
        evaluation,
        baseline,
        engine.lower_bound,
        seconds,
        captured.trace_seconds,
        schedule,
        preset.name if preset else None,
        profile.peak_bytes if profile and schedule == "recorded" else None,
        asdict(kernels) if kernels else None,
        tuple(e.result.memory.peak_bytes for _, e in runs) if sampled else (),
        _time_bound(engine, preset, params),
    )


def _time_bound(
    engine: Engine, preset: DevicePreset | None, params: PlanParams | None
) -> float | None:
    """The time bound at the preset's memory and the default safety ratio, over plans in the
    simulated order (and with order edges when the plan has them)."""
    if preset is None or not preset.memory_bytes:
        return None
    from autotune.search.core import DEFAULT_SAFETY_RATIO

    ordered = params is not None and params.serialize
    return engine.time_bound(int(preset.memory_bytes * DEFAULT_SAFETY_RATIO), ordered=ordered)


def _loops(graph: Graph) -> list[str]:
    """The loop ops of `graph` (functional While ops)."""
    return [name for name, op in graph.ops.items() if op.type in LOOP_TYPES]


def _resolved_schedule(
    schedule: str, params: PlanParams | None, kernels: CpuKernels | None, loops: Sequence[str] = ()
) -> str:
    """`schedule`, with "auto" resolved (see `simulate`; `kernels`: this CPU's, given only when
    the step is predicted for it, without a device preset); refuse a plan outside the
    categorized order, and a schedule of the graph TensorFlow runs for a step with `loops`
    (Grappler lowers them to frames, which that walk does not follow)."""
    planned = params is not None and bool(params.n_tensors or params.serialize)
    if schedule == "auto":
        runs = not planned and kernels is not None and not loops
        return "executor" if runs else "categorized"
    if schedule in ("executor", "recorded") and loops:
        raise UserError(
            f"the {schedule} schedule walks the graph TensorFlow runs, where loop "
            f"{loops[0]!r} is lowered to frames it does not follow; use the categorized one"
        )
    if schedule != "categorized" and planned:
        raise UserError(
            f"the {schedule} schedule simulates the step as TensorFlow runs it, without swaps "
            "or order edges; simulate plans in the categorized order"
        )
    return schedule


def _simulated_graph(
    captured: Captured, schedule: str, device: str, kernels: CpuKernels | None
) -> Graph:
    """The captured graph, or for a schedule of the step as run the one Grappler makes of it
    (and, with oneDNN, its graph pass after it); with this CPU's kernels when the prediction is
    for this CPU (`kernels` given)."""
    graph = captured.graph
    if schedule != "categorized":
        from rewriter.optimized import optimized_graph

        graph = optimized_graph(captured, device)
    if kernels is None:
        return graph
    graph = graph.on_cpu()
    if kernels.onednn and schedule != "categorized":
        from simulator.onednn import onednn_graph

        graph = onednn_graph(graph)
    return graph


def _schedule_orders(
    schedule: str,
    graph: Graph,
    device: str,
    profile: Profile | None,
    kernels: CpuKernels | None,
) -> list[Order | None]:
    """The orders of `schedule` on `graph` (None: the categorized order, the engine's own): on
    a oneDNN CPU, `ORDER_SAMPLES` of the executor's (see `simulate`), else one."""
    if schedule == "recorded" and profile is not None:
        return [scheduled_order(graph, profile.priorities())]
    if schedule != "executor":
        return [None]
    from simulator.onednn import REWRITTEN_TYPES
    from simulator.opsemantics import inline_kernel

    if device == "GPU:0":  # the executor counts every GPU kernel as inexpensive
        return [executor_order(graph, lambda name: True)]

    def inline(name: str) -> bool:
        return inline_kernel(graph.ops[name].type)

    def rewritten(name: str) -> bool:
        return graph.ops[name].type in REWRITTEN_TYPES

    if kernels is None or not kernels.onednn:  # one order: none was seen to vary without it
        return [executor_order(graph, inline)]
    return list(executor_orders(graph, inline, rewritten, ORDER_SAMPLES))


def _engines(
    captured: Captured,
    preset: DevicePreset | None,
    costs: str,
    orders: list[Order | None],
    profile: Profile | None,
    graph: Graph,
) -> list[Engine]:
    """An engine per order; the costs and the lower bound, which do not depend on the order,
    computed once."""
    first = build_engine(captured, preset, costs, orders[0], profile, graph)
    rest = [
        Engine.build(graph, order=o, device=preset, cost=first.cost, lower_bound=first.lower_bound)
        for o in orders[1:]
    ]
    return [first, *rest]


def build_engine(
    captured: Captured,
    preset: DevicePreset | None,
    costs: str = "analytical",
    order: Order | None = None,
    profile: Profile | None = None,
    graph: Graph | None = None,
    shared: dict[str, Any] | None = None,
) -> Engine:
    """The engine of a captured step (or of `graph`, the step as Grappler optimized it): its
    order (the categorized one unless given), costs for the preset; `shared` as in
    `Engine.build`."""
    graph = graph or captured.graph
    cost = None
    if preset is not None:
        if costs == "measured" and profile is not None:
            cost = dict(profile.seconds)
        else:
            from rewriter.costs import step_costs

            cost = step_costs(captured, preset)
    return Engine.build(graph, order=order, device=preset, cost=cost, shared=shared)


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
