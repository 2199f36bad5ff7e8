"""What TensorFlow's kernels do with buffers, by op type: forwarding and in-place reuse.

Forwarding ops return their input's buffer (no new memory). Element-wise kernels call
`forward_input_or_allocate_output` and take over an input buffer of the output's size when that
input has no other user. Counting either as new memory over-predicts the peak (docs/method.md).
"""

from __future__ import annotations

from simulator.graph import Graph

__all__ = [
    "LOOP_TYPES",
    "RECOMPUTABLE",
    "RECOMPUTABLE_HEAVY",
    "SHAPE_ONLY",
    "assignment",
    "forwards",
    "fused_together",
    "inline_kernel",
    "inplace_inputs",
    "scratch_bytes",
]

#: ops that run a function a number of times (`tf.while_loop`, Keras' recurrent layers)
LOOP_TYPES = frozenset({"While", "StatelessWhile"})

_FORWARD_FIRST = frozenset(
    {
        "Identity",
        "Snapshot",
        "StopGradient",
        "PreventGradient",
        "EnsureShape",
        "CheckNumerics",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "ReadVariableOp",
        "Bitcast",
    }
)

#: Element-wise kernels (TensorFlow's `UnaryOp` and `BinaryOp`, the same code on every device)
#: write their output into an input's buffer where it dies: each type here was seen doing so
#: in the CPU allocator's record (tests/rewriter/test_kernels.py keeps three of them checked)
_UNARY = frozenset(
    {
        "Relu",
        "Relu6",
        "Elu",
        "Selu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Neg",
        "Exp",
        "Expm1",
        "Log",
        "Log1p",
        "Sqrt",
        "Rsqrt",
        "Square",
        "Abs",
        "Sign",
        "Floor",
        "Ceil",
        "Round",
        "Rint",
        "Reciprocal",
        "Inv",
        "Erf",
        "Erfc",
        "Erfinv",
        "Ndtri",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Lgamma",
        "Digamma",
        "BesselI0e",
        "BesselI1e",
        "Softplus",
        "Softsign",
        "OnesLike",
        "ZerosLike",
        "Gelu",
        "_UnaryOpsComposition",
    }
)

#: Softmax's kernels: they write into their input's buffer on every device, and a GPU's holds
#: two temporaries of the output's shape (`rewriter.kernels.kernel_scratch`)
SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
#: Kernels that are not element-wise but write their output into input 0's buffer where it
#: dies (`forward_input_or_allocate_output({0}, ...)`, on every device)
_INPUT0_INPLACE = SOFTMAX | {"ClipByValue"}

_BINARY = frozenset(
    {
        "Add",
        "AddV2",
        "Sub",
        "Mul",
        "RealDiv",
        "Div",
        "DivNoNan",
        "MulNoNan",
        "Maximum",
        "Minimum",
        "SquaredDifference",
        "Pow",
        "FloorDiv",
        "FloorMod",
        "TruncateDiv",
        "TruncateMod",
        "Mod",
        "Atan2",
        "Xlogy",
        "Xdivy",
        "Xlog1py",
        "Igamma",
        "Igammac",
        "Zeta",
        "NextAfter",
        "ReluGrad",
        "Relu6Grad",
        "EluGrad",
        "SeluGrad",
        "LeakyReluGrad",
        "SigmoidGrad",
        "TanhGrad",
        "RsqrtGrad",
        "SqrtGrad",
        "ReciprocalGrad",
        "SoftplusGrad",
        "SoftsignGrad",
        "InvGrad",
        "BiasAdd",
        "BiasAddV1",
    }
)

#: Op types cheap enough to run twice, and pure: element-wise kernels whose output is a
#: function of their inputs alone (no random op, no stateful op, no variable read), that cost
#: about what it takes to read and write their tensors once: far less than a round trip of
#: their output over a host link.
RECOMPUTABLE = frozenset(
    (_UNARY - {"OnesLike", "ZerosLike", "_UnaryOpsComposition"})
    | {t for t in _BINARY if not t.endswith("Grad") and t != "Pow"}
    | {"Cast"}
)

#: Op types that are pure but not cheap: convolutions and matrix products, whose output is a
#: function of their inputs alone. A plan re-runs them only where the chain costs less than
#: the transfers its recompute saves (`PlanParams.recompute_heavy`).
RECOMPUTABLE_HEAVY = frozenset(
    {
        "Conv2D",
        "Conv3D",
        "DepthwiseConv2dNative",
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
    }
)

#: Sums and products: Grappler's arithmetic optimizer regroups them (a tree of adds summed as
#: one, products reordered to minimize broadcasts) and its constant folding pushes constants
#: down them, each only where no control edge touches the nodes.
REGROUPABLE = frozenset({"Add", "AddV2", "AddN", "Sub", "Mul", "Div", "RealDiv"})

#: The products among them: Grappler computes a regrouped product as another product, whose
#: inputs depend on the graph it is given (a swap-in or a recompute copy among them changes
#: them), so such a product never takes over a swapped-in or recomputed buffer
PRODUCTS = frozenset({"Mul", "Div", "RealDiv"})

#: Ops that read only a tensor's shape: never rerouted to a swap-in, never a swap trigger.
SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


def forwards(op_type: str, n_inputs: int, n_outputs: int) -> dict[int, int]:
    """Output index → input index whose buffer the output always shares."""
    if op_type in _FORWARD_FIRST and n_inputs and n_outputs:
        return {0: 0}
    if op_type == "IdentityN":
        return {i: i for i in range(min(n_inputs, n_outputs))}
    if op_type == "OptionalFromValue" and n_inputs == 1:  # an optional holding one value
        return {0: 0}
    return {}


def assignment(op_type: str) -> str:
    """How the op writes the variable of its input 0 (`Op.assigns`): `AssignVariableOp` adopts
    its value's buffer when it can forward it (resource_variable_ops.cc), the assign-adds update
    in place; where the variable's tensor is still referenced by a read (its reference count is
    not one), a write that does not adopt allocates a new buffer."""
    if op_type == "AssignVariableOp":
        return "adopt"
    if op_type in ("AssignAddVariableOp", "AssignSubVariableOp"):
        return "update"
    return ""


def inplace_inputs(op_type: str, n_inputs: int) -> tuple[int, ...]:
    """Input indices whose buffer output 0 may take over (same size, last use)."""
    if op_type in _UNARY or op_type in _INPUT0_INPLACE:
        return (0,) if n_inputs else ()
    if op_type in _BINARY:
        return tuple(range(min(n_inputs, 2)))
    if op_type == "AddN":
        return tuple(range(n_inputs))
    return ()


def scratch_bytes(op_type: str, input_bytes: list[int], output_bytes: list[int]) -> int:
    """Temporary bytes the kernel holds while it runs, beyond its outputs.

    Einsum transposes its operands into temporaries, multiplies into a temporary and transposes
    that into its output (tensorflow/core/kernels/linalg/einsum_op_impl.h); from sizes alone
    we count the operands and the product, an upper bound (capture reads the equation,
    `simulator.einsum`). MaxPoolGrad
    on oneDNN (TensorFlow's CPU build) recomputes the pooled output as a workspace: measured
    here as one temporary of the pooled output's size. SparseSoftmaxCrossEntropyWithLogits
    holds a temporary of the labels' shape in the logits' dtype (sparse_xent_op.cc), the size
    of its loss output: a few bytes for a classifier, a float per voxel for a segmentation.
    """
    if op_type == "Einsum":
        return sum(input_bytes) + sum(output_bytes)
    if op_type == "SparseSoftmaxCrossEntropyWithLogits" and output_bytes:
        return output_bytes[0]
    if op_type in ("MaxPoolGrad", "MaxPool3DGrad") and len(input_bytes) > 1:
        return input_bytes[1]  # oneDNN reruns the forward pool for its workspace (seen on CPU)
    return 0


#: Op types whose output is not a function of their inputs' values: never constant-folded.
_NOT_FOLDABLE_PREFIXES = ("Random", "Stateful", "Stateless", "Placeholder", "Var", "Read")
_NOT_FOLDABLE = frozenset(
    {"PyFunc", "EagerPyFunc", "NoOp", "Assert", "Print", "PrintV2", "AssignVariableOp"}
)


def foldable_ops(graph: Graph) -> frozenset[str]:
    """Ops Grappler's constant folding replaces by constants: a Const, a shape query (shapes
    are static here), and a deterministic op whose inputs all come from such ops. Their
    outputs live as constants; a swap or a control edge that touches one changes what
    Grappler folds and simplifies around it (under mixed precision, swapping GELU's
    constant 0.5 cast to bfloat16 changed the step's loss)."""
    folded: set[str] = set()
    for name, op in graph.ops.items():  # insertion order: inputs first
        constant = op.type == "Const" or op.type in SHAPE_ONLY
        of_constants = bool(op.inputs) and not _stateful(op.type)
        if constant or of_constants and all(graph.tensors[t].producer in folded for t in op.inputs):
            folded.add(name)
    return frozenset(folded)


def _stateful(op_type: str) -> bool:
    return op_type in _NOT_FOLDABLE or op_type.startswith(_NOT_FOLDABLE_PREFIXES)


def fused_together(graph: Graph) -> dict[str, tuple[str, ...]]:
    """Ops that TensorFlow may run as one kernel, by op: on the CPU, oneDNN's graph pass fuses a
    `Conv2DBackpropFilter` with the `BiasAddGrad` of the same gradient. A control edge that holds
    only one of them back can close a cycle through the fused kernel ("nodes in a cycle"); it
    must hold back each."""
    out: dict[str, tuple[str, ...]] = {}
    for op in graph.ops.values():
        if op.type != "Conv2DBackpropFilter" or len(op.inputs) < 3:
            continue
        grad = graph.tensors[op.inputs[2]]
        group = (op.name, *(c for c in grad.consumers if graph.ops[c].type == "BiasAddGrad"))
        if len(group) > 1:
            out.update(dict.fromkeys(group, group))
    return out


# Kernels that declare themselves inexpensive (`OpKernel::IsExpensive` returns false): TensorFlow's
# executor runs them inline, right after the op that made them ready. On the CPU every other
# kernel starts out expensive and stays so for about 90 steps (its cost estimate decays from
# 1e8 cycles by a tenth per run to the 8000-cycle threshold), longer than a measured step.
_INLINE_KERNELS = frozenset(
    {
        "Const",
        "HostConst",
        "Identity",
        "IdentityN",
        "StopGradient",
        "PreventGradient",
        "NoOp",
        "Placeholder",
        "_Arg",
        "_Retval",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "Reshape",
        "ExpandDims",
        "Squeeze",
        "StridedSliceGrad",
        "VarHandleOp",
    }
)


def inline_kernel(op_type: str) -> bool:
    """True when TensorFlow's executor runs this op type's CPU kernel inline (see above)."""
    return op_type in _INLINE_KERNELS
