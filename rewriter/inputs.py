"""Arguments as the original step accepts them: lossless conversions made, the rest refused in
one line that names the argument, the expected and the given dtype and shape."""

from __future__ import annotations

from typing import Any

from simulator.errors import UserError

__all__ = ["InputError", "batch_of", "conform"]


class InputError(UserError):
    """An argument the step cannot take; the message names it and what was expected."""


#: (given, expected) dtype pairs converted silently: integers that fit, and float64 arrays
#: (numpy's default) where the step takes float32, as Keras' own fit converts them.
_CONVERSIONS = {("int64", "int32"), ("int32", "int64"), ("float64", "float32")}


def conform(args: tuple[Any, ...], specs: tuple[Any, ...], *, any_batch: bool) -> list[Any]:
    """`args` as tensors of the dtypes in `specs`. With `any_batch` the leading dimension may
    differ from the specs' (the same for every argument); every other dimension must match."""
    if len(args) != len(specs):
        raise InputError(f"the step takes {len(specs)} arguments, got {len(args)}")
    out = [_conform(i, a, s, any_batch) for i, (a, s) in enumerate(zip(args, specs))]
    batches = {int(t.shape[0]) for t in out if t.shape.rank}
    if any_batch and len(batches) > 1:  # (else each has its spec's: replicas' shares may differ)
        raise InputError(f"the arguments have different batch sizes: {sorted(batches)}")
    return out


def batch_of(tensors: list[Any]) -> int | None:
    """The leading dimension of the first argument that has one."""
    return next((int(t.shape[0]) for t in tensors if t.shape.rank), None)


def _conform(i: int, arg: Any, spec: Any, any_batch: bool) -> Any:
    import tensorflow as tf

    tensor = arg if isinstance(arg, tf.Tensor) else tf.convert_to_tensor(arg)
    name = f"argument {i}" + (f" ({spec.name})" if spec.name else "")
    given, want = tensor.dtype.name, spec.dtype.name
    if not _shape_fits(tensor.shape, spec.shape, any_batch):
        raise InputError(
            f"{name}: expected {want} of shape {_shape(spec.shape, any_batch)}, "
            f"got {given} of shape {tensor.shape.as_list()}"
        )
    if given == want:
        return tensor
    if (given, want) not in _CONVERSIONS or not _fits(tensor, spec.dtype):
        raise InputError(
            f"{name}: expected {want} of shape {_shape(spec.shape, any_batch)}, got {given}; "
            f"convert it to {want}"
        )
    return tf.cast(tensor, spec.dtype)


def _shape_fits(shape: Any, expected: Any, any_batch: bool) -> bool:
    got, want = shape.as_list(), expected.as_list()
    if len(got) != len(want):
        return False
    skip = 1 if any_batch and want else 0
    return all(w is None or g == w for g, w in zip(got[skip:], want[skip:]))


def _shape(shape: Any, any_batch: bool) -> str:
    dims = ["any" if d is None else str(d) for d in shape.as_list()]
    if any_batch and dims:
        dims[0] = "batch"
    return f"[{', '.join(dims)}]"


def _fits(tensor: Any, dtype: Any) -> bool:
    """True when every value of an integer tensor lies in `dtype`'s range (floats: always)."""
    import tensorflow as tf

    if not dtype.is_integer or tf.size(tensor) == 0:
        return True
    low, high = tf.reduce_min(tensor), tf.reduce_max(tensor)
    return bool(low >= dtype.min) and bool(high <= dtype.max)
