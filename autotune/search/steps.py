"""The step at any batch: a capturer from the step and its example arguments, and the batch
those arguments give."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewriter.capture import Captured
from rewriter.replicas import Distributed
from simulator.errors import UserError

__all__ = ["leading_dim", "model_name", "step_capturer"]


def model_name(step_or_model: Any) -> str:
    """A name for a step's study: the model's or the function's."""
    return str(getattr(step_or_model, "name", None) or getattr(step_or_model, "__name__", "step"))


def step_capturer(
    step: Any,
    example_args: tuple[Any, ...],
    loss: Any,
    optimizer: Any,
    batch_size: int | None,
    input_shape: tuple[int, ...] | None,
    distributed: Distributed | None = None,
) -> Callable[[int | None], Captured]:
    """capture(batch): the step captured at `batch` (None: as given)."""
    from autotune.api import capture
    from rewriter.capture import to_specs

    def at(batch: int | None) -> Captured:
        if batch is None:
            kw = {"loss": loss, "optimizer": optimizer, "batch_size": batch_size}
            return capture(
                step, *example_args, **kw, input_shape=input_shape, distributed=distributed
            )
        if example_args:
            specs = [_with_batch(s, batch) for s in to_specs(example_args)]
            return capture(step, *specs, loss=loss, optimizer=optimizer, distributed=distributed)
        return capture(step, loss=loss, optimizer=optimizer, batch_size=batch)

    return at


def leading_dim(example_args: tuple[Any, ...]) -> int | None:
    """The batch size of example arguments or specs (their first dimension), if they give one."""
    from rewriter.capture import to_specs

    dims = [s.shape[0] for s in to_specs(example_args) if len(s.shape)] if example_args else []
    return int(dims[0]) if dims and dims[0] is not None else None


def _with_batch(spec: Any, batch: int) -> Any:
    import tensorflow as tf

    if not len(spec.shape):
        raise UserError(f"argument {spec.name or ''} is a scalar: it has no batch dimension")
    return tf.TensorSpec([batch, *spec.shape[1:]], spec.dtype, name=spec.name)
