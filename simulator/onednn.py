"""The step as TensorFlow's oneDNN graph pass hands it to the executor.

With oneDNN, `MklLayoutRewritePass` runs after Grappler. Besides renaming kernels (re-creating
each op, see below), it merges each floating `Conv2DBackpropFilter(x, sizes, g)` with the
`BiasAddGrad(g)` of the same gradient into one kernel named after the filter gradient, whose
outputs are the filter and the bias gradients. The merge re-adds edges, and that changes the
order in which the pass sees the successors of the op that made `g`:

- the merged op's input edges are appended to the out-edges of its inputs' producers;
- its out-edges are those of the bias gradient, then those of the filter gradient;
- the bias gradient is removed, then the filter gradient.

An out-edge set of up to eight edges is an array (`tensorflow/core/graph/edgeset.h`): an edge
is appended, and an erased edge's slot takes the last edge. So a gradient read in the order
(filter, bias, input gradient) is read as (input gradient, merged) afterwards. Larger sets are
hash sets, whose order is not known before the step runs; an erased edge then just leaves.
These edits order the depth-first search in which the pass then re-creates every op it gives
a oneDNN kernel (`REWRITTEN_TYPES`); the executor sees the ops, and their out-edges, in the
order of that re-creation (`simulator.executor_orders` draws it, as it differs between
processes).

The pass also gives each max pooling whose gradient reads its output a second output, a
workspace of one byte per pooled element, which the gradient reads instead of recomputing the
pooling: the allocator records it as the pooling's output, alive until the gradient has run.
"""

from __future__ import annotations

from simulator import Graph

__all__ = ["REWRITTEN_TYPES", "onednn_graph"]

#: Op types the pass re-creates as oneDNN kernels (`_MklNative...`, `_Mkl...`), as read from
#: the graphs TensorFlow 2.21 ran for the zoo's steps (run metadata's partition graphs). The
#: pass makes them in the order of a depth-first search that differs between processes, and
#: the executor's order follows (see `simulator.executor_orders`).
REWRITTEN_TYPES = frozenset(
    {
        "Conv2D",
        "Conv3D",
        "_FusedConv2D",
        "_FusedConv3D",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "Conv3DBackpropFilterV2",
        "Conv3DBackpropInputV2",
        "MatMul",
        "_FusedMatMul",
        "BatchMatMulV2",
        "Einsum",
        "Softmax",
        "MaxPool",
        "MaxPoolGrad",
        "MaxPool3D",
        "MaxPool3DGrad",
    }
)

#: edges an out-edge set holds in its array (64 bytes of pointers) before it becomes a hash set
_INLINE_EDGES = 8
#: max pooling gradients the pass rewrites, and the pooling whose workspace each reads
_POOL_GRADS = {"MaxPoolGrad": "MaxPool", "MaxPool3DGrad": "MaxPool3D"}
#: the floating types whose convolution gradients and poolings the pass rewrites (read from
#: the partition graphs TensorFlow 2.21 ran for tiny-cnn under each Keras precision policy)
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def onednn_graph(graph: Graph) -> Graph:
    """`graph` (as Grappler left it) as TensorFlow's oneDNN pass leaves it: every filter and
    bias gradient pair merged, the out-edges it edits in their new order, and each max pooling
    handing its gradient a workspace."""
    for bias, fltr in _merge_pairs(graph):
        graph = _merge(graph, fltr, bias)
    for pool, grad in _pool_pairs(graph):
        out = graph.tensors[graph.ops[pool].outputs[0]]
        graph = graph.with_workspace(pool, grad, out.nbytes // _ITEMSIZE[out.dtype])
        graph = graph.with_scratch(grad, 0)
    return graph


def _pool_pairs(graph: Graph) -> list[tuple[str, str]]:
    """(max pooling, its gradient) pairs whose gradient reads the pooled output directly: the
    pass then gives the pooling a second output, one byte per pooled element (the window
    position of each maximum, recorded by the allocator as an output), which the gradient
    reads instead of recomputing the pooling."""
    pairs = []
    for name, op in graph.ops.items():
        if op.type not in _POOL_GRADS or len(op.inputs) < 2:
            continue
        pooled = graph.tensors[op.inputs[1]]
        pool = graph.ops[pooled.producer]
        first = pool.outputs[:1] == [pooled.name]
        if pool.type == _POOL_GRADS[op.type] and first and pooled.dtype in _ITEMSIZE:
            pairs.append((pool.name, name))
    return pairs


def _merge_pairs(graph: Graph) -> list[tuple[str, str]]:
    """(BiasAddGrad, Conv2DBackpropFilter) pairs reading the same floating gradient on the
    same device: for each bias gradient, the first filter gradient that reads the
    gradient as its third input."""
    pairs: list[tuple[str, str]] = []
    taken: set[str] = set()
    for name, op in graph.ops.items():
        if op.type != "BiasAddGrad" or not op.inputs:
            continue
        grad = graph.tensors[op.inputs[0]]
        if grad.dtype not in _ITEMSIZE:
            continue
        for reader in grad.consumers:
            other = graph.ops[reader]
            fits = other.type == "Conv2DBackpropFilter" and other.inputs[2:3] == [grad.name]
            fits &= not graph.control_consumers.get(name)  # (in a pinned order: left apart)
            if fits and other.device == op.device and reader not in taken:
                pairs.append((name, reader))
                taken.add(reader)
                break
    return pairs


def _merge(graph: Graph, fltr: str, bias: str) -> Graph:
    """`graph` with `bias` folded into `fltr`, the out-edges of their producers edited as the
    pass edits them."""
    new = f"{fltr} (merged)"
    producers = list(dict.fromkeys(graph.tensors[t].producer for t in graph.ops[fltr].inputs))
    orders = {p: [*graph.successors(p), new] for p in producers}
    for p, edges in orders.items():
        array = len(edges) <= _INLINE_EDGES  # once a hash set, always one
        for gone in (bias, fltr):
            if gone in edges:
                _erase(edges, gone, array)
        orders[p] = [fltr if s == new else s for s in edges]
    orders[fltr] = list(dict.fromkeys(graph.successors(bias) + graph.successors(fltr)))
    return graph.merged(fltr, bias).with_edge_order(orders)


def _erase(edges: list[str], gone: str, array: bool) -> None:
    """Remove `gone` as TensorFlow's edge set does: in an array, the last edge takes its slot."""
    i = edges.index(gone)
    if array:
        edges[i] = edges[-1]
        edges.pop()
    else:
        del edges[i]
