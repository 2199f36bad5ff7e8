"""Time a convolution gradient alone at batches where its CPU kernel takes another algorithm.

TensorFlow's CPU kernels of 3-D convolution gradients pick their algorithm by size
(`rewriter.cpukernels`): a column buffer above a batch, Eigen's contraction below it, about
three times apart per sample. A line through two calibrated batches on one side cannot price
the other side, so `autotune calibrate` times each such op alone at the two nearest batches of
the other algorithm, from the op's own node (its attributes, its tensors with the batch
scaled), and scales those times by the op's in-graph time over its time alone at the
calibrated batch: the step's threads and gaps as the profile saw them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

from rewriter.cpukernels import cpu_kernels, cpu_scratch_bytes

__all__ = ["ProbePoints", "probe_other_kernel"]

#: (elements at each probed batch, seconds at each): the other algorithm's two points
ProbePoints = tuple[tuple[int, int], tuple[float, float]]

_DOUBLINGS = 10  # the farthest a probe looks: 2**10 times the calibrated batch, or batch 1


def probe_other_kernel(tf_op: Any, in_graph_seconds: float, steps: int) -> ProbePoints | None:
    """The op's two points under its other CPU algorithm, or None: no other algorithm within
    the probed batches, a shape the probe cannot scale, a CPU whose L3 size is unknown, or a
    probe bigger than half the memory this machine has free."""
    shapes = _shapes(tf_op)
    if shapes is None:
        return None
    batch = _batch(tf_op, shapes)
    try:
        regime = _regime(tf_op, shapes, 1.0)
        batches = _other_batches(lambda b: _regime(tf_op, shapes, b / batch) != regime, batch)
    except ValueError:  # the rule needs a size this machine does not report (its L3)
        return None
    if batches is None or _bytes(tf_op, shapes, max(batches) / batch) > _free_bytes() // 2:
        return None
    alone = _seconds_alone(tf_op, shapes, 1.0, steps)
    scale = in_graph_seconds / alone if alone > 0 and in_graph_seconds > 0 else 1.0
    seconds = [scale * _seconds_alone(tf_op, shapes, b / batch, steps) for b in batches]
    elements = [_elements(tf_op, shapes, b / batch) for b in batches]
    return (elements[0], elements[1]), (seconds[0], seconds[1])


Shape = tuple[int, ...]
#: an op's input shapes (None for a `*_sizes` argument) and output shapes
Shapes = tuple[list[Shape | None], list[Shape]]


def _shapes(tf_op: Any) -> Shapes | None:
    """The op's input shapes (None for a `*_sizes` argument) and output shapes, all known."""
    inputs: list[Shape | None] = []
    for arg, t in zip(tf_op.op_def.input_arg, tf_op.inputs):
        if arg.name.endswith("_sizes"):
            inputs.append(None)
            continue
        if not t.shape.is_fully_defined():
            return None
        inputs.append(tuple(t.shape.as_list()))
    outputs = [tuple(t.shape.as_list()) for t in tf_op.outputs if t.shape.is_fully_defined()]
    if len(outputs) != len(tf_op.outputs) or not outputs or not outputs[0]:
        return None
    return inputs, outputs


def _batch(tf_op: Any, shapes: Shapes) -> int:
    """The batch: dimension 0 of the first input that is neither a filter nor a size."""
    args = [a.name for a in tf_op.op_def.input_arg]
    return next(s[0] for a, s in zip(args, shapes[0]) if s and "filter" not in a)


def _scaled(shape: Shape, arg: str, factor: float) -> Shape:
    """`shape` with its batch (dimension 0) times `factor`; a filter keeps its shape."""
    if "filter" in arg or not shape:
        return shape
    return (max(1, round(shape[0] * factor)), *shape[1:])


def _at(tf_op: Any, shapes: Shapes, factor: float) -> tuple[list[Shape], list[Shape]]:
    """Every input and output shape at the batch scaled by `factor`."""
    args = [a.name for a in tf_op.op_def.input_arg]
    inputs = [None if s is None else _scaled(s, a, factor) for a, s in zip(args, shapes[0])]
    outputs = [_scaled(s, "filter" if "Filter" in tf_op.type else "", factor) for s in shapes[1]]
    # the `*_sizes` argument is the output's shape: the image's or the filter's
    return [outputs[0] if s is None else s for s in inputs], outputs


def _regime(tf_op: Any, shapes: Shapes, factor: float) -> bool:
    """Whether the kernel takes its column buffer at the batch scaled by `factor`."""
    return bool(_scratch(tf_op, shapes, factor))


def _scratch(tf_op: Any, shapes: Shapes, factor: float) -> int | None:
    """The kernel's own buffer at the batch scaled by `factor` (`cpu_scratch_bytes`)."""
    inputs, outputs = _at(tf_op, shapes, factor)
    itemsize = tf_op.outputs[0].dtype.size
    return cpu_scratch_bytes(tf_op.type, list(inputs), list(outputs), itemsize, cpu_kernels())


def _other_batches(other: Callable[[int], bool], batch: int) -> tuple[int, int] | None:
    """The two batches of the other algorithm nearest to `batch`: the first one above it and
    its double, or else the last one below it and its half; None if there is none."""
    high = next((batch << k for k in range(1, _DOUBLINGS + 1) if other(batch << k)), None)
    if high is not None:
        low = high >> 1  # not other: find the first that is, between low and high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if other(mid) else (mid, high)
        return high, 2 * high
    if batch <= 1 or not other(1):
        return None
    low, high = 1, batch  # other(low), not other(high): find the last that is
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if other(mid) else (low, mid)
    return max(1, low // 2), low


def _elements(tf_op: Any, shapes: Shapes, factor: float) -> int:
    """The elements the op touches at the batch scaled by `factor`, as `op_elements` counts
    them: its inputs' (a `*_sizes` argument: its few integers) and its outputs'."""
    inputs, outputs = _at(tf_op, shapes, factor)
    sizes = [s is None for s in shapes[0]]
    touched = [len(o) if is_sizes else math.prod(o) for o, is_sizes in zip(inputs, sizes)]
    return sum(touched) + sum(math.prod(s) for s in outputs)


def _bytes(tf_op: Any, shapes: Shapes, factor: float) -> int:
    """The op's tensors and its own buffer, in bytes, at the batch scaled by `factor`."""
    inputs, outputs = _at(tf_op, shapes, factor)
    tensors = sum(math.prod(s) for s in (*inputs, *outputs)) * tf_op.outputs[0].dtype.size
    return tensors + (_scratch(tf_op, shapes, factor) or 0)


def _free_bytes() -> int:
    """The memory this machine has free (as much as a probe could want where the system
    does not say: not Linux)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return sys.maxsize


def _seconds_alone(tf_op: Any, shapes: Shapes, factor: float, steps: int) -> float:
    """The median wall time of the op alone, its tensors at the batch scaled by `factor`."""
    import tensorflow as tf

    from autotune.run.link import median_seconds

    inputs, _ = _at(tf_op, shapes, factor)
    values = []
    for arg, t, shape in zip(tf_op.op_def.input_arg, tf_op.inputs, inputs):
        if arg.name.endswith("_sizes"):
            values.append(tf.constant(shape, dtype=t.dtype))
        else:
            values.append(tf.random.uniform(shape, dtype=t.dtype))
    attrs = _attrs(tf_op)
    kernel = getattr(tf.raw_ops, tf_op.type)
    names = [a.name for a in tf_op.op_def.input_arg]
    run = tf.function(lambda *xs: kernel(**dict(zip(names, xs)), **attrs))
    return median_seconds(lambda: run(*values), steps)


def _attrs(tf_op: Any) -> dict[str, Any]:
    """The op's attributes other than its types (raw ops infer those from the inputs)."""
    out = {}
    for attr in tf_op.op_def.attr:
        if attr.type == "type":
            continue
        value = tf_op.get_attr(attr.name)
        out[attr.name] = value.decode() if isinstance(value, bytes) else value
    return out
