"""Shapes TensorFlow leaves open that capture can still compute exactly."""

from __future__ import annotations

from typing import Any

from rewriter.cudnn import CUDNN_RNN, measured_shape

__all__ = ["broadcast_reduction", "inferred_shape"]


def inferred_shape(t: Any) -> Any:
    """The exact shape of a tensor TensorFlow leaves open but whose size we can compute."""
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    if t.op.type in CUDNN_RNN:
        return measured_shape(t)
    if t.op.type == "BroadcastGradientArgs":
        dims = [tensor_util.constant_value_as_shape(i) for i in t.op.inputs]
        if all(d.is_fully_defined() for d in dims):
            reduce = broadcast_reduction([d.as_list() for d in dims])[t.value_index]
            return tf.TensorShape([len(reduce)])
    return t.shape


def broadcast_reduction(shapes: list[list[int]]) -> tuple[list[int], list[int]]:
    """Reduction indices of BroadcastGradientArgs for two static shapes (TF's BCast rule).

    Equal shapes reduce nothing; otherwise a dimension of size 1 (or missing) in one operand is
    reduced in that operand's gradient, and in both when both are 1.
    """
    if shapes[0] == shapes[1]:
        return [], []
    rank = max(len(s) for s in shapes)
    x, y = ([1] * (rank - len(s)) + s for s in shapes)
    return [i for i in range(rank) if x[i] == 1], [i for i in range(rank) if y[i] == 1]


#: ops whose output is an element a list holds: its buffer is the list's (counted there)
