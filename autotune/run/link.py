"""The host link as the tuned step will use it: its bandwidth each way, and each way at once.

On a GPU a probe copies a tensor the way a device-form swap does (an identity on the host
reading the GPU's tensor, and back): TensorFlow stages such copies in its pinned host pool.
On the CPU it runs the emulated swap ops themselves (`rewriter.apply`: a copy out of
TensorFlow's allocator and back), which is what an emulated tuned step spends on each swap.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkFigures", "median_seconds", "probe_link", "wait_for"]

#: bytes a probe copies: large enough that a call's own overhead is a small part of its time
PROBE_BYTES = 64 << 20


@dataclass(frozen=True)
class LinkFigures:
    """Measured bytes per second: device to host, host to device, and each way when both run."""

    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    duplex_bytes_per_s: float


def probe_link(device: str, nbytes: int = PROBE_BYTES, repeats: int = 5) -> LinkFigures:
    """Median figures over `repeats` copies of `nbytes` each, on `device` ("GPU:0", or
    "CPU:0": the emulated host)."""
    import tensorflow as tf

    with tf.device(device):
        x = tf.ones([nbytes // 4], tf.float32)
        y = x * 2
    if device.startswith("GPU"):
        return _gpu_link(tf, x, y, nbytes, repeats)
    return _emulated_link(tf, x, nbytes, repeats)


def _gpu_link(tf: Any, x: Any, y: Any, nbytes: int, repeats: int) -> LinkFigures:
    """Copies as a device-form swap makes them: an identity on the host reading the GPU's
    tensor (then one element back, to wait for it), the way back (then a slice on the GPU),
    and both at once."""

    @tf.function
    def d2h(x: Any) -> Any:
        with tf.device("/device:CPU:0"):
            return tf.identity(x)[:1]

    @tf.function
    def h2d(host: Any) -> Any:
        with tf.device("/device:GPU:0"):
            return tf.identity(host)[:1]

    @tf.function
    def both(x: Any, host: Any) -> Any:
        with tf.device("/device:CPU:0"):
            out = tf.identity(x)[:1]
        with tf.device("/device:GPU:0"):
            back = tf.identity(host)[:1]
        return out, back

    with tf.device("/device:CPU:0"):
        host = tf.identity(y)
    out = median_seconds(lambda: d2h(x), repeats)
    back = median_seconds(lambda: h2d(host), repeats)
    duplex = median_seconds(lambda: both(x, host), repeats)
    return LinkFigures(nbytes / out, nbytes / back, nbytes / duplex)


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The median wall time of `repeats` calls of `run` (after one that traces and warms the
    allocator up), each waiting for its outputs."""
    wait_for(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wait_for(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def wait_for(out: Any) -> None:
    """Block until every tensor of `out` is computed (its values read back)."""
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy(), out)


def _emulated_link(tf: Any, x: Any, nbytes: int, repeats: int) -> LinkFigures:
    """The emulated swap ops of a tuned step, a swap-out and its swap-in, each timed by the
    profiler. They run on the compute device's threads, so both ways at once take the sum."""
    from autotune.run.profile import trace_ops
    from rewriter.hostops import swap_in, swap_out

    @tf.function
    def round_trip(x: Any) -> Any:
        token = swap_out(x, "emulated", 1, "probe_out")
        return swap_in(token, x, "emulated", "probe_in")[:1]

    names = {"probe_out", "probe_in/fetch", "probe_in/fetch/shape", "probe_in"}
    round_trip(x)
    outs, ins = [], []
    for _ in range(repeats):
        events = trace_ops(lambda: round_trip(x).numpy(), names, "measure the emulated host")
        seconds = {name: s for _, name, s in events}
        outs.append(seconds.get("probe_out", 0.0))
        ins.append(sum(v for k, v in seconds.items() if k != "probe_out"))
    out, back = statistics.median(outs), statistics.median(ins)
    if not out or not back:
        raise RuntimeError("the profiler did not trace the emulated swap ops")
    return LinkFigures(nbytes / out, nbytes / back, nbytes / (out + back))
