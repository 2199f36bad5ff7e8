from simulator import Graph, TensorKind, executor_order, simulate
from simulator.onednn import onednn_graph
from simulator.opsemantics import inline_kernel
from tests.simulator.builders import add


def _conv_grads(readers: int = 0, order: tuple[str, ...] = ("fg", "bg", "ig")) -> Graph:
    """A gradient `g` read by a filter gradient, a bias gradient and an input gradient, by
    default in that order (as Grappler leaves most of a CNN's backward pass), and by `readers`
    more ops."""
    g = Graph()
    add(g, "sizes", [], 16, type="Const")
    add(g, "x", [], 64, type="Placeholder", kind=TensorKind.INPUT)
    add(g, "g", ["x:0"], 256)
    ops = {
        "fg": (["x:0", "sizes:0", "g:0"], 32, "Conv2DBackpropFilter"),
        "bg": (["g:0"], 8, "BiasAddGrad"),
        "ig": (["g:0"], 64, "Conv2DBackpropInput"),
    }
    for name in order:
        inputs, nbytes, kind = ops[name]
        add(g, name, inputs, nbytes, type=kind)
    for k in range(readers):
        add(g, f"r{k}", ["g:0"], 4)
    add(g, "update_f", ["fg:0"], 32)
    add(g, "update_b", ["bg:0"], 8)
    g.mark_outputs(["update_f:0", "update_b:0", "ig:0"])
    return g


def _executor(g: Graph) -> tuple[str, ...]:
    return executor_order(g, lambda name: inline_kernel(g.ops[name].type)).ops


def test_the_merge_edits_out_edges_as_tensorflows_edge_array_does() -> None:
    g = onednn_graph(_conv_grads())
    g.lint()
    assert "bg" not in g.ops and g.ops["fg"].outputs == ["fg:0", "bg:0"]
    # (fg, bg, ig) + merged; bg's slot takes the merged op, fg's slot the input gradient
    assert g.successors("g") == ["ig", "fg"]
    assert g.successors("x") == ["g", "fg"]
    assert g.successors("fg") == ["update_b", "update_f"]  # the bias gradient's edges first


def test_an_erased_edge_takes_the_last_edge_of_the_array() -> None:
    # (bg, ig, fg) + merged: bg's slot takes the merged op, fg was last and just goes
    g = onednn_graph(_conv_grads(order=("bg", "ig", "fg")))
    assert g.successors("g") == ["fg", "ig"]


def test_with_onednn_the_executor_runs_the_filter_gradient_first() -> None:
    plain, merged = _executor(_conv_grads()), _executor(onednn_graph(_conv_grads()))
    assert plain.index("ig") < plain.index("fg")  # TensorFlow's kernels: filter deferred
    assert merged.index("fg") < merged.index("update_b") < merged.index("ig")


def test_a_hash_set_of_edges_keeps_its_order_when_edited() -> None:
    g = onednn_graph(_conv_grads(readers=7))  # ten out-edges: no longer an array
    assert g.successors("g") == ["ig", *(f"r{k}" for k in range(7)), "fg"]


def test_a_max_pooling_hands_its_gradient_a_byte_per_pooled_element() -> None:
    g = Graph()
    add(g, "x", [], 4096, type="Placeholder", kind=TensorKind.INPUT)
    add(g, "pool", ["x:0"], 1024, type="MaxPool")
    add(g, "loss", ["pool:0"], 1024)
    add(g, "grad", ["x:0", "pool:0", "loss:0"], 4096, type="MaxPoolGrad")
    g.ops["grad"].scratch = 1024
    g.mark_outputs(["grad:0"])
    out = onednn_graph(g)
    out.lint()
    assert out.tensors["pool:workspace"].nbytes == 256
    assert out.ops["grad"].scratch == 0
    # the workspace is live from the pooling to its gradient, in place of the gradient's scratch
    assert simulate(out).peak_bytes == simulate(g).peak_bytes - 1024 + 256
