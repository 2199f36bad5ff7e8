"""cuDNN's fused RNN kernels: the size of what they keep for the gradient, measured on the GPU.

On a GPU, Keras runs an `LSTM` or `GRU` whose options allow it as one `CudnnRNNV3` op and its
gradient (`CudnnRNNBackpropV3`), with no loop. The forward op's `reserve_space` output is what
it keeps for the gradient (the saved state of every step), and its `host_reserved` output a
small host buffer; TensorFlow leaves both shapes open, since cuDNN sizes them when the op
runs, from the shapes, the cell and the cuDNN version. Capture measures them: it runs the op
once on the GPU on zeros of its inputs' shapes, with its attributes, and reads the sizes. No
formula stands in for them. Without a GPU the op cannot run, and capture refuses it in one
line that says what to do instead.
"""

from __future__ import annotations

import functools
from typing import Any

from simulator.errors import UserError

__all__ = ["CUDNN_RNN", "CudnnError", "measured_shape"]

#: the fused RNN ops whose outputs cuDNN sizes at run time
CUDNN_RNN = frozenset({"CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"})


class CudnnError(UserError):
    """A cuDNN RNN op capture cannot size here."""


def measured_shape(t: Any, run: Any = None) -> Any:
    """The shape output `t` of a cuDNN RNN op has when the op runs on the GPU (`run`: a
    stand-in for the GPU run, which takes the op and returns its outputs' shapes)."""
    op = t.op
    for i in op.inputs:
        if not i.shape.is_fully_defined():
            raise CudnnError(
                f"op {op.name!r} ({op.type}) reads {i.name!r} of shape {i.shape}: give fully "
                "defined input shapes (a batch size and a sequence length)"
            )
    shapes = (run or _run_on_gpu)(op)
    return shapes[t.value_index]


def _run_on_gpu(op: Any) -> tuple[Any, ...]:
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        raise CudnnError(
            f"op {op.name!r} ({op.type}) is cuDNN's fused RNN kernel, whose saved state cuDNN "
            "sizes when it runs on a GPU, and no GPU is visible: capture on the GPU, or build "
            "the recurrent layers with use_cudnn=False to tune them as loops"
        )
    names = [a.name for a in op.op_def.input_arg]
    inputs = tuple((n, tuple(i.shape.as_list()), i.dtype.name) for n, i in zip(names, op.inputs))
    kinds = {a.name for a in op.op_def.attr if a.type == "type"}
    attrs = tuple((a.name, op.get_attr(a.name)) for a in op.op_def.attr if a.name not in kinds)
    return _measured(op.type, inputs, attrs)


@functools.lru_cache(maxsize=64)
def _measured(
    kind: str, inputs: tuple[tuple[str, tuple[int, ...], str], ...], attrs: tuple[Any, ...]
) -> tuple[Any, ...]:
    """The output shapes of one run of op `kind` on the GPU, on zeros of `inputs` (a sequence
    length input holding the full length of every sequence)."""
    import tensorflow as tf

    given = dict(attrs)
    steps = inputs[0][1][0 if given.get("time_major", True) else 1]
    with tf.device("/GPU:0"):
        args = {
            name: tf.fill(shape, steps) if name == "sequence_lengths" else tf.zeros(shape, dtype)
            for name, shape, dtype in inputs
        }
        outputs = getattr(tf.raw_ops, kind)(**args, **given)
    return tuple(tf.TensorShape(o.shape) for o in outputs)
