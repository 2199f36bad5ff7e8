"""Swap long-lived tensors of a TensorFlow 2 training step to host memory, chosen by simulation.

The public API is small: `simulate` predicts a step's device memory, `measure` reads the real
allocator's peak; both take a tf.function step with example args, or a Keras model with `loss=`,
`optimizer=` and `batch_size=`.
"""

from __future__ import annotations

from typing import Any

from autotune.api import Simulation, capture, simulate
from autotune.measure import Measurement, MeasurementError, prepare_measurement
from autotune.units import format_bytes, parse_size
from rewriter.capture import Captured, CaptureError

__all__ = [
    "CaptureError",
    "Measurement",
    "MeasurementError",
    "Simulation",
    "capture",
    "format_bytes",
    "measure",
    "parse_size",
    "prepare_measurement",
    "simulate",
]


def measure(step: Any, *example_args: Any, repeats: int = 3, **options: Any) -> Measurement:
    """Capture `step` (see `capture`) and measure its peak and resident bytes on the device."""
    from autotune.measure import measure as _measure

    captured = step if isinstance(step, Captured) else capture(step, *example_args, **options)
    real = [a for a in example_args if not _is_spec(a)] if example_args else []
    return _measure(captured, *(real if len(real) == len(captured.specs) else []), repeats=repeats)


def _is_spec(arg: Any) -> bool:
    return type(arg).__name__ == "TensorSpec"
