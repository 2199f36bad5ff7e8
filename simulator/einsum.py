"""The temporary buffers of TensorFlow's Einsum kernel, from its equation and operand shapes.

The kernel (tensorflow/core/kernels/linalg/einsum_op_impl.h, the same on every device) brings
each operand's dimensions into the order batch, free, contract, reduce, multiplies the two into
a temporary of shape batch + free0 + free1, and transposes that into the output's order:

- an operand is transposed into a temporary of its size unless its dimensions are already in
  that order, or in it with free and contract swapped (the matrix product then reads it
  transposed);
- the product is the output when its dimensions are in the output's order; otherwise the
  transpose allocates the output and the product is one more temporary.

Dimensions are ranked by kind, then by the label's first appearance in the equation. A
Keras `MultiHeadAttention` transposes both operands of its scores (`aecd,abcd->acbe`) and the
value and the product of its output (`acbe,aecd->abcd`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["einsum_temporaries"]

_BATCH, _FREE, _CONTRACT, _REDUCE = 1, 2, 3, 4
#: the rank of each kind when an operand may keep free and contract swapped
_SWAPPED = {_BATCH: 1, _CONTRACT: 2, _FREE: 3, _REDUCE: 4}


def einsum_temporaries(
    equation: str, shapes: Sequence[Sequence[int]], itemsize: int
) -> tuple[int, ...] | None:
    """Bytes of each temporary the kernel allocates while it runs (beyond its output), or None
    where the rule does not cover the equation (an ellipsis, a repeated label, a reduced
    label, more than two operands): the caller then bounds it."""
    parsed = _parse(equation, len(shapes))
    if parsed is None:
        return None
    inputs, output = parsed
    if any(len(labels) != len(shape) for labels, shape in zip(inputs, shapes, strict=True)):
        return None
    ids = {c: i for i, c in enumerate(dict.fromkeys("".join(inputs) + output))}
    kinds = {c: _kind(c, inputs, output) for c in ids}
    if _REDUCE in kinds.values():
        return None
    temps: list[int] = []
    free: list[str] = []
    for labels, shape in zip(inputs, shapes, strict=True):
        ordered = _operand_order(labels, kinds, ids)
        if ordered != labels and len(labels) > 1:
            temps.append(math.prod(shape) * itemsize)
        free.extend(c for c in ordered if kinds[c] == _FREE)
    if len(inputs) == 2:
        batch = sorted((c for c in ids if kinds[c] == _BATCH), key=ids.__getitem__)
        product = "".join(batch + free)
        if product != output and len(output) > 1:
            sizes = {c: n for labels, shape in zip(inputs, shapes, strict=True)
                     for c, n in zip(labels, shape, strict=True)}  # fmt: skip
            temps.append(math.prod(sizes[c] for c in output) * itemsize)
    return tuple(temps)


def _parse(equation: str, n_operands: int) -> tuple[list[str], str] | None:
    """(each operand's labels, the output's), or None for what the rule leaves out."""
    if "->" not in equation or "." in equation:
        return None
    left, output = equation.replace(" ", "").split("->")
    inputs = left.split(",")
    if len(inputs) != n_operands or n_operands > 2:
        return None
    if any(len(set(labels)) != len(labels) for labels in (*inputs, output)):
        return None
    return inputs, output


def _kind(label: str, inputs: list[str], output: str) -> int:
    shared = sum(label in labels for labels in inputs) > 1
    kept = label in output
    if shared:
        return _BATCH if kept else _CONTRACT
    return _FREE if kept else _REDUCE


def _operand_order(labels: str, kinds: dict[str, int], ids: dict[str, int]) -> str:
    """The operand's labels in the order the kernel multiplies it in: as they are when they
    are sorted with free and contract swapped, else sorted by kind and appearance."""
    swapped = [(_SWAPPED[kinds[c]], ids[c]) for c in labels]
    if swapped == sorted(swapped):
        return labels
    return "".join(sorted(labels, key=lambda c: (kinds[c], ids[c])))
