"""Record what TensorFlow really executed: the order of the ops and how long each took.

TensorFlow's executor does not run a graph in the categorized order: with one inter-op thread it
runs cheap kernels inline and defers all but one expensive ready op to a LIFO queue, which keeps
some activations alive longer. One profiled step on the current device gives the executed order
(and per-op times for the time model), read from the profiler's XSpace.
"""

from __future__ import annotations

import glob
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewriter.capture import Captured
from simulator.graph import Graph
from simulator.replay import Request

__all__ = [
    "AllocationHistory",
    "Profile",
    "profile_function",
    "record_allocation_history",
    "record_profile",
    "trace_ops",
]

_STEP_MARK = "autotune:measured-step"


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
    from autotune.run.measure import example_tensors

    inputs = list(args) or example_tensors(captured.specs)
    names = set((graph or captured.graph).ops)
    return profile_function(captured.concrete_function, inputs, names)


def profile_function(fn: Any, inputs: list[Any], names: set[str]) -> Profile:
    """Warm `fn` up, run it once under the profiler (and, where the allocator reports it, read
    that step's peak), and return the ops among `names` in the order they ran."""
    import tensorflow as tf

    from autotune.run.measure import current_device

    fn(*inputs)
    device = current_device()
    memory = _memory_readable(tf, device)
    if memory:
        tf.config.experimental.reset_memory_stats(device)
        resident = int(tf.config.experimental.get_memory_info(device)["current"])
    events = trace_ops(lambda: fn(*inputs), names, "record the order")
    peak = int(tf.config.experimental.get_memory_info(device)["peak"]) if memory else None
    order = tuple(dict.fromkeys(name for _, name, _ in events))
    seconds: dict[str, float] = {}
    for _, name, dur in events:
        seconds[name] = seconds.get(name, 0.0) + dur
    return Profile(order, seconds, device, peak, resident if memory else None)


def trace_ops(
    run: Callable[[], Any],
    names: set[str],
    purpose: str,
    *,
    host_tracer_level: int = 2,
    gpu: bool = False,
) -> list[tuple[int, str, float]]:
    """Call `run()` once under TensorFlow's profiler and return (start in ps, op name, seconds)
    of the traced ops among `names`, in start order; an error naming `purpose` without a trace.
    Level 3 also traces ops the default level leaves out. With `gpu`, the ops' kernels on the
    GPU (`_gpu_events`) instead of their host events (which on a GPU time the launch)."""
    import tensorflow as tf

    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=host_tracer_level)
    with tempfile.TemporaryDirectory(prefix="autotune-profile-") as logdir:
        tf.profiler.experimental.start(logdir, options=options)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        path = _trace_file(logdir, purpose)
        return _gpu_events(path, names) if gpu else _op_events(path, names)


def _memory_readable(tf: Any, device: str) -> bool:
    """True when the device's allocator reports its peak (on the CPU only with the BFC)."""
    try:
        tf.config.experimental.get_memory_info(device)
    except ValueError:
        return False
    return True


def _trace_file(logdir: str, purpose: str) -> str:
    """The trace the profiler wrote into `logdir`; an error naming `purpose` if it wrote none."""
    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    if not paths:
        raise RuntimeError(f"the TensorFlow profiler wrote no trace; cannot {purpose}")
    return paths[0]


def _op_events(path: str, ops: set[str]) -> list[tuple[int, str, float]]:
    """(start in ps, op name, seconds) of every kernel event on the host plane, in start order."""
    space = _xspace(path)
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


@dataclass(frozen=True)
class AllocationHistory:
    """Every request the CPU's BFC allocator served since recording began, in order; the index
    of the measured step's first one, and the allocator's own peak over that step."""

    requests: tuple[Request, ...]
    step_start: int
    peak_bytes: int


def record_allocation_history(build: Callable[[], tuple[Any, list[Any]]]) -> AllocationHistory:
    """Profile `build()` (which returns a step and its inputs: it should make the model, so
    that its variables' history is recorded), one warm-up step and one measured step, and
    return the allocator's requests. Needs the CPU's BFC allocator (`prepare_measurement`)
    and a process in which nothing was allocated before, for a history without gaps."""
    import tensorflow as tf

    from autotune.run.measure import MeasurementError

    if not _memory_readable(tf, "CPU:0"):
        raise MeasurementError(
            "recording allocations needs TF_CPU_ALLOCATOR_USE_BFC=true set before TensorFlow "
            "starts: call autotune.prepare_measurement() before importing tensorflow"
        )
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
    with tempfile.TemporaryDirectory(prefix="autotune-history-") as logdir:
        tf.profiler.experimental.start(logdir, options=options)
        try:
            fn, inputs = build()
            fn(*inputs)
            tf.config.experimental.reset_memory_stats("CPU:0")
            with tf.profiler.experimental.Trace(_STEP_MARK):
                fn(*inputs)
            peak = int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        finally:
            tf.profiler.experimental.stop()
        timed, step_at = _memory_events(_trace_file(logdir, "read allocations"))
    timed.sort(key=lambda e: e[0])  # the allocator serves and records them under its lock
    start = sum(1 for t, _ in timed if t < step_at)
    return AllocationHistory(tuple(r for _, r in timed), start, peak)


def _memory_events(path: str) -> tuple[list[tuple[int, Request]], int]:
    """(time in ps, request) of every host allocation and release the CPU allocator recorded,
    and the time the measured step began."""
    space = _xspace(path)
    events, step_at, allocators = [], -1, set()
    for plane in space.planes:
        meta, stats = plane.event_metadata, plane.stat_metadata
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = meta[e.metadata_id].name
                if name == _STEP_MARK:
                    step_at = base + e.offset_ps
                elif name in ("MemoryAllocation", "MemoryDeallocation"):
                    values = {stats[s.metadata_id].name: s for s in e.stats}
                    allocators.add(_text(values["allocator_name"], stats))
                    addr, nbytes = (_int(values[k]) for k in ("addr", "requested_bytes"))
                    request = Request(name == "MemoryAllocation", addr, nbytes)
                    events.append((base + e.offset_ps, request))
    if step_at < 0:
        raise RuntimeError("the profiler's trace lacks the measured step's mark")
    if len(allocators) > 1:
        raise RuntimeError(f"allocations of several allocators recorded: {sorted(allocators)}")
    return events, step_at


def _int(stat: Any) -> int:
    return int(stat.int64_value or stat.uint64_value)


def _text(stat: Any, stats: Any) -> str:
    """A string stat's value, stored inline or as a reference to the plane's metadata."""
    return str(stat.str_value or stats[stat.ref_value].name)


#: stats of a GPU kernel event that name the TensorFlow op that launched it ("name:type"),
#: in the order they are looked for: set when the trace is processed, or the annotation the
#: executor pushes around the launch
_GPU_OP_STATS = ("tf_op", "level 0", "annotation")


def _gpu_events(path: str, ops: set[str]) -> list[tuple[int, str, float]]:
    """(start in ps, op name, seconds) of every kernel on the GPU planes whose launching op is
    among `ops`, in start order (an op that launches several kernels appears once for each)."""
    events = []
    for plane in _xspace(path).planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = _launching_op(e, stat_names, plane)
                if name in ops:
                    events.append((base + e.offset_ps, name, e.duration_ps * 1e-12))
    events.sort()
    return events


def _launching_op(event: Any, stat_names: dict[int, str], plane: Any) -> str:
    """The op name a GPU kernel event's stats give: the last op of a nested annotation
    ("outer::name:type"), without the metadata TraceMe appends ("name:type#id=3#")."""
    stats = {stat_names.get(s.metadata_id, ""): s for s in event.stats}
    for key in _GPU_OP_STATS:
        if key in stats:
            stat = stats[key]
            text = stat.str_value or (
                plane.stat_metadata[stat.ref_value].name if stat.ref_value else ""
            )
            return text.split("::")[-1].split("#", 1)[0].rsplit(":", 1)[0]
    return ""


def _xspace(path: str) -> Any:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space
