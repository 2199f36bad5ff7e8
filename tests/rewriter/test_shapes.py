"""Shapes TensorFlow leaves open that capture computes."""

import pytest

from rewriter.shapes import broadcast_reduction


@pytest.mark.parametrize(
    "a,b",
    [
        ([2, 1, 3], [2, 4, 3]),
        ([1, 1, 3], [1, 4, 3]),
        ([3], [2, 4, 3]),
        ([2, 4], [2, 4]),
        ([4, 1], [1, 5]),
    ],
)
def test_broadcast_reduction_matches_tensorflow(a: list[int], b: list[int]) -> None:
    from tensorflow.python.ops import gen_array_ops

    rx, ry = gen_array_ops.broadcast_gradient_args(a, b)
    assert broadcast_reduction([a, b]) == (rx.numpy().tolist(), ry.numpy().tolist())
