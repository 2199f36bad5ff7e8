"""The public Python API: capture a step, simulate its memory, measure it on the real device."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rewriter.capture import Captured, CaptureError, capture_function
from rewriter.keras_step import input_specs, is_keras_model, training_step
from simulator import Graph, SimResult, Trace, scheduled_order
from simulator import simulate as simulate_graph

__all__ = ["Simulation", "capture", "simulate"]


@dataclass(frozen=True)
class Simulation:
    """A simulated step: predicted peak, resident bytes, where the peak is, and the trace."""

    graph: Graph
    result: SimResult
    simulate_seconds: float
    trace_seconds: float
    schedule: str = "categorized"
    profiled_peak_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        return self.result.peak_bytes

    @property
    def persistent_bytes(self) -> int:
        return self.result.persistent_bytes

    @property
    def trace(self) -> Trace:
        return self.result.trace

    def to_dict(self) -> dict[str, Any]:
        """The fields of `autotune simulate --json`."""
        r = self.result
        return {
            "ops": len(self.graph.ops),
            "levels": r.order.n_levels,
            "persistent_bytes": r.persistent_bytes,
            "peak_bytes": r.peak_bytes,
            "live_peak_bytes": r.live_peak_bytes,
            "peak_op": r.peak_op,
            "peak_level": r.peak_level,
            "peak_step": r.peak_step,
            "simulate_seconds": self.simulate_seconds,
            "trace_seconds": self.trace_seconds,
            "schedule": self.schedule,
            "profiled_peak_bytes": self.profiled_peak_bytes,
        }


def capture(
    step: Any,
    *example_args: Any,
    loss: Any = None,
    optimizer: Any = None,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> Captured:
    """Capture a tf.function step with example args, or a Keras model with loss and optimizer."""
    if not is_keras_model(step):
        if not example_args:
            raise CaptureError("give example arguments (tensors or tf.TensorSpecs) for the step")
        return capture_function(step, *example_args)
    if loss is None or optimizer is None:
        raise CaptureError("a Keras model needs loss= and optimizer= to build its training step")
    if not example_args:
        if batch_size is None:
            raise CaptureError("a Keras model needs batch_size= (or example x, y) to size tensors")
        example_args = input_specs(step, loss, batch_size, input_shape)
    return capture_function(training_step(step, loss, optimizer), *example_args)


SCHEDULES = ("categorized", "recorded")


def simulate(
    step: Any, *example_args: Any, schedule: str = "categorized", **options: Any
) -> Simulation:
    """Capture `step` (see `capture`) and simulate one training step's device memory.

    `schedule="categorized"` walks the paper's categorized order and needs no device;
    `schedule="recorded"` first runs the step once on the current device under the profiler and
    walks the order TensorFlow executed (closer to the real peak, see results/).
    """
    captured = step if isinstance(step, Captured) else capture(step, *example_args, **options)
    return simulate_captured(captured, schedule=schedule)


def simulate_captured(captured: Captured, *, schedule: str = "categorized") -> Simulation:
    """Simulate an already captured step in the categorized or the recorded order."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    order, profiled = None, None
    if schedule == "recorded":
        from autotune.profile import record_profile

        profile = record_profile(captured)
        order = scheduled_order(captured.graph, profile.priorities())
        profiled = profile.peak_bytes
    start = time.perf_counter()
    result = simulate_graph(captured.graph, order)
    seconds = time.perf_counter() - start
    return Simulation(captured.graph, result, seconds, captured.trace_seconds, schedule, profiled)
