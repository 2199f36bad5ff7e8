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


def test_a_cpu_is_estimated_at_its_cores_and_clock() -> None:
    """Grappler prices a CPU at one flop per core and cycle: a MatMul on 2 cores at 2 GHz
    takes its flops / 4e9 seconds, far longer than on a V100."""
    from dataclasses import replace

    import tensorflow as tf

    from rewriter.capture import capture_function
    from rewriter.costs import grappler_costs

    w = tf.Variable(tf.ones([256, 512]))

    @tf.function
    def step(x):  # type: ignore[no-untyped-def]
        return tf.reduce_sum(x @ w)

    cap = capture_function(step, tf.TensorSpec([1024, 256], tf.float32))
    cpu = replace(get_preset("v100-16gb-nvlink2"), kind="CPU", sm_count=2, clock_mhz=2000)
    matmul = next(n for n, op in cap.graph.ops.items() if op.type == "MatMul")
    on_cpu = grappler_costs(cap.concrete_function, cpu)[0][matmul]
    on_gpu = grappler_costs(cap.concrete_function, get_preset("v100-16gb-nvlink2"))[0][matmul]
    assert on_cpu == pytest.approx(2 * 1024 * 256 * 512 / 4e9, rel=0.05)
    assert on_cpu > 20 * on_gpu
