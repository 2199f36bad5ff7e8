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
from simulator.order_edges import (
    deferral_edges,
    find_order_edges,
    held_input_edges,
)
from simulator.writes import write_edges
from tests.simulator.builders import (
    add,
    momentum_step,
    random_graphs,
    unrolled_recurrence,
    weight_decay_step,
)


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


def dropout_chain(layers: int = 3, depth: int = 4) -> Graph:
    """A forward chain of `layers` layers of `depth` ops, each layer with a dropout: its seed
    is read from a seed generator's state (then advanced, by a control edge to the next
    read), its 4 KiB random numbers are made from the seed and its 1 KiB mask from those;
    only the layer's select, with the layer's output, reads the mask. All but the layers and
    the selects are ready at the start."""
    g = Graph("dropout_chain")
    h = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    state = add(g, "state", [], 8, type="VarHandleOp", kind=TensorKind.VARIABLE)
    advanced: list[str] = []
    for i in range(layers):
        seed = add(g, f"seed{i}", state, 8, control=advanced)
        add(g, f"advance{i}", state + seed, [], control=[f"seed{i}"])
        advanced = [f"advance{i}"]
        mask = add(g, f"mask{i}", add(g, f"random{i}", seed, 4096), 1024)
        for k in range(depth):
            h = add(g, f"layer{i}_{k}", h, 1024)
        h = add(g, f"select{i}", mask + h, 1024)
    g.mark_outputs(h)
    return g


def test_what_is_made_from_variables_alone_waits_for_the_layer_that_reads_it() -> None:
    g = dropout_chain()
    result, order = live_peak(g)
    assert order.position["mask2"] < order.position["layer1_3"]  # made early, held meanwhile
    edges = deferral_edges(g, order)
    for op in ("random", "mask"):
        assert ("layer1_3", f"{op}1") in edges and ("layer2_3", f"{op}2") in edges
    lower, later = live_peak(g.with_control_edges(edges))
    for i in range(3):
        assert later.position[f"layer{i}_3"] < later.position[f"random{i}"]
    assert lower.peak_bytes < result.peak_bytes


def test_past_an_op_grappler_rewrote_the_wait_is_for_its_own_input() -> None:
    g = dropout_chain()
    g.rewritten = frozenset({"layer1_3"})  # gone from the step TensorFlow runs
    edges = deferral_edges(g, live_peak(g)[1])
    assert ("layer1_2", "random1") in edges
    assert not any("layer1_3" in e for e in edges)


def test_a_control_chain_of_early_ops_read_out_of_order_makes_no_cycle() -> None:
    # the layers read the seeds backwards: seed2 (read last) feeds the first layer, so the
    # first read's deadline is use0, which it reaches through the control chain to seed2
    g = Graph("reversed_seeds")
    h = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    state = add(g, "state", [], 8, type="VarHandleOp", kind=TensorKind.VARIABLE)
    seeds, advanced = [], []
    for i in range(3):
        seeds.append(add(g, f"seed{i}", state, 4096, control=advanced))
        add(g, f"advance{i}", state + seeds[-1], [], control=[f"seed{i}"])
        advanced = [f"advance{i}"]
    for i in range(3):
        h = add(g, f"use{i}", seeds[2 - i] + add(g, f"layer{i}", h, 1024), 1024)
    g.mark_outputs(h)
    edges = deferral_edges(g, live_peak(g)[1])
    # by data alone seed0 would wait for layer2, and seed2 (after it) would hold up use0
    assert edges == (("layer0", "seed0"),)
    categorized_order(g.with_control_edges(edges))  # raises GraphError on a cycle


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


def test_an_op_whose_inputs_are_held_anyway_waits_for_the_last_input_of_its_reader() -> None:
    g = unrolled_recurrence()
    result, order = live_peak(g)
    assert all(order.position[f"p{t}"] < order.position["h1"] for t in range(1, 4))  # early
    edges = held_input_edges(g, order)
    # each projection waits for the other product its sum reads (made from the last state),
    # and so does each x_t (made from the input alone, read by the loss too)
    assert {("q1", "p1"), ("q2", "p2"), ("q3", "p3"), ("q3", "x3")} <= set(edges)
    lower, later = live_peak(g.with_control_edges(edges))
    assert later.position["p3"] > later.position["h2"]
    assert lower.peak_bytes < result.peak_bytes


def test_an_op_whose_input_would_be_held_longer_is_not_deferred() -> None:
    g = Graph("short_input")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    m = add(g, "m", a, 1024)  # the last reader of a: run later, it would hold a longer
    b = add(g, "b", x, 1024)
    c = add(g, "c", b, 1024)
    g.mark_outputs(add(g, "r", m + c, 256))
    assert not any(e[1] == "m" for e in held_input_edges(g, live_peak(g)[1]))


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_held_input_edges_keep_the_graph_acyclic(g: Graph) -> None:
    edges = held_input_edges(g, live_peak(g)[1])
    categorized_order(g.with_control_edges(edges))  # raises GraphError on a cycle


def test_past_a_product_grappler_rewrote_its_read_of_the_variable_waits() -> None:
    g = weight_decay_step()
    g.rewritten = frozenset({"wd_mul"})  # (w * wd) * lr, regrouped: no edge may end there
    written = g.with_control_edges(write_edges(g, categorized_order(g)))
    order = categorized_order(written)
    # only where asked: in general an edge into what such an op reads is not made
    assert not any(after == "read2" for _, after in deferral_edges(written, order))
    edges = deferral_edges(written, order, past_rewritten=True)
    assert ("gradient_tape/grad_x", "read2") in edges
    assert not any("wd_mul" in e for e in edges)
    assert not any(after == "wd" for _, after in edges)  # a constant runs before the step
