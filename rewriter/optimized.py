"""The graph TensorFlow really runs: the captured step after Grappler's optimizations.

Before a `tf.function` runs, TensorFlow rewrites its graph with Grappler: constants are folded,
multiplication chains re-associated (which changes which buffers an element-wise kernel can take
over in place), and kernels fused (on oneDNN, Conv2D with BiasAdd and Relu into one
`_FusedConv2D`). A simulation in the order TensorFlow executed walks this graph, since the ops
it recorded are its ops. Plans are still derived on, and applied to, the captured graph.
"""

from __future__ import annotations

from typing import Any

from rewriter.capture import Captured, graph_from_concrete, import_step
from simulator.graph import Graph

__all__ = ["optimized_graph"]


def optimized_graph(captured: Captured, device: str = "CPU:0") -> Graph:
    """The IR of `captured` as Grappler optimizes it for `device` ('CPU:0' or 'GPU:0'), with the
    optimizer settings of this process (`tf.config.optimizer`), as TensorFlow does at run time."""
    from tensorflow.python.eager import context
    from tensorflow.python.grappler import tf_optimizer

    cf = captured.concrete_function
    config = context.context().config
    optimized = tf_optimizer.OptimizeGraph(config, _meta_graph(cf, device), verbose=False)
    retyped = _retype_for_import(optimized)
    graph = graph_from_concrete(_wrap(cf, captured.specs, optimized), captured.variables)
    if retyped:  # the IR says what runs: bfloat16 (oneDNN's pass treats it as it does float)
        for tensor in graph.tensors.values():
            if tensor.dtype == "float16":
                tensor.dtype = "bfloat16"
    return graph


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


def _meta_graph(cf: Any, device: str) -> Any:
    """A MetaGraphDef of the step's graph, placed on `device`, fetching its outputs and the
    ops it must run (variable updates), so that Grappler prunes nothing that runs."""
    import tensorflow as tf

    graph_def = cf.graph.as_graph_def()
    placed = f"/job:localhost/replica:0/task:0/device:{device}"
    for node in graph_def.node:
        node.device = node.device or placed
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=cf.graph)
    fetch = meta.collection_def["train_op"].node_list.value
    fetch.extend(t.name for t in cf.outputs)
    fetch.extend(op.name for op in cf.graph.control_outputs)
    return meta


def _wrap(cf: Any, specs: tuple[Any, ...], graph_def: Any) -> Any:
    """`graph_def` as a function of the step's arguments, with its variable handles mapped in."""
    import tensorflow as tf

    def body(*inputs: Any) -> Any:
        return import_step(cf, graph_def, inputs)[0]

    return tf.compat.v1.wrap_function(body, signature=list(specs))
