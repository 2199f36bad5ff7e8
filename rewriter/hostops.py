"""The swap ops of a rewritten step: Identity ops on the host device (`device` mode), or copies
to and from an emulated host, a store of arrays outside TensorFlow's allocator (`emulated`),
so that a CPU-only machine shows the device-side saving in TensorFlow's own peak."""

from __future__ import annotations

import itertools
import threading
from typing import Any

__all__ = ["swap_in", "swap_out"]


def swap_out(tensor: Any, mode: str, readers: int, name: str, element: Any = None) -> Any:
    """The swap-out of `tensor` (read back by `readers` swap-ins): on the host device an
    Identity (`device` mode: TensorFlow copies a list's elements with it), or a copy into the
    emulated host that returns its key. A loop's list has `element`, the (dtype, shape) of
    its elements, and goes to the emulated host stacked into one array."""
    import tensorflow as tf

    if mode == "device":
        return tf.identity(tensor, name=name)
    if element is not None:
        dtype, shape = element
        tensor = tf.raw_ops.TensorListStack(
            input_handle=tensor, element_shape=tf.constant(list(shape), tf.int32),
            element_dtype=tf.as_dtype(dtype),
            name=f"{name}/stack",
        )  # fmt: skip
    token = tf.numpy_function(_HOST.put_with(readers), [tensor], tf.int64, stateful=True, name=name)
    token.set_shape(())
    return token


def swap_in(stored: Any, like: Any, mode: str, name: str, element: Any = None) -> Any:
    """The swap-in of what `swap_out` made, shaped `like` the swapped tensor: an Identity on
    the host (`device`), or the emulated host's array copied into TensorFlow's allocator (for
    a list with `element` of `like`'s `shape`, its stack made a list again)."""
    import tensorflow as tf

    if mode == "device":
        return tf.identity(stored, name=name)  # on the host, waiting for its trigger
    dtype, shape = like.dtype, like.shape
    if element is not None:
        dtype, shape = tf.as_dtype(element[0]), [None, *element[1]]
    fetched = tf.numpy_function(_HOST.take, [stored], dtype, stateful=True, name=f"{name}/fetch")
    fetched.set_shape(shape)
    if element is not None:  # the list's elements are copies of the fetched array's rows
        return tf.raw_ops.TensorListFromTensor(
            tensor=fetched, element_shape=tf.constant(list(element[1]), tf.int32), name=name
        )
    # a Python function's output has no static shape for Grappler; without one its arithmetic
    # optimizer reorders the readers' multiplication chains differently (last-bit changes)
    shaped = tf.raw_ops.EnsureShape(input=fetched, shape=like.shape, name=f"{name}/fetch/shape")
    # TensorFlow may wrap the returned array without copying it; the copy puts the swapped-in
    # tensor in TensorFlow's allocator, where a real swap-in would land
    return tf.raw_ops.DeepCopy(x=shaped, name=name)


class _HostStore:
    """The emulated host: arrays kept outside TensorFlow's allocator, each until its last
    swap-in has taken it back."""

    def __init__(self) -> None:
        self._items: dict[int, list[Any]] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()

    def put_with(self, readers: int) -> Any:
        """A swap-out function for a tensor that `readers` swap-ins will take back."""
        import numpy as np

        def put(array: Any) -> Any:
            stored = _aligned_empty(array.shape, array.dtype)
            np.copyto(stored, array)
            with self._lock:
                key = next(self._keys)
                self._items[key] = [stored, readers]
            return np.int64(key)

        return put

    def take(self, key: Any) -> Any:
        with self._lock:
            item = self._items[int(key)]
            item[1] -= 1
            if item[1] == 0:
                del self._items[int(key)]
        return item[0]


#: the alignment TensorFlow's allocator gives every buffer (`Allocator::kAllocatorAlignment`)
_TF_ALIGNMENT = 64


def _aligned_empty(shape: Any, dtype: Any) -> Any:
    """An empty array at an address TensorFlow's allocator would give: a Python function's
    output at such an address becomes a tensor without a copy, one elsewhere is copied into
    TensorFlow's allocator, where the swap-in's own copy (`DeepCopy`) then made a second."""
    import numpy as np

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _TF_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _TF_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


_HOST = _HostStore()
