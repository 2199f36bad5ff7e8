"""What a kernel does with memory, read from the TensorFlow op that runs it: which input buffers
its output may take over, in the order the kernel tries them, and its temporary bytes."""

from __future__ import annotations

from typing import Any

from simulator.einsum import einsum_temporaries
from simulator.opsemantics import SOFTMAX, inplace_inputs, scratch_bytes

__all__ = ["inplace_order", "kernel_scratch"]


def inplace_order(tf_op: Any) -> tuple[int, ...]:
    """The inputs whose buffer output 0 may take over, in the order the kernel tries them.

    A kernel takes the first of its candidates whose buffer nothing else holds. Grappler's
    arithmetic optimizer sorts the inputs of a commutative op by name (its canonical form,
    grappler/utils/canonicalizer.cc) before the step runs, so for an `AddN` or a `Mul` the
    first is the one whose name sorts first, not the one the graph was built with."""
    candidates = inplace_inputs(tf_op.type, len(tf_op.inputs))
    if len(candidates) < 2 or not _commutative(tf_op):
        return candidates
    return tuple(sorted(candidates, key=lambda i: _input_name(tf_op.inputs[i])))


def kernel_scratch(tf_op: Any) -> int:
    """Temporary bytes the op's kernel holds while it runs, beyond its outputs, on a GPU
    (`simulator.opsemantics.scratch_bytes`; an Einsum's from its equation where it can).

    A GPU's Softmax and LogSoftmax (softmax_op_gpu.cu.cc) hold two temporaries of the output's
    shape: the row maxima in the output's type and the row sums in its accumulator's (float
    for half precision). The CPU's kernel holds none (`rewriter.cpukernels`)."""
    if tf_op.type in SOFTMAX and tf_op.outputs[0].shape.is_fully_defined():
        out = tf_op.outputs[0]
        return int(out.shape.num_elements()) * (out.dtype.size + max(out.dtype.size, 4))
    if tf_op.type == "Einsum" and all(t.shape.is_fully_defined() for t in tf_op.inputs):
        shapes = [t.shape.as_list() for t in tf_op.inputs]
        equation = tf_op.get_attr("equation").decode()
        temps = einsum_temporaries(equation, shapes, tf_op.outputs[0].dtype.size)
        if temps is not None:
            return sum(temps)
    sizes = [[_bytes(t) for t in tensors] for tensors in (tf_op.inputs, tf_op.outputs)]
    return scratch_bytes(tf_op.type, *sizes)


def _commutative(tf_op: Any) -> bool:
    """Grappler's `IsCommutative`: the op's definition says so (`Add` is not marked)."""
    return tf_op.type == "Add" or bool(tf_op.op_def.is_commutative)


def _input_name(tensor: Any) -> str:
    """An input as a GraphDef names it: `op` for output 0, `op:k` for the others."""
    op = tensor.op.name
    return op if tensor.value_index == 0 else f"{op}:{tensor.value_index}"


def _bytes(t: Any) -> int:
    """Bytes of a statically shaped tensor (0 for handles and open shapes)."""
    known = t.shape.is_fully_defined() and t.dtype.name not in ("resource", "variant", "string")
    return int(t.shape.num_elements()) * t.dtype.size if known else 0
