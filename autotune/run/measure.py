"""Run a step on the real device and read the allocator's peak: the ground truth for the simulator.

On a GPU the peak comes from `tf.config.experimental.get_memory_info('GPU:0')`. On the CPU it comes
from the BFC allocator, which TensorFlow only uses when TF_CPU_ALLOCATOR_USE_BFC=true is set before
it starts; peaks are taken with one inter-op thread, after warm-up steps, as the median of repeats.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rewriter.capture import Captured
from simulator.errors import UserError

__all__ = ["Measurement", "MeasurementError", "current_device", "measure", "prepare_measurement"]


class MeasurementError(UserError, RuntimeError):
    """The process is not set up to measure memory; the message says how to set it up."""


@dataclass(frozen=True)
class Measurement:
    """Measured device memory of one step: held before it (resident) and the peak during it."""

    device: str
    peak_bytes: int
    resident_bytes: int
    peaks: tuple[int, ...]
    warmup_steps: int = 1
    #: wall seconds of each measured step (each waits for its outputs), and their median
    steps_seconds: tuple[float, ...] = ()

    @property
    def step_seconds(self) -> float | None:
        return statistics.median(self.steps_seconds) if self.steps_seconds else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "resident_bytes": self.resident_bytes,
            "peaks": list(self.peaks),
            "warmup_steps": self.warmup_steps,
            "step_seconds": self.step_seconds,
            "steps_seconds": list(self.steps_seconds),
        }


def prepare_measurement() -> None:
    """Set the environment for CPU measurement; call before TensorFlow is imported."""
    import sys

    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    if "tensorflow" in sys.modules:
        _check_setup(sys.modules["tensorflow"])


def current_device() -> str:
    """The device a step runs on: the first GPU if TensorFlow sees one, else the CPU."""
    import tensorflow as tf

    return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def _check_setup(tf: Any) -> None:
    device = current_device()
    if device.startswith("CPU") and os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        raise MeasurementError(
            "measuring on the CPU needs TF_CPU_ALLOCATOR_USE_BFC=true set before TensorFlow "
            "starts: export it, or call autotune.prepare_measurement() before importing tensorflow"
        )
    if os.environ.get("TF_NUM_INTEROP_THREADS") == "1":
        return
    if tf.config.threading.get_inter_op_parallelism_threads() != 1:
        try:
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError as err:
            raise MeasurementError(
                "measuring needs one inter-op thread, and TensorFlow has already started: call "
                "tf.config.threading.set_inter_op_parallelism_threads(1) first"
            ) from err


def example_tensors(specs: tuple[Any, ...], seed: int = 0) -> list[Any]:
    """Real tensors for specs: normal floats, zero integers (valid labels and token ids).

    Making each allocates just its own buffer, by one kernel (TensorFlow's stateless normal,
    without the scale and shift `tf.random.normal` adds: each of those held another buffer of
    the input's size, and on the CPU the three grew the allocator by a region the input then
    sat at the start of; tiny-cnn batch 32 measured 16.07 MiB instead of 14.00)."""
    import tensorflow as tf

    key = tf.constant([seed], tf.uint64)
    out = []
    for i, spec in enumerate(specs):
        if spec.dtype.is_floating:
            counter = tf.constant([i, 0], tf.uint64)
            out.append(
                tf.raw_ops.StatelessRandomNormalV2(
                    shape=spec.shape, key=key, counter=counter, alg=1, dtype=spec.dtype
                )
            )
        else:
            out.append(tf.zeros(spec.shape, dtype=spec.dtype))
    return out


def measure(captured: Captured, *args: Any, repeats: int = 3, warmup: int = 1) -> Measurement:
    """Measure the captured step: `warmup` steps first, then the median peak and wall time
    over `repeats`.

    One warm-up step measures a run's first steps, as the simulator predicts them. On the CPU
    TensorFlow's executor runs cheap kernels inline only after about 90 steps (see README), so
    `warmup=120` measures the order, and the peak, of a longer run."""
    import tensorflow as tf

    from autotune.run.link import wait_for

    if warmup < 1 or repeats < 1:
        raise UserError(f"warmup={warmup} and repeats={repeats}: each must be at least 1")
    _check_setup(tf)
    device = current_device()
    fn = captured.concrete_function
    inputs = list(args) or example_tensors(captured.specs)
    for _ in range(warmup):
        fn(*inputs)
    peaks, resident, seconds = [], [], []
    for _ in range(repeats):
        tf.config.experimental.reset_memory_stats(device)
        resident.append(int(tf.config.experimental.get_memory_info(device)["current"]))
        start = time.perf_counter()
        out = fn(*inputs)
        wait_for(out)
        seconds.append(time.perf_counter() - start)
        peaks.append(int(tf.config.experimental.get_memory_info(device)["peak"]))
        del out
    median = int(statistics.median(peaks))
    return Measurement(
        device, median, int(statistics.median(resident)), tuple(peaks), warmup, tuple(seconds)
    )
