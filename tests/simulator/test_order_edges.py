from hypothesis import given, settings

from simulator import (
    Graph,
    GraphError,
    Order,
    SimResult,
    TensorKind,
    categorized_order,
    compile_program,
    simulate_memory,
)
from simulator.order_edges import deferral_edges, find_order_edges
from tests.simulator.builders import add, momentum_step, random_graphs


def live_peak(g: Graph) -> tuple[SimResult, Order]:
    order = categorized_order(g)
    return simulate_memory(compile_program(g, order)), order


def two_branches() -> Graph:
    """f forks into branches a and b, each holding two 4 KiB tensors, joined by j."""
    g = Graph("two_branches")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    f = add(g, "f", x, 1024)
    outs = []
    for br in "ab":
        one = add(g, f"{br}1", f, 4096)
        two = add(g, f"{br}2", one, 4096)
        outs += add(g, f"{br}3", one + two, 256)
    g.mark_outputs(add(g, "j", outs, 256))
    return g


def test_with_control_edges_copies_and_leaves_the_original_alone() -> None:
    g = two_branches()
    h = g.with_control_edges((("a3", "b1"),))
    assert h.predecessors("b1") == ["f", "a3"]
    assert "b1" in h.successors("a3")
    assert g.predecessors("b1") == ["f"] and "b1" not in g.successors("a3")
    assert h.tensors is g.tensors


def test_with_control_edges_rejects_unknown_ops_and_ordering_finds_cycles() -> None:
    g = two_branches()
    try:
        g.with_control_edges((("a3", "nope"),))
    except GraphError as err:
        assert "nope" in str(err)
    else:
        raise AssertionError("an unknown op was accepted")
    cyclic = g.with_control_edges((("a3", "a1"),))
    try:
        categorized_order(cyclic)
    except GraphError as err:
        assert "cycle" in str(err)
    else:
        raise AssertionError("a cycle was ordered")


def test_interleaved_branches_are_serialized() -> None:
    g = two_branches()
    before, _ = live_peak(g)
    # level by level both branches hold their two 4 KiB tensors when a3 runs:
    # x 256 + a1, a2, b1, b2 (16384) + a3's output 256
    assert before.peak_bytes == 256 + 4 * 4096 + 256
    edges = find_order_edges(g, live_peak)
    assert edges in ((("a3", "b1"),), (("b3", "a1"),))
    after, _ = live_peak(g.with_control_edges(edges))
    # one branch at a time; the peak is the first one's last op: x, f (kept for the later
    # branch), the branch's two 4 KiB tensors and its output
    assert after.peak_bytes == 256 + 1024 + 2 * 4096 + 256
    assert after.peak_bytes < before.peak_bytes


def early_term() -> Graph:
    """A sum s of a term t made early from g (held for levels) and of w, which combines two
    4 KiB tensors made late; g is a step output, so it lives on anyway."""
    g = Graph("early_term")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    grad = add(g, "g", x, 4096)
    t = add(g, "t", grad, 4096)
    r = add(g, "r1", grad, 64)
    for i in (2, 3):
        r = add(g, f"r{i}", r, 64)
    w = add(g, "w", add(g, "t2", r, 4096) + add(g, "u", grad + r, 4096), 4096)
    g.mark_outputs(grad + add(g, "s", t + w, 256))
    return g


def test_a_term_made_early_is_sunk_to_where_its_sum_needs_it() -> None:
    g = early_term()
    before, _ = live_peak(g)
    # when w runs: x, g, t (made at level 2), t2, u and w
    assert before.peak_bytes == 256 + 5 * 4096
    edges = find_order_edges(g, live_peak)
    assert edges == (("w", "t"),)
    after, order = live_peak(g.with_control_edges(edges))
    assert order.level["t"] == order.level["w"] + 1
    assert after.peak_bytes == 256 + 4 * 4096  # t is made after t2 and u are freed


def test_ops_run_as_one_kernel_are_held_back_together() -> None:
    g = early_term()
    add(g, "t_twin", ["g:0"], 64)
    edges = find_order_edges(
        g, live_peak, together={"t": ("t", "t_twin"), "t_twin": ("t", "t_twin")}
    )
    assert edges == (("w", "t"), ("w", "t_twin"))
    # an edge that would close a cycle through the group is skipped, not raised
    cyclic = {"t": ("t", "r1"), "r1": ("t", "r1")}
    assert find_order_edges(g, live_peak, together=cyclic) == ()


def test_ops_before_the_start_level_are_never_delayed() -> None:
    g = two_branches()
    order = categorized_order(g)
    assert find_order_edges(g, live_peak, start_level=order.level["j"]) == ()


def test_a_chain_has_nothing_to_serialize() -> None:
    g = Graph("chain")
    prev = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    for i in range(4):
        prev = add(g, f"op{i}", prev, 4096)
    g.mark_outputs(prev)
    assert find_order_edges(g, live_peak) == ()


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_order_edges_keep_the_graph_acyclic_and_only_lower_the_peak(g: Graph) -> None:
    edges = find_order_edges(g, live_peak)
    peak = live_peak(g)[0].peak_bytes
    for k in range(1, len(edges) + 1):
        lower = live_peak(g.with_control_edges(edges[:k]))[0].peak_bytes  # orders: no cycle
        assert lower < peak
        peak = lower


def test_an_op_made_from_held_buffers_waits_for_its_readers_other_input() -> None:
    g = momentum_step()
    result, order = live_peak(g)
    assert order.position["decay"] < order.position["a"]  # made at the start, held meanwhile
    edges = deferral_edges(g, order)
    assert edges == (("grad", "decay"),)
    lower, later = live_peak(g.with_control_edges(edges))
    assert later.position["decay"] > later.position["grad"]
    assert result.peak_bytes - lower.peak_bytes == 4096


def test_an_op_is_deferred_only_up_to_its_first_reader() -> None:
    g = Graph("two_readers")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    w = add(g, "w", [], 256, type="VarHandleOp", kind=TensorKind.VARIABLE)
    m = add(g, "m", w, 1024)
    a = add(g, "a", x, 1024)
    b = add(g, "b", a, 1024)
    g.mark_outputs(add(g, "r1", m + a, 256) + add(g, "r2", m + b, 256))
    assert deferral_edges(g, live_peak(g)[1]) == (("a", "m"),)  # not past r1, to b


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_deferral_edges_keep_the_graph_acyclic(g: Graph) -> None:
    edges = deferral_edges(g, live_peak(g)[1])
    categorized_order(g.with_control_edges(edges))  # raises GraphError on a cycle
