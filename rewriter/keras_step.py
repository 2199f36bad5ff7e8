"""Build the training step of a Keras model with a loss and an optimizer, and its input specs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewriter.capture import CaptureError

__all__ = ["input_specs", "is_keras_model", "training_step"]


def is_keras_model(obj: Any) -> bool:
    """True for a keras.Model (checked without importing Keras when it is not loaded)."""
    import sys

    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def training_step(model: Any, loss: Any, optimizer: Any) -> Callable[..., Any]:
    """A tf.function doing forward, loss, gradients and the optimizer update; returns the loss."""
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    opt = keras.optimizers.get(optimizer) if isinstance(optimizer, str) else optimizer
    if not opt.built:
        opt.build(model.trainable_variables)

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            value = loss_fn(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    step.loss_fn = loss_fn
    step.optimizer = opt
    return step


def input_specs(
    model: Any, loss: Any, batch_size: int, input_shape: tuple[int, ...] | None = None
) -> tuple[Any, Any]:
    """TensorSpecs for (x, y) at `batch_size`: x from the model's input, y from output and loss."""
    import tensorflow as tf

    if batch_size < 1:
        raise CaptureError(f"batch size must be a positive integer, got {batch_size}")
    x_shape = input_shape or _tail(model.inputs[0].shape, "input", model)
    y_tail = _tail(model.outputs[0].shape, "output", model)
    x_dtype = tf.as_dtype(model.inputs[0].dtype)
    x = tf.TensorSpec((batch_size, *x_shape), x_dtype, name="x")
    if _is_sparse(loss):
        y = tf.TensorSpec((batch_size, *y_tail[:-1]), tf.int32, name="y")
    else:
        y = tf.TensorSpec((batch_size, *y_tail), tf.float32, name="y")
    return x, y


def _tail(shape: Any, what: str, model: Any) -> tuple[int, ...]:
    dims = tuple(shape)[1:]
    if any(d is None for d in dims):
        raise CaptureError(
            f"model {model.name!r} has {what} shape {tuple(shape)}: give input_shape= "
            "(without the batch dimension) so every tensor size is known"
        )
    return tuple(int(d) for d in dims)


def _is_sparse(loss: Any) -> bool:
    name = loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)
    return "sparse" in str(name).lower()
