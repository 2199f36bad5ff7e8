"""cuDNN's fused RNN ops: refused in one line without a GPU, sized by their run on one."""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

from rewriter import cudnn
from rewriter.capture import capture_function
from simulator.derive import PlanContext
from simulator.errors import UserError

T, B, FEATURES, U = 20, 8, 16, 32


def _cudnn_step() -> tuple[Any, Any]:
    """A training step on one cuDNN LSTM op (as Keras builds on a GPU) and its gradient."""
    w = tf.Variable(tf.random.normal([4 * U * (FEATURES + U) + 8 * U], seed=1))

    @tf.function
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            h0 = tf.zeros([1, B, U])
            out, *_ = tf.raw_ops.CudnnRNNV3(
                input=x, input_h=h0, input_c=h0, params=w, sequence_lengths=tf.fill([B], T),
                rnn_mode="lstm", is_training=True, time_major=True,
            )  # fmt: skip
            loss = tf.reduce_sum(out)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    return step, tf.TensorSpec([T, B, FEATURES], tf.float32)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU runs the op")
def test_without_a_gpu_a_cudnn_rnn_is_refused_in_one_line_saying_what_to_do() -> None:
    step, spec = _cudnn_step()
    with pytest.raises(UserError) as err:
        capture_function(step, spec)
    message = str(err.value)
    assert "\n" not in message and "'CudnnRNNV3'" in message and "use_cudnn=False" in message


def test_the_reserve_space_has_the_size_the_op_had_when_it_ran(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reserve = 3 * T * B * U  # a stand-in for what cuDNN gives on a GPU
    seen: list[Any] = []

    def ran(op: Any) -> tuple[Any, ...]:
        seen.append(op)
        return (*(o.shape for o in op.outputs[:3]), tf.TensorShape([reserve]), tf.TensorShape([8]))

    monkeypatch.setattr(cudnn, "_run_on_gpu", ran)
    step, spec = _cudnn_step()
    graph = capture_function(step, spec).graph
    forward = next(op for op in graph.ops.values() if op.type == "CudnnRNNV3")
    saved = graph.tensors[forward.outputs[3]]
    assert (saved.shape, saved.nbytes) == ((reserve,), 4 * reserve)
    # the gradient reads it: it is what a plan may swap
    assert any(graph.ops[c].type == "CudnnRNNBackpropV3" for c in saved.consumers)
    assert saved.name in {c.tensor for c in PlanContext.build(graph).candidates}
    assert seen and {op.type for op in seen} == {"CudnnRNNV3"}
