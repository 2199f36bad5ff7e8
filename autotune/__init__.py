"""Swap long-lived tensors of a TensorFlow 2 training step to host memory, chosen by simulation.

The public API is small: `simulate` predicts a step's device memory (with a swap plan and a time
model when given plan options and a device), `measure` reads the real allocator's peak, `rewrite`
hands back the tuned step for a plan, `verify` runs it against the prediction, and `fit` searches
the fastest plan that fits a memory budget and returns the tuned step. Each takes a
tf.function step with example args, or a Keras model with `loss=`, `optimizer=` and
`batch_size=`.
"""

from __future__ import annotations

import importlib
from typing import Any

from autotune.actions import calibrate, fit, measure, rewrite, use_two_cpus, verify
from autotune.api import Simulation, capture, simulate
from autotune.run.measure import Measurement, MeasurementError, prepare_measurement
from autotune.search.tuning import TuningResult
from autotune.units import format_bytes, parse_size
from rewriter.capture import CaptureError

__all__ = [
    "CaptureError",
    "Measurement",
    "MeasurementError",
    "Simulation",
    "TuningResult",
    "calibrate",
    "capture",
    "fit",
    "format_bytes",
    "measure",
    "parse_size",
    "prepare_measurement",
    "rewrite",
    "simulate",
    "use_two_cpus",
    "verify",
]


def __getattr__(name: str) -> Any:
    """`autotune.keras` (SwapCallback) on first use: it imports Keras, and so TensorFlow."""
    if name == "keras":
        return importlib.import_module("autotune.keras")
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
