"""Confirm a plan by running it: measured peak and step time next to the simulator's prediction.

On a GPU the tuned step runs with its swap ops on the host, and the run itself shows whether
each swap-in waited for its trigger (`autotune.run.gating`); without one it runs on the emulated
device (swapped tensors kept outside TensorFlow's allocator, see rewriter.apply), and a dry run
checks the GPU form of the step on two logical CPUs.
The tuned step runs first, while the allocator holds only what the warm-up left, then the
original; an out-of-memory on the GPU is reported as "does not fit", not raised.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.run.gating import GatingReport, check_gating, executed_partitions
from autotune.run.predict import as_run_peak, predicted_peak, reads_regrouped, resident_bytes
from rewriter.apply import TunedStep, apply_plan, planned_graph
from rewriter.capture import Captured
from rewriter.names import recompute_chain
from simulator import DevicePreset, SwapPlan
from simulator.derive import PlanParams
from simulator.errors import UserError

__all__ = [
    "Run",
    "Verification",
    "every_replica",
    "limit_gpu_memory",
    "plan_for",
    "rewrite_captured",
    "training_step",
    "use_two_cpus",
    "verify_captured",
]


@dataclass(frozen=True)
class Run:
    """Measured peak (None when it ran out of memory) and median seconds of a few steps."""

    peak_bytes: int | None
    step_seconds: float | None
    error: str | None = None


@dataclass(frozen=True)
class Verification:
    """Measured against predicted, for the tuned step and for the original."""

    device: str
    plan: SwapPlan
    tuned: Run
    baseline: Run
    predicted_peak_bytes: int
    baseline_predicted_peak_bytes: int
    swap_ops: int
    executed: dict[str, str] = field(default_factory=dict)
    steps: int = 1
    gating: GatingReport | None = None
    dry_run: bool = False
    #: the device memory the step was tuned for, if known: the tuned step fits only within it
    memory_bytes: int | None = None
    #: the time model's step seconds, tuned and original, and the device it models (on a GPU,
    #: or with a calibration profile of this machine: a preset's GPU says nothing of a CPU)
    predicted_step_seconds: float | None = None
    baseline_predicted_step_seconds: float | None = None
    time_model: str | None = None
    #: the tuned step's peak simulated on the graph TensorFlow runs (`autotune.run.predict`),
    #: where a sum or a product Grappler regroups reads a swap-in or a recompute copy
    as_run_peak_bytes: int | None = None

    @property
    def fits(self) -> bool:
        """The tuned step ran, and its measured peak is within `memory_bytes` (when known)."""
        if self.tuned.error is not None:
            return False
        peak, limit = self.tuned.peak_bytes, self.memory_bytes
        return limit is None or peak is None or peak <= limit

    @property
    def place(self) -> str:
        """Where it ran, for a sentence: 'GPU:0' or 'the emulated device'."""
        return "the emulated device" if self.device == "emulated" else self.device

    @property
    def error_percent(self) -> float | None:
        """(predicted − measured) / measured, in percent, for the tuned step."""
        if not self.tuned.peak_bytes:
            return None
        return 100.0 * (self.predicted_peak_bytes / self.tuned.peak_bytes - 1.0)

    @property
    def as_run_error_percent(self) -> float | None:
        """`error_percent` of the peak simulated on the graph TensorFlow runs."""
        if not self.tuned.peak_bytes or self.as_run_peak_bytes is None:
            return None
        return 100.0 * (self.as_run_peak_bytes / self.tuned.peak_bytes - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "measured_peak_bytes": self.tuned.peak_bytes,
            "baseline_measured_peak_bytes": self.baseline.peak_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "baseline_predicted_peak_bytes": self.baseline_predicted_peak_bytes,
            "error_percent": self.error_percent,
            "as_run_peak_bytes": self.as_run_peak_bytes,
            "as_run_error_percent": self.as_run_error_percent,
            "step_seconds": self.tuned.step_seconds,
            "baseline_step_seconds": self.baseline.step_seconds,
            "predicted_step_seconds": self.predicted_step_seconds,
            "baseline_predicted_step_seconds": self.baseline_predicted_step_seconds,
            "time_model": self.time_model,
            "fits": self.fits,
            "memory_bytes": self.memory_bytes,
            "error": self.tuned.error,
            "swapped_tensors": len(self.plan.swaps),
            "recomputed_tensors": self.plan.recomputed_tensors,
            "order_edges": len(self.plan.order_edges),
            "serial_loops": len(self.plan.serial_loops),
            "swap_ops": self.swap_ops,
            "swap_ops_executed": len(self.executed),
            "pinned_order": True,
            "params": dict(self.plan.params),
            "gating": self.gating.to_dict() if self.gating else None,
            "gating_on": self.gating_place,
        }

    @property
    def gating_place(self) -> str | None:
        """Where the swap-ins' gating was checked, for a sentence (None: not checked)."""
        if self.gating is None:
            return None
        return "two logical CPUs (dry run, no GPU used)" if self.dry_run else self.device


def limit_gpu_memory(nbytes: int) -> bool:
    """Put the first GPU under a logical memory limit of `nbytes`, so that a big GPU stands in
    for a smaller one. Must run before TensorFlow initializes the GPU; False without a GPU."""
    import tensorflow as tf

    from autotune.run.measure import MeasurementError

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    config = tf.config.LogicalDeviceConfiguration(memory_limit=max(1, nbytes >> 20))
    try:
        tf.config.set_logical_device_configuration(gpus[0], [config])
    except RuntimeError as err:
        raise MeasurementError(
            "a GPU memory limit must be set before TensorFlow initializes the GPU"
        ) from err
    return True


def plan_for(
    captured: Captured, plan: PlanParams | SwapPlan, device: str | DevicePreset | None = None
) -> SwapPlan:
    """`plan` itself, or the plan its parameters give on the captured graph as `fit` derives
    it: with the costs and host link of `device` (a preset; default `fit`'s), the allocator
    model and the time model, on which its order edges, guards and prefetching depend."""
    if isinstance(plan, SwapPlan):
        return plan
    from autotune.api import build_engine
    from autotune.calibration import resolve_device
    from autotune.search.tuning import DEFAULT_DEVICE

    preset = resolve_device(device or DEFAULT_DEVICE)
    return build_engine(captured, preset).evaluate(plan).plan


def rewrite_captured(
    captured: Captured,
    plan: PlanParams | SwapPlan,
    device: str | DevicePreset | None = None,
    **options: Any,
) -> TunedStep:
    """Apply `plan` (or derive it from parameters first, for `device` as in `plan_for`): on the
    GPU if TensorFlow sees one (swap-outs to the host), else on the emulated device."""
    from autotune.run.measure import current_device

    plan = every_replica(captured, plan_for(captured, plan, device), device)
    if current_device() == "GPU:0":
        options = {"mode": "device", "compute_device": "/device:GPU:0", **options}
    return apply_plan(captured, plan, **options)


def every_replica(
    captured: Captured, plan: SwapPlan, device: str | DevicePreset | None = None
) -> SwapPlan:
    """For a step on several replicas, `plan` (replica 0's) with the plan its parameters give
    on each other replica's share of the step (derived there as `plan_for` does), as one."""
    if len(captured.replicas) < 2:
        return plan
    if not plan.params:
        raise UserError("a plan for a step on several replicas must come from its parameters")
    params = PlanParams.from_dict(plan.params)
    plans = [plan] + [
        plan_for(replace(captured, graph=graph), params, device) for graph in captured.replicas[1:]
    ]
    return SwapPlan(
        swaps=tuple(s for p in plans for s in p.swaps),
        params=plan.params,
        graph_name=plan.graph_name,
        order_edges=tuple(e for p in plans for e in p.order_edges),
        recomputes=tuple(r for p in plans for r in p.recomputes),
        serial_loops=tuple(n for p in plans for n in p.serial_loops),
    )


def training_step(
    captured: Captured, plan: SwapPlan, device: str | DevicePreset | None = None
) -> Any:
    """The step to train with under `plan`: the captured step itself when the plan changes
    nothing (no swap, no recompute, no order edge), else the rewritten one (`device`: the
    preset the plan was tuned for, to derive it on a step's other replicas)."""
    if plan.changes_nothing:
        return captured.concrete_function
    return rewrite_captured(captured, plan, device)


def verify_captured(
    captured: Captured,
    plan: PlanParams | SwapPlan,
    *,
    steps: int = 3,
    dry_run: bool = False,
    memory_bytes: int | None = None,
    preset: str | DevicePreset | None = None,
) -> Verification:
    """Run the tuned and the original step `steps` times after a warm-up each; compare. On a
    GPU, check that every swap-in waits for its trigger (`autotune.run.gating`); on the CPU with
    `dry_run`, check the same on the GPU form of the step run on two logical CPUs
    (`use_two_cpus` must have run before TensorFlow started). With `memory_bytes` (the device
    memory tuned for), the verification says whether the measured peak fits it; parameters
    give the plan they give `fit` for `preset` (`plan_for`)."""
    import tensorflow as tf

    from autotune.run.measure import _check_setup, current_device, example_tensors

    if captured.replicas:
        raise UserError(
            f"verify measures one device; this step runs on {len(captured.replicas)} replicas: "
            "read each GPU's peak with tf.config.experimental.get_memory_info while training"
        )
    _check_setup(tf)
    # the schedule is pinned so that the run follows the order the plan was simulated in; the
    # pinned step matches the original to rounding (see rewriter.apply), which verify does not need
    tuned = rewrite_captured(captured, plan, preset, pin_order=True)
    inputs = example_tensors(captured.specs)
    device = current_device()
    executed, gating = _first_call(tuned, inputs)
    dry_run = dry_run and device != "GPU:0"  # a GPU runs the real thing
    if dry_run:
        gating = _dry_run_gating(captured, tuned.plan, inputs)
    own = resident_bytes(captured.graph)
    tuned_run = _run(tuned, inputs, device, steps, own)
    base_run = _run(captured.concrete_function, inputs, device, steps, own)
    predicted, base, as_run = _predicted_peaks(captured, tuned, device)
    model, times = _predicted_seconds(captured, (tuned.plan, SwapPlan()), preset, device)
    return Verification(
        "GPU:0" if device == "GPU:0" else "emulated",
        tuned.plan,
        tuned_run,
        base_run,
        predicted,
        base,
        len(tuned.swap_ops),
        executed,
        steps,
        gating,
        dry_run,
        memory_bytes,
        *times,
        model,
        as_run,
    )


def _predicted_peaks(
    captured: Captured, tuned: TunedStep, device: str
) -> tuple[int, int, int | None]:
    """The peaks `_run` measures, simulated: tuned and original on the captured graph, and tuned
    on the graph TensorFlow runs where Grappler regroups a swap-in's reader (`predict`)."""
    on_cpu = device == "CPU:0"  # the CPU's kernels
    planned = planned_graph(captured, tuned.plan)
    predicted = predicted_peak(planned, tuned.plan, on_cpu)
    base = predicted_peak(planned_graph(captured, SwapPlan()), SwapPlan(), on_cpu)
    regrouped = reads_regrouped(captured.graph, tuned.plan)
    return predicted, base, as_run_peak(captured, tuned, device, planned) if regrouped else None


def _dry_run_gating(captured: Captured, plan: SwapPlan, inputs: list[Any]) -> Any:
    """The GPU form of the tuned step, run on two logical CPUs: whether every swap-in waited
    for its trigger (`autotune.run.gating`)."""
    dry = apply_plan(
        captured,
        plan,
        mode="device",
        compute_device="/device:CPU:0",
        host_device="/device:CPU:1",
        pin_order=True,
    )
    return check_gating(dry, executed_partitions(dry, *inputs), inputs)


def _predicted_seconds(
    captured: Captured,
    plans: tuple[SwapPlan, SwapPlan],
    preset: str | DevicePreset | None,
    device: str,
) -> tuple[str | None, tuple[float | None, float | None]]:
    """The time model's name and its step seconds for each plan: on a GPU for `preset` (a
    preset or calibration profile; default fit's), elsewhere only for a calibration profile."""
    from autotune.api import build_engine
    from autotune.calibration import resolve_device
    from autotune.search.tuning import DEFAULT_DEVICE

    model = resolve_device(preset or DEFAULT_DEVICE)
    if model.calibration is None and device != "GPU:0":
        return None, (None, None)
    engine = build_engine(captured, model)
    tuned, base = (engine.simulate(p).time for p in plans)
    return model.name, (tuned.step_seconds if tuned else None, base.step_seconds if base else None)


def _first_call(tuned: TunedStep, inputs: list[Any]) -> tuple[dict[str, str], GatingReport | None]:
    """Run the tuned step for the first time, reading which swap ops TensorFlow executed (the
    executed graphs are reported only when the function is first run) and, in device mode,
    whether its swap-ins wait for their triggers."""
    import tensorflow as tf

    try:
        partitions = executed_partitions(tuned, *inputs)
        gating = check_gating(tuned, partitions, inputs) if tuned.mode == "device" else None
    except tf.errors.ResourceExhaustedError:
        return {}, None
    return _swap_op_devices(tuned, partitions), gating


def _run(fn: Any, inputs: list[Any], device: str, steps: int, own: int) -> Run:
    """Warm up once, then `steps` measured steps: median peak and median seconds. A step's
    peak is what it allocated above the device's bytes in use before it, plus `own`, the bytes
    of its own inputs, variables and constants (`resident_bytes`): tensors the process holds
    for anything else do not count."""
    import tensorflow as tf

    from autotune.run.link import wait_for

    try:
        fn(*inputs)
        peaks, seconds = [], []
        for _ in range(steps):
            tf.config.experimental.reset_memory_stats(device)
            before = int(tf.config.experimental.get_memory_info(device)["current"])
            start = time.perf_counter()
            out = fn(*inputs)
            wait_for(out)
            seconds.append(time.perf_counter() - start)
            peak = int(tf.config.experimental.get_memory_info(device)["peak"])
            peaks.append(peak - before + own)
    except tf.errors.ResourceExhaustedError as err:
        return Run(None, None, f"does not fit: {str(err).splitlines()[0][:200]}")
    return Run(int(statistics.median(peaks)), statistics.median(seconds))


def _swap_op_devices(tuned: TunedStep, partitions: list[Any]) -> dict[str, str]:
    """The device each swap op and recompute copy ran on. Grappler's remapper may fuse a
    recomputed convolution's copy into its chain's next copy (a fused kernel, `_Fused...` or
    oneDNN's `_Mkl...`): the copies of a chain that holds a fused kernel count as run there."""
    wanted = set(tuned.swap_ops)
    nodes = {n.name: n for pg in partitions for n in pg.node if n.name in wanted}
    out = {name: n.device for name, n in nodes.items()}
    fused = {recompute_chain(name): n.device for name, n in nodes.items() if n.op.startswith("_")}
    for name in wanted - out.keys():
        if recompute_chain(name) in fused:
            out[name] = fused[recompute_chain(name)]
    return out


def use_two_cpus() -> None:
    """Split the CPU into two logical devices, CPU:0 to compute and CPU:1 as the host, for a
    dry run of the GPU form of a tuned step. Call before TensorFlow initializes its devices."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or ()) == 2:
        return
    config = [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    try:
        tf.config.set_logical_device_configuration(cpu, config)
    except RuntimeError as err:
        raise RuntimeError(
            "two logical CPUs must be set up before TensorFlow initializes its devices: "
            "call autotune.use_two_cpus() first"
        ) from err
