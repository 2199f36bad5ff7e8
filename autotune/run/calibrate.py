"""Calibrate: profile a step at two sizes on this device and record its ops' times and the link.

Each size runs a warm-up step, then `steps` timed steps (their median is the step's wall time)
and `steps` steps under TensorFlow's profiler, whose kernel events give each op's median time;
the two sizes take `ROUNDS` turns at that, and each figure is its median over the rounds.
Ops that ran fused into another (Grappler's remapper names a fused kernel after the last op it
absorbed) are timed in that op and take none of their own.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from autotune.calibration import Calibration, OpPoints, op_elements
from autotune.planfile import graph_positions, structure_digest
from rewriter.capture import Captured
from rewriter.cpukernels import SWITCHING_TYPES
from simulator.devices import DevicePreset
from simulator.errors import UserError
from simulator.graph import Graph, Op

__all__ = ["ROUNDS", "calibrate", "step_seconds"]

#: the two sizes are profiled in turn this many times, and each op's time is the median: an
#: op's slope is the difference of its two times, which one round leaves to the machine's
#: drift between them (docs/accuracy.md, "Calibrating on a noisy machine")
ROUNDS = 5


def calibrate(
    capture_at: Callable[[int], Captured],
    size: int,
    *,
    model: str,
    steps: int = 5,
    base: DevicePreset | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Calibration:
    """Profile the step `capture_at` gives at `size` and at half of it, and probe the link.
    `base`: the preset whose compute properties and memory describe this GPU (for Grappler's
    estimate of ops the profile lacks)."""
    from autotune.run.link import probe_link
    from autotune.run.measure import current_device

    if size < 2:
        raise UserError(f"calibrating needs a size of at least 2 (it profiles {size} and half)")
    sizes = (size // 2, size)
    device = current_device()
    captures = [capture_at(n) for n in sizes]
    times, walls = _rounds(captures, sizes, steps, on_stage)
    if on_stage:
        on_stage("measuring the host link")
    link = probe_link(device)
    ops, digest = _op_points(captures[0].graph, captures[1].graph, times, device)
    ops = _probe_switching(captures[1], ops, steps, on_stage)
    return Calibration(
        device=device,
        device_name=_device_name(device),
        tensorflow=_tf_version(),
        model=model,
        sizes=sizes,
        fingerprint=captures[1].graph.fingerprint(),
        structure=digest,
        ops=ops,
        d2h_bytes_per_s=link.d2h_bytes_per_s,
        h2d_bytes_per_s=link.h2d_bytes_per_s,
        duplex_bytes_per_s=link.duplex_bytes_per_s,
        step_seconds=(walls[0], walls[1]),
        compute=_compute(device, base),
        memory_bytes=base.memory_bytes if base else None,  # only a preset the user named
    )


def _rounds(
    captures: list[Captured],
    sizes: tuple[int, int],
    steps: int,
    on_stage: Callable[[str], None] | None,
) -> tuple[list[dict[str, float]], list[float]]:
    """Each op's seconds and the step's wall time at each size: the median over `ROUNDS`
    rounds that profile the two sizes in turn, so that the machine's drift over the
    calibration (clock, other load) falls on both sizes alike rather than on their
    difference, which each op's slope is."""
    runs: list[list[tuple[dict[str, float], float]]] = [[] for _ in sizes]
    for r in range(ROUNDS):
        for i, captured in enumerate(captures):
            if on_stage:
                on_stage(f"profiling at {sizes[i]} (round {r + 1} of {ROUNDS})")
            runs[i].append(_op_seconds(captured, steps))
    times = [_medians([seconds for seconds, _ in got]) for got in runs]
    walls = [statistics.median(wall for _, wall in got) for got in runs]
    return times, walls


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each op's median over the rounds (0 in a round it did not run in)."""
    names = {name for r in rounds for name in r}
    return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in names}


def _op_points(
    graph_a: Graph, graph_b: Graph, times: list[dict[str, float]], device: str
) -> tuple[dict[str, OpPoints], str]:
    """Each op's two points, by its position in the graph's order, and the graph's structure
    digest; an error if the two captures differ in more than their names and sizes."""
    where_a, where_b = graph_positions(graph_a), graph_positions(graph_b)
    digest = structure_digest(graph_b, where_b)
    if structure_digest(graph_a, where_a) != digest:
        raise UserError("the step's graph differs between the two sizes; it cannot be calibrated")
    names_a = {pos: name for name, pos in where_a.items()}
    ops = {
        pos: OpPoints(
            name,
            graph_b.ops[name].type,
            (op_elements(graph_a, names_a[pos]), op_elements(graph_b, name)),
            (times[0].get(names_a[pos], 0.0), times[1].get(name, 0.0)),
            _scratch(graph_a.ops[names_a[pos]], graph_b.ops[name], device),
        )
        for name, pos in where_b.items()
        if name in graph_b.ops
    }
    return ops, digest


def _probe_switching(
    captured: Captured,
    ops: dict[str, OpPoints],
    steps: int,
    on_stage: Callable[[str], None] | None,
) -> dict[str, OpPoints]:
    """`ops` with each op whose CPU kernel may take another algorithm at another size timed
    alone under that algorithm (`autotune.run.kernelprobe`)."""
    from autotune.run.kernelprobe import probe_other_kernel

    switching = {pos: p for pos, p in ops.items() if p.scratch is not None and p.type in
                 SWITCHING_TYPES}  # fmt: skip
    fg = captured.concrete_function.graph
    present = {op.name for op in fg.get_operations()}
    out = dict(ops)
    for i, (pos, p) in enumerate(switching.items()):
        if on_stage:
            on_stage(f"timing {p.type} under its other algorithm ({i + 1}/{len(switching)})")
        if p.name in present:
            other = probe_other_kernel(fg.get_operation_by_name(p.name), p.seconds[1], steps)
            out[pos] = replace(p, other=other)
    return out


def _scratch(a: Op, b: Op, device: str) -> tuple[bool, bool] | None:
    """On the CPU, whether the op's kernel took a column buffer at each size."""
    if device != "CPU:0" or a.cpu_scratch is None or b.cpu_scratch is None:
        return None
    return bool(a.cpu_scratch), bool(b.cpu_scratch)


def _op_seconds(captured: Captured, steps: int) -> tuple[dict[str, float], float]:
    """Each op's median seconds over `steps` profiled steps, brought to the median wall time
    of a step (`_to_wall`); and that wall time."""
    from autotune.run.measure import current_device, example_tensors
    from autotune.run.profile import trace_ops

    fn = captured.concrete_function
    inputs = example_tensors(captured.specs)
    wall = step_seconds(fn, inputs, steps)
    names = set(captured.graph.ops)

    def profiled() -> None:
        for _ in range(steps):
            _run(fn, inputs)

    gpu = current_device() == "GPU:0"
    events = trace_ops(profiled, names, "calibrate", gpu=gpu)
    runs: dict[str, list[float]] = {}
    for _, name, seconds in events:
        runs.setdefault(name, []).append(seconds)
    out = {
        name: statistics.median(s) if len(s) == steps else sum(s) / steps
        for name, s in runs.items()
    }
    return _to_wall(out, wall), wall


def _to_wall(seconds: dict[str, float], wall: float) -> dict[str, float]:
    """Op times that sum to the step's wall time, as the time model's one compute stream
    runs them: the executor's time between kernels spread evenly over the ops, or, where ops
    overlapped (several inter-op threads), each op's share of the wall time."""
    total = sum(seconds.values())
    if not seconds or not total:
        return seconds
    if total > wall:
        return {name: s * wall / total for name, s in seconds.items()}
    gap = (wall - total) / len(seconds)
    return {name: s + gap for name, s in seconds.items()}


def step_seconds(fn: Any, inputs: list[Any], steps: int) -> float:
    """The median wall time of `steps` calls of `fn` (after one to warm up), each waiting
    for its outputs."""
    from autotune.run.link import median_seconds

    return median_seconds(lambda: fn(*inputs), steps)


def _run(fn: Any, inputs: list[Any]) -> None:
    from autotune.run.link import wait_for

    wait_for(fn(*inputs))


def _device_name(device: str) -> str:
    import tensorflow as tf

    if device.startswith("GPU"):
        gpu = tf.config.list_physical_devices("GPU")[0]
        return str(tf.config.experimental.get_device_details(gpu).get("device_name", "GPU"))
    return _cpuinfo("model name") or platform.processor() or "CPU"


def _cpuinfo(field: str) -> str:
    """The value of `field` for the first CPU in /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _tf_version() -> str:
    import tensorflow as tf

    return str(tf.__version__)


def _compute(device: str, base: DevicePreset | None) -> dict[str, Any]:
    """What Grappler's estimate needs, for the ops a profile lacks: the base preset's GPU, or
    this CPU's cores and clock (Grappler then assumes 32 GB/s of memory bandwidth)."""
    if base is None and device.startswith("GPU"):
        base = _preset_named_in(_device_name(device))
    if base is not None:
        return {
            "kind": "GPU",
            "sm_count": base.sm_count,
            "clock_mhz": base.clock_mhz,
            "memory_bandwidth_bytes_per_s": base.memory_bandwidth_bytes_per_s,
        }
    if device.startswith("GPU"):
        return {}
    import os

    return {
        "kind": "CPU",
        "sm_count": len(os.sched_getaffinity(0)),
        "clock_mhz": int(float(_cpuinfo("cpu MHz") or 1000)),
        "memory_bandwidth_bytes_per_s": 0,
    }


def _preset_named_in(device_name: str) -> DevicePreset | None:
    """The preset whose GPU the device's name names (V100, A100, H100, H200), if any."""
    from simulator.devices import PRESETS

    for preset in PRESETS.values():
        if preset.name.split("-")[0].upper() in device_name.upper():
            return preset
    return None
