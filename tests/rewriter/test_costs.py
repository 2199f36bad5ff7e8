import pytest

from simulator import get_preset

pytestmark = pytest.mark.tf


def test_ops_that_read_weights_get_a_cost() -> None:
    """A MatMul reads its weight through a resource handle; Grappler must still see its shape."""
    import tensorflow as tf

    from rewriter.capture import capture_function
    from rewriter.costs import grappler_costs

    w = tf.Variable(tf.ones([256, 512]))

    @tf.function
    def step(x):  # type: ignore[no-untyped-def]
        return tf.reduce_sum(x @ w)

    cap = capture_function(step, tf.TensorSpec([1024, 256], tf.float32))
    costs, _ = grappler_costs(cap.concrete_function, get_preset("v100-16gb-nvlink2"))
    matmul = next(n for n, op in cap.graph.ops.items() if op.type == "MatMul")
    # 2 * 1024 * 256 * 512 flops at V100's rate take microseconds, not nothing
    assert costs[matmul] > 1e-6
