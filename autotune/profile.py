"""Record what TensorFlow really executed: the order of the ops and how long each took.

TensorFlow's executor does not run a graph in the categorized order: with one inter-op thread it
runs cheap kernels inline and defers all but one expensive ready op to a LIFO queue, which keeps
some activations alive longer. One profiled step on the current device gives the executed order
(and per-op times for the time model), read from the profiler's XSpace.
"""

from __future__ import annotations

import glob
import tempfile
from dataclasses import dataclass
from typing import Any

from rewriter.capture import Captured
from simulator.graph import Graph

__all__ = ["Profile", "profile_function", "record_profile"]


@dataclass(frozen=True)
class Profile:
    """Ops of the captured graph in the order they ran, with each op's measured seconds."""

    order: tuple[str, ...]
    seconds: dict[str, float]
    device: str
    peak_bytes: int | None = None
    resident_bytes: int | None = None

    def priorities(self) -> dict[str, float]:
        """Position of each recorded op, for `simulator.scheduled_order`."""
        return {name: float(i) for i, name in enumerate(self.order)}


def record_profile(captured: Captured, *args: Any, graph: Graph | None = None) -> Profile:
    """Run the step once to warm up, then once under the profiler (on `args`, by default example
    inputs), and read the executed ops that are ops of `graph` (by default the captured graph;
    pass the optimized one to match fused ops too)."""
    from autotune.measure import example_tensors

    inputs = list(args) or example_tensors(captured.specs)
    names = set((graph or captured.graph).ops)
    return profile_function(captured.concrete_function, inputs, names)


def profile_function(fn: Any, inputs: list[Any], names: set[str]) -> Profile:
    """Warm `fn` up, run it once under the profiler (and, where the allocator reports it, read
    that step's peak), and return the ops among `names` in the order they ran."""
    import tensorflow as tf

    from autotune.measure import current_device

    fn(*inputs)
    device = current_device()
    memory = _memory_readable(tf, device)
    with tempfile.TemporaryDirectory(prefix="autotune-profile-") as logdir:
        if memory:
            tf.config.experimental.reset_memory_stats(device)
            resident = int(tf.config.experimental.get_memory_info(device)["current"])
        tf.profiler.experimental.start(logdir)
        try:
            fn(*inputs)
        finally:
            tf.profiler.experimental.stop()
        peak = int(tf.config.experimental.get_memory_info(device)["peak"]) if memory else None
        paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        if not paths:
            raise RuntimeError("the TensorFlow profiler wrote no trace; cannot record the order")
        events = _op_events(paths[0], names)
    order = tuple(dict.fromkeys(name for _, name, _ in events))
    seconds: dict[str, float] = {}
    for _, name, dur in events:
        seconds[name] = seconds.get(name, 0.0) + dur
    return Profile(order, seconds, device, peak, resident if memory else None)


def _memory_readable(tf: Any, device: str) -> bool:
    """True when the device's allocator reports its peak (on the CPU only with the BFC)."""
    try:
        tf.config.experimental.get_memory_info(device)
    except ValueError:
        return False
    return True


def _op_events(path: str, ops: set[str]) -> list[tuple[int, str, float]]:
    """(start in ps, op name, seconds) of every kernel event on the host plane, in start order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = meta[e.metadata_id].name.rsplit(":", 1)[0]
                if name in ops:
                    events.append((base + e.offset_ps, name, e.duration_ps * 1e-12))
    events.sort()
    return events
