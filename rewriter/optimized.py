"""The graph TensorFlow really runs: the captured step after Grappler's optimizations.

Before a `tf.function` runs, TensorFlow rewrites its graph with Grappler: constants are folded,
multiplication chains re-associated (which changes which buffers an element-wise kernel can take
over in place), and kernels fused (on oneDNN, Conv2D with BiasAdd and Relu into one
`_FusedConv2D`). A simulation in the order TensorFlow executed walks this graph, since the ops
it recorded are its ops. Plans are still derived on, and applied to, the captured graph.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from rewriter.capture import Captured, function_refs, graph_from_concrete, import_step
from simulator.graph import Graph
from simulator.opsemantics import LOOP_TYPES, REGROUPABLE

__all__ = ["optimized_graph", "rewritten_ops"]


def optimized_graph(
    captured: Captured, device: str = "CPU:0", *, variable_shapes: bool = False
) -> Graph:
    """The IR of `captured` as Grappler optimizes it for `device` ('CPU:0' or 'GPU:0'), with the
    optimizer settings of this process (`tf.config.optimizer`), as TensorFlow does at run time.
    By default Grappler is not told the variables' shapes: the executor's order model
    (`simulator.executor_orders`) was read off graphs whose shape queries it had not folded
    (see docs/method.md); told them (`variable_shapes`), it rewrites all it does at run time."""
    cf = captured.concrete_function
    optimized = _optimized_def(cf, device, variable_shapes=variable_shapes)
    _fresh_function_names(optimized)
    retyped = _retype_for_import(optimized)
    graph = graph_from_concrete(_wrap(cf, captured.specs, optimized), captured.variables)
    if retyped:  # the IR says what runs: bfloat16 (oneDNN's pass treats it as it does float)
        for tensor in graph.tensors.values():
            if tensor.dtype == "float16":
                tensor.dtype = "bfloat16"
    return graph


#: numbers the copies of library functions `_fresh_function_names` makes in this process
_COPIES = itertools.count()


def _fresh_function_names(graph_def: Any) -> None:
    """Give each function of `graph_def`'s library a name of its own, in every reference.
    Grappler optimizes the functions a step calls (Keras' grouped convolution on a CPU is
    one), and wrapping the graph adds them to the process under their names: a second step,
    or a second rewrite of one, with another body under a name already added is refused."""
    library = graph_def.library
    tag = f"_as_run{next(_COPIES)}"
    names = {f.signature.name: f.signature.name + tag for f in library.function}
    if not names:
        return
    for f in library.function:
        f.signature.name = names[f.signature.name]
        for node in f.node_def:
            _rename_calls(node, names)
    for node in graph_def.node:
        _rename_calls(node, names)
    for gradient in library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)


def _rename_calls(node: Any, names: dict[str, str]) -> None:
    """Rename the functions `node`'s attributes name (`f`, `body`, `then_branch`, lists)."""
    for func in function_refs(node):
        func.name = names.get(func.name, func.name)


def rewritten_ops(cf: Any, device: str = "CPU:0") -> frozenset[str]:
    """The sums and products (`REGROUPABLE`) of the concrete function `cf` that Grappler
    regroups when it optimizes the step for `device` (gone, or computing from other values),
    and the ops it fuses into one kernel (`_fused`).
    Values are named by what computes them (`_Values`), so that what changes no arithmetic
    does not count: a duplicate merged into its twin, a constant deduplicated or folded, an
    Identity or a no-op Reshape removed, commutative inputs sorted anew."""
    before = list(cf.graph.as_graph_def().node)
    after = _optimized_def(cf, device).node
    values = _Values(before, {n.name: n for n in after})
    out = set()
    for node in before:
        twin = values.kept.get(values.twin[node.name])
        if node.op in REGROUPABLE and (twin is None or values.of(twin) != values.of(node)):
            out.add(node.name)
    return frozenset(out | _fused(before, values.kept))


def _fused(before: list[Any], kept: dict[str, Any]) -> set[str]:
    """The ops Grappler's remapper fuses into one kernel (oneDNN's `_MklSwish` for a sigmoid
    times its input, `_FusedConv2D` for a convolution and its bias): each node kept under its
    name with another op type (the fused op; also a division made a product with a
    reciprocal) and the nodes it absorbed, gone from `kept`. A control edge on one of them
    keeps Grappler from rewriting it, and the separate kernels round otherwise."""
    by_name = {n.name: n for n in before}
    out: set[str] = set()
    # a loop Grappler lowers to frames keeps its name on another op, but is not a fusion: a
    # control edge on it holds its frames back and changes no arithmetic
    todo = [
        n.name
        for n in before
        if n.name in kept and kept[n.name].op != n.op and n.op not in LOOP_TYPES
    ]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        for i in by_name[name].input:
            src = i.lstrip("^").split(":")[0]
            node = by_name.get(src)
            if node is not None and src not in kept and node.op not in ("Const", *_PASS):
                todo.append(src)
    return out


#: ops whose output k is their input k
_PASS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot"})


class _Values:
    """The value of each tensor of a GraphDef (built inputs first) against its optimized
    form `kept`: a node's twin is the first node of the same op, attributes and input values
    (Grappler's deduplication keeps one), but for an argument or an op with state
    (`_distinct`); an Identity passes its input on, and so does a node Grappler removed that
    had one non-constant input (a no-op Reshape)."""

    def __init__(self, nodes: list[Any], kept: dict[str, Any]) -> None:
        self.kept = kept
        self.twin: dict[str, str] = {}
        self.passes: dict[str, list[str]] = {}
        consts = {n.name for n in nodes if n.op == "Const"}
        first: dict[tuple[Any, ...], str] = {}
        for node in nodes:
            data = [i for i in node.input if not i.startswith("^")]
            attrs = tuple(sorted((k, v.SerializeToString()) for k, v in node.attr.items()))
            own = node.name if _distinct(node) else ""  # an argument, or an op with state
            key = (node.op, attrs, tuple(self.value(i) for i in data), own)
            self.twin[node.name] = first.setdefault(key, node.name)
            variable = [i for i in data if i.split(":")[0] not in consts]
            gone = self.twin[node.name] not in kept and node.name not in kept
            if node.op in _PASS or (gone and len(variable) == 1):
                self.passes[node.name] = data if node.op in _PASS else variable

    def value(self, tensor: str) -> str:
        """The tensor `node` or `node:k` as the tensor that computes it."""
        for _ in range(len(self.twin) + 1):
            name, _, index = tensor.partition(":")
            k = int(index or 0)
            if name not in self.passes:
                return f"{self.twin.get(name, name)}:{k}"
            passed = self.passes[name]
            tensor = passed[k] if k < len(passed) else passed[0]
        return tensor

    def of(self, node: Any) -> list[str]:
        """The values a node reads that are computed while the step runs (not a constant,
        nor a value Grappler folded into one)."""
        data = (self.value(i) for i in node.input if not i.startswith("^"))
        return sorted(v for v in data if self._computed(v.partition(":")[0]))

    def _computed(self, name: str) -> bool:
        return name in self.kept and self.kept[name].op != "Const"


def _distinct(node: Any) -> bool:
    """Whether `node` is a value of its own whatever its attributes and inputs: an argument
    of the step (each variable's handle is one) or an op with state, which Grappler never
    merges with its like (two reads of one variable may see different values)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(node.op)
    return node.op == "Placeholder" or bool(op_def and op_def.is_stateful)


def _retype_for_import(graph_def: Any) -> bool:
    """Make bfloat16 read half throughout the graph when an op in it is registered without
    bfloat16, so that the graph imports. Grappler fuses kernels the runtime has in bfloat16
    (oneDNN's `_FusedConv2D` under `mixed_bfloat16`) while the op's registered signature allows
    only half, float and double, which the importer checks (inputs included, hence every op).
    Half has bfloat16's size, so every tensor keeps its bytes; only dtype names read half.
    Returns whether it retyped a graph that had no half of its own, so that every half of the
    imported graph was bfloat16."""
    from tensorflow.core.framework import types_pb2

    bf16, half = types_pb2.DT_BFLOAT16, types_pb2.DT_HALF
    if not any(_refuses(node, bf16) for node in graph_def.node):
        return False
    had_half = any(_has_type(node, half) for node in graph_def.node)
    for node in graph_def.node:
        for value in node.attr.values():
            if value.type == bf16:
                value.type = half
            if bf16 in value.list.type:
                value.list.type[:] = [half if t == bf16 else t for t in value.list.type]
            if value.tensor.dtype == bf16:
                value.tensor.dtype = half
    return not had_half


def _has_type(node: Any, dtype: int) -> bool:
    """True when any attribute of `node` names `dtype`."""
    return any(
        v.type == dtype or dtype in v.list.type or v.tensor.dtype == dtype
        for v in node.attr.values()
    )


def _refuses(node: Any, dtype: int) -> bool:
    """True when `node` has `dtype` for a type attribute its registered op does not allow."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(node.op)
    for attr in op_def.attr if op_def else ():
        allowed = attr.allowed_values.list.type
        given = node.attr[attr.name].type if attr.name in node.attr else None
        if attr.type == "type" and given == dtype and allowed and dtype not in allowed:
            return True
    return False


def _optimized_def(cf: Any, device: str, variable_shapes: bool = True) -> Any:
    """The GraphDef of concrete function `cf` after Grappler, for `device`, with the optimizer
    settings of this process (`tf.config.optimizer`), as TensorFlow does at run time (told the
    variables' shapes, `_as_args`, as a running function's arguments tell it)."""
    from tensorflow.python.eager import context
    from tensorflow.python.grappler import tf_optimizer

    meta, args = _meta_graph(cf, device, variable_shapes)
    config = context.context().config
    optimized = tf_optimizer.OptimizeGraph(config, meta, verbose=False)
    for node in optimized.node:
        if node.name in args:
            node.CopyFrom(args[node.name])
    return optimized


def _meta_graph(cf: Any, device: str, variable_shapes: bool) -> tuple[Any, dict[str, Any]]:
    """A MetaGraphDef of the step's graph, placed on `device`, fetching its outputs and the
    ops it must run (variable updates), so that Grappler prunes nothing that runs; and the
    placeholders `_as_args` made arguments, by name."""
    import tensorflow as tf

    graph_def = cf.graph.as_graph_def()
    placed = f"/job:localhost/replica:0/task:0/device:{device}"
    for node in graph_def.node:
        node.device = node.device or placed
    args = _as_args(graph_def, cf.graph) if variable_shapes else {}
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=cf.graph)
    fetch = meta.collection_def["train_op"].node_list.value
    fetch.extend(t.name for t in cf.outputs)
    fetch.extend(op.name for op in cf.graph.control_outputs)
    return meta, args


def _as_args(graph_def: Any, graph: Any) -> dict[str, Any]:
    """Make each variable's placeholder in `graph_def` the `_Arg` node a running function has,
    with the variable's dtype and shape (`_handle_dtypes`, `_handle_shapes`), and return the
    placeholders replaced, by name. Grappler infers a variable read's shape only from those
    attributes; without them it leaves undone what it does at run time (a residual sum and
    the batch norm before it summed as one tree of adds, a bias fused into its convolution)."""
    import tensorflow as tf
    from tensorflow.python.ops import handle_data_util

    shapes = {
        t.op.name: handle_data_util.get_resource_handle_data(t).shape_and_type
        for t in graph.inputs
        if t.dtype == tf.resource
    }
    replaced: dict[str, Any] = {}
    for node in graph_def.node:
        known = shapes.get(node.name)
        if node.op != "Placeholder" or not known:
            continue
        replaced[node.name] = type(node)()
        replaced[node.name].CopyFrom(node)
        del node.attr["dtype"], node.attr["shape"]
        node.op = "_Arg"
        node.attr["T"].type = tf.resource.as_datatype_enum
        node.attr["index"].i = len(replaced) - 1
        node.attr["_handle_dtypes"].list.type.extend(k.dtype for k in known)
        node.attr["_handle_shapes"].list.shape.extend(k.shape for k in known)
    return replaced


def _wrap(cf: Any, specs: tuple[Any, ...], graph_def: Any) -> Any:
    """`graph_def` as a function of the step's arguments, with its variable handles mapped in."""
    import tensorflow as tf

    def body(*inputs: Any) -> Any:
        outputs = import_step(cf, graph_def, inputs)[0]
        _keep_shapes(tf.compat.v1.get_default_graph(), cf.graph)
        return outputs

    return tf.compat.v1.wrap_function(body, signature=list(specs))


def _keep_shapes(graph: Any, step: Any) -> None:
    """Give each output the importer left without a static shape (a py_func's: a rewritten
    step's emulated swap ops) the shape the same output has in the step's graph."""
    for op in graph.get_operations():
        for t in op.outputs:
            if t.shape.is_fully_defined():
                continue
            # not for an op Grappler made, or a shape the step's graph does not know either
            with contextlib.suppress(KeyError, ValueError):
                t.set_shape(step.get_tensor_by_name(t.name).shape)
