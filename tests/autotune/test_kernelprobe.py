"""Timing a 3-D convolution gradient alone under the CPU algorithm it takes at other batches."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tf

IMAGE, FILTER, GRAD = (2, 16, 16, 16, 1), (3, 3, 3, 1, 4), (2, 16, 16, 16, 4)


def _filter_gradient():  # type: ignore[no-untyped-def]
    """A Conv3DBackpropFilterV2 node at batch 2, whose kernel falls back to Eigen's
    contraction there (its column buffer would dwarf its tensors)."""
    import tensorflow as tf

    @tf.function
    def grad(x, dy):  # type: ignore[no-untyped-def]
        return tf.raw_ops.Conv3DBackpropFilterV2(
            input=x, filter_sizes=FILTER, out_backprop=dy, strides=[1] * 5, padding="SAME"
        )

    specs = tf.TensorSpec(IMAGE, tf.float32), tf.TensorSpec(GRAD, tf.float32)
    graph = grad.get_concrete_function(*specs).graph
    return next(op for op in graph.get_operations() if op.type == "Conv3DBackpropFilterV2")


def _first_column_batch() -> int:
    from rewriter.cpukernels import cpu_kernels, cpu_scratch_bytes

    def column(b: int) -> bool:
        image, grad = (b, *IMAGE[1:]), (b, *GRAD[1:])
        kernels = cpu_kernels()
        return bool(cpu_scratch_bytes("Conv3DBackpropFilterV2", [image, (5,), grad],
                                      [FILTER], 4, kernels))  # fmt: skip

    assert not column(2)
    return next(b for b in range(3, 1 << 12) if column(b))


def test_a_3d_filter_gradient_is_timed_at_the_first_batches_of_its_column_algorithm() -> None:
    from autotune.run.kernelprobe import probe_other_kernel
    from rewriter.cpukernels import cpu_kernels

    op = _filter_gradient()
    points = probe_other_kernel(op, 0.001, steps=2)
    if cpu_kernels().onednn:  # oneDNN's kernel keeps one algorithm at every size
        assert points is None
        return
    (e1, e2), (s1, s2) = points  # type: ignore[misc]
    first = _first_column_batch()
    per_sample = 16**3 * (1 + 4)  # image and gradient voxels of one sample
    fixed = 5 + 27 * 4  # the filter's sizes and the filter gradient
    assert (e1, e2) == (first * per_sample + fixed, 2 * first * per_sample + fixed)
    assert s1 > 0 and s2 > 0


def test_an_op_without_another_algorithm_is_not_probed() -> None:
    import tensorflow as tf

    from autotune.run.kernelprobe import probe_other_kernel

    @tf.function
    def grad(x, dy):  # type: ignore[no-untyped-def]
        return tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=(3, 3, 1, 4), out_backprop=dy, strides=[1] * 4, padding="SAME"
        )

    specs = tf.TensorSpec((2, 16, 16, 1), tf.float32), tf.TensorSpec((2, 16, 16, 4), tf.float32)
    graph = grad.get_concrete_function(*specs).graph
    op = next(op for op in graph.get_operations() if op.type == "Conv2DBackpropFilter")
    assert probe_other_kernel(op, 0.001, steps=2) is None
