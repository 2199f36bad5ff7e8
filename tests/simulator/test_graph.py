import pytest

from simulator import Graph, GraphError, Op, Tensor, TensorKind
from tests.simulator.builders import add, diamond


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
