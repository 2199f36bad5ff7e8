"""Branches (`If`, `Case`): what the gradient keeps of the branch taken, and a branch's working set.

TensorFlow 2 (`cond_v2`) builds the gradient of a branch op from its branches' intermediates,
which the forward op returns as extra outputs: in the branch that computes a value, an optional
holding it (`OptionalFromValue`); in the others, an empty one (`OptionalNone`). Such an output
is a `variant` scalar that holds the value's buffers, so capture gives it the bytes of the
largest value any branch keeps there. Which branch runs depends on the data, so the op's
working set is the largest of its branches' (their live peak above what they read and return)
and its outputs are sized for the branch that keeps the most: a bound, not the step's own run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.errors import UserError

__all__ = [
    "BRANCH_TYPES",
    "BranchError",
    "branch_functions",
    "kept_bytes",
    "largest_working_set",
    "unwrapped",
    "wrapped_bytes",
]

BRANCH_TYPES = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})


class BranchError(ValueError):
    """A branch keeps a value whose size is not known before the step runs."""


def branch_functions(op: Any) -> list[str]:
    """The names of the functions branch op `op` chooses from."""
    if op.type.endswith("If"):
        return [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
    return [f.name for f in op.get_attr("branches")]


def kept_bytes(op: Any, branches: list[Any]) -> dict[int, int]:
    """Per `variant` output of `op`, the bytes of the largest value a branch (a FuncGraph of
    `branches`) keeps in it for the gradient."""
    out = {}
    for i, t in enumerate(op.outputs):
        if t.dtype.name == "variant":
            out[i] = max(_wrapped(op, g.outputs[i]) for g in branches)
    return out


def wrapped_bytes(op: Any, branch: Any) -> int:
    """Bytes of the values `branch` (a FuncGraph) of `op` keeps for the gradient."""
    return sum(_wrapped(op, out) for out in branch.outputs)


def _wrapped(op: Any, out: Any) -> int:
    """Bytes of the values optional `out` of a branch holds (0 for any other variant)."""
    if out.op.type != "OptionalFromValue":
        return 0
    total = 0
    for t in out.op.inputs:
        if not t.shape.is_fully_defined():
            raise BranchError(
                f"branch op {op.name!r} ({op.type}) keeps {t.name!r} of shape {t.shape} for "
                "the gradient; give fully defined input shapes (tf.TensorSpec with no None)"
            )
        total += int(t.shape.num_elements()) * t.dtype.size
    return total


def unwrapped(tf_op: Any) -> dict[int, int]:
    """The outputs that share their input's buffer: in a branch of a gradient, the values an
    optional argument holds (the branch op's input counts them). Elsewhere an optional comes
    from a lowered branch's `Merge`, which holds no bytes of its own: its values count anew."""
    if tf_op.type == "OptionalGetValue" and tf_op.inputs[0].op.type == "Placeholder":
        return {j: 0 for j in range(len(tf_op.outputs))}
    return {}


def largest_working_set(op: Any, branches: list[Any], size: Callable[[Any], int]) -> int:
    """The largest working set `size` gives a branch of `op` (its live peak above what it
    reads and returns, where `size` can build it). A branch with a shape known only when it
    runs (a sparse gradient's rows inside a loss-scale optimizer's conditional update) is
    left out, and a note says so: refusing it would refuse every mixed-precision step."""
    from rewriter.costs import note

    sets = []
    for body in branches:
        try:
            sets.append(size(body))
        except UserError as err:
            note(f"branch {body.name!r} of op {op.name!r} ({op.type}) is not sized: {err}")
    return max(sets, default=0)
