from dataclasses import replace

import pytest

from simulator import Graph, GraphError, Op, Tensor, TensorKind
from tests.simulator.builders import add, chain, diamond


def test_add_op_links_producers_and_consumers() -> None:
    g = diamond()
    assert g.tensors["a:0"].consumers == ["b", "c"]
    assert g.tensors["d:0"].producer == "d"
    assert g.predecessors("d") == ["b", "c"]
    assert g.successors("a") == ["b", "c"]
    g.lint()


def test_unknown_input_is_rejected() -> None:
    g = Graph()
    with pytest.raises(GraphError, match="unknown tensor 'nope:0'"):
        add(g, "a", ["nope:0"], 4)


def test_duplicate_op_is_rejected() -> None:
    g = Graph()
    add(g, "a", [], 4)
    with pytest.raises(GraphError, match="duplicate op"):
        g.add_op(Op("a", "Op", [], ["a:1"]), [Tensor("a:1", "float32", (1,), 4, "a")])


def test_lint_catches_a_broken_back_link() -> None:
    g = diamond()
    g.tensors["a:0"].consumers.remove("c")
    with pytest.raises(GraphError, match="does not list consumer 'c'"):
        g.lint()


def test_persistent_bytes_counts_resident_kinds_only() -> None:
    g = Graph()
    add(g, "x", [], 100, type="Placeholder", kind=TensorKind.INPUT)
    add(g, "w", [], 40, type="Placeholder", kind=TensorKind.VARIABLE)
    add(g, "k", [], 8, type="Const", kind=TensorKind.CONSTANT)
    add(g, "t", ["x:0"], 1000)
    assert g.persistent_bytes == 148
    assert g.bytes_by_kind()["transient"] == 1000


def test_on_cpu_gives_ops_their_cpu_kernels_scratch_and_leaves_the_graph_alone() -> None:
    from dataclasses import replace

    from simulator import compile_program, simulate_memory

    g = diamond()
    assert g.on_cpu() is g  # no op has a CPU-specific scratch
    g.ops["b"] = replace(g.ops["b"], scratch=100, cpu_scratch=4096)
    g.ops["c"] = replace(g.ops["c"], scratch=64, cpu_scratch=64)
    cpu = g.on_cpu()
    assert cpu.ops["b"].scratch == 4096 and cpu.ops["c"] is g.ops["c"]
    assert g.ops["b"].scratch == 100 and cpu.tensors is g.tensors
    assert cpu.predecessors("d") == g.predecessors("d")
    peak = simulate_memory(compile_program(g)).peak_bytes
    assert simulate_memory(compile_program(cpu)).peak_bytes > peak


def _grad_block() -> Graph:
    """x -> p; p's gradient g is read by a filter gradient f (x, sizes, g), a bias gradient b
    and an input gradient i; u and v read f's and b's outputs."""
    g = Graph()
    add(g, "x", [], 64, type="Placeholder", kind=TensorKind.INPUT)
    add(g, "sizes", [], 16, type="Const")
    add(g, "p", ["x:0"], 256)
    add(g, "f", ["x:0", "sizes:0", "p:0"], 32, type="Conv2DBackpropFilter")
    add(g, "b", ["p:0"], 8, type="BiasAddGrad")
    add(g, "i", ["p:0"], 64, type="Conv2DBackpropInput")
    add(g, "u", ["f:0"], 32)
    add(g, "v", ["b:0"], 8)
    g.mark_outputs(["u:0", "v:0", "i:0"])
    return g


def test_merged_folds_one_op_into_another() -> None:
    g = _grad_block()
    m = g.merged("f", "b")
    m.lint()
    assert "b" not in m.ops and "b" in g.ops  # the original is left alone
    assert m.ops["f"].outputs == ["f:0", "b:0"]
    assert m.tensors["b:0"].producer == "f" and g.tensors["b:0"].producer == "b"
    assert m.tensors["p:0"].consumers == ["f", "i"]
    assert m.successors("f") == ["u", "v"]
    assert m.predecessors("v") == ["f"]


def test_merged_lists_the_merged_op_once_in_an_edge_order() -> None:
    g = _grad_block().with_edge_order({"p": ["i", "b", "f"]}).merged("f", "b")
    assert g.successors("p") == ["i", "f"]


def test_merged_refuses_an_op_reading_other_tensors() -> None:
    with pytest.raises(GraphError, match="reads tensors"):
        _grad_block().merged("b", "f")


def test_edge_order_sets_the_order_successors_are_seen_in() -> None:
    g = _grad_block()
    h = g.with_edge_order({"p": ["i", "b", "f"]})
    assert h.successors("p") == ["i", "b", "f"] and g.successors("p") == ["f", "b", "i"]
    with pytest.raises(GraphError, match="does not list"):
        g.with_edge_order({"p": ["i", "f"]})


def test_a_control_edge_added_after_an_edge_order_is_a_successor_too() -> None:
    from simulator.order import categorized_order

    g = _grad_block().with_edge_order({"p": ["i", "b", "f"]}).with_control_edges((("p", "v"),))
    assert g.successors("p") == ["i", "b", "f", "v"]
    assert g.predecessors("v") == ["b", "p"]
    assert categorized_order(g).position["v"] > categorized_order(g).position["p"]


def test_workspace_is_a_tensor_from_one_op_to_another() -> None:
    g = _grad_block().with_workspace("p", "i", 100)
    g.lint()
    assert g.tensors["p:workspace"].nbytes == 100
    assert g.ops["p"].outputs[-1] == "p:workspace" and g.ops["i"].inputs[-1] == "p:workspace"
    assert g.with_scratch("i", 7).ops["i"].scratch == 7


def test_the_fingerprint_follows_the_structure_not_the_sizes() -> None:
    from tests.simulator.builders import chain, training_chain

    assert chain(4).fingerprint() == chain(4, nbytes=4096).fingerprint()
    assert chain(4).fingerprint() != chain(5).fingerprint()
    assert chain(4).fingerprint() != diamond().fingerprint()
    edged = training_chain().with_control_edges((("f3", "gradient_tape/b3"),))
    assert edged.fingerprint() != training_chain().fingerprint()


def test_a_subgraph_receives_what_ops_left_out_make() -> None:
    # two replicas: each computes on its own input, replica 0 also reduces replica 1's loss
    g = Graph()
    for r in ("r0", "r1"):
        add(g, f"{r}/x", [], 400, kind=TensorKind.INPUT)
        add(g, f"{r}/h", [f"{r}/x:0"], 800)
        add(g, f"{r}/loss", [f"{r}/h:0"], 4, control=[f"{r}/x"])
    add(g, "mean", ["r0/loss:0", "r1/loss:0"], 4, control=["r1/h"])
    g.mark_outputs(["mean:0", "r1/loss:0"])
    one = g.subgraph({"r0/x", "r0/h", "r0/loss", "mean"})
    one.lint()
    assert list(one.ops) == ["r0/x", "r0/h", "r0/loss", "r1/loss", "mean"]
    assert one.ops["r1/loss"].type == "_Recv" and one.ops["r1/loss"].inputs == []
    assert one.ops["mean"].control_inputs == []  # its wait on r1/h is the other device's
    assert one.tensors["r1/loss:0"].consumers == ["mean"]
    assert one.outputs == ["mean:0"]
    assert g.tensors["r0/h:0"].consumers == ["r0/loss"]  # the whole graph is left as it was
    other = g.subgraph({"r1/x", "r1/h", "r1/loss"})
    assert list(other.ops) == ["r1/x", "r1/h", "r1/loss"] and other.outputs == ["r1/loss:0"]
    assert other.persistent_bytes == 400


def test_serial_loops_hold_only_one_iteration() -> None:
    g = chain(2)
    g.ops["op1"] = replace(g.ops["op1"], calls=("body",), repeats=4, scratch=5000, ahead=3000)
    assert g.parallel_loops == ("op1",)
    serial = g.with_serial_loops(g.parallel_loops)
    assert (serial.ops["op1"].scratch, serial.ops["op1"].ahead) == (2000, 0)
    assert g.ops["op1"].scratch == 5000 and serial.parallel_loops == ()
    with pytest.raises(GraphError, match="'op2' is not a loop"):
        g.with_serial_loops(("op2",))
