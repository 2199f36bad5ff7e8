from dataclasses import replace

import pytest

from simulator import compile_program
from simulator.derive import PlanParams
from simulator.engine import EDGE_REUSE, Engine
from simulator.graph import Graph, TensorKind
from simulator.order_edges import deferral_edges
from tests.simulator.builders import (
    add,
    held_gradient,
    momentum_step,
    training_branches,
    training_chain,
)


def test_serialize_evaluates_the_graph_with_order_edges_and_lowers_the_peak() -> None:
    g = training_branches()
    engine = Engine.build(g)
    plain = engine.evaluate(PlanParams(n_tensors=0))
    serial = engine.evaluate(PlanParams(n_tensors=0, serialize=True))
    assert plain.plan.order_edges == ()
    assert serial.plan.order_edges == engine.shared["edges"][engine.lower_bound] != ()
    # the two branches' 1 MiB gradients no longer live at once
    assert plain.result.memory.live_peak_bytes - serial.result.memory.live_peak_bytes >= 1 << 20
    first = engine.backward_level()
    assert first == engine.order.level["gradient_tape/j"]
    for before, after in serial.plan.order_edges:
        assert engine.order.level[after] >= first and engine.order.level[before] >= first
        assert g.predecessors(after)
    assert serial.params.serialize and serial.plan.params["serialize"] is True


def test_order_edges_are_shared_between_engines_of_near_sizes_only() -> None:
    shared: dict = {}
    one = Engine.build(training_branches(1 << 20), shared=shared)
    edges = one.evaluate(PlanParams(serialize=True)).plan.order_edges
    near = Engine.build(training_branches(5 << 18), shared=shared)
    assert near.lower_bound <= EDGE_REUSE * one.lower_bound
    assert near.evaluate(PlanParams(serialize=True)).plan.order_edges == edges
    assert list(shared["edges"]) == [one.lower_bound]  # found once
    far = Engine.build(training_branches(1 << 22), shared=shared)
    assert far.lower_bound > EDGE_REUSE * one.lower_bound
    far.evaluate(PlanParams(serialize=True))
    assert list(shared["edges"]) == [one.lower_bound, far.lower_bound]  # found again


def test_ordered_like_takes_another_sizes_edges_without_a_search() -> None:
    shared: dict = {}
    one = Engine.build(training_branches(1 << 20), shared=shared)
    far = Engine.build(training_branches(1 << 22), shared=shared)
    assert far.lower_bound > EDGE_REUSE * one.lower_bound
    ordered = far.ordered_like(one)
    assert ordered.edges == one.serialized().edges != ()
    assert list(shared["edges"]) == [one.lower_bound]  # no search at the far size
    plan = ordered.evaluate(PlanParams(serialize=True)).plan
    assert plan.order_edges == ordered.edges
    # a graph without their ops is searched for its own
    chain = Engine.build(training_chain(), shared=shared)
    assert chain.ordered_like(one) is chain.serialized() is chain


def test_without_parallel_branches_serialize_changes_nothing() -> None:
    engine = Engine.build(training_chain())
    plain = engine.evaluate(PlanParams())
    serial = engine.evaluate(PlanParams(serialize=True))
    assert serial.plan.order_edges == () and engine.serialized() is engine
    assert serial.peak_bytes == plain.peak_bytes and serial.plan.swaps == plain.plan.swaps


def test_a_recorded_order_is_never_serialized() -> None:
    g = training_branches()
    engine = Engine.build(g, order=Engine.build(g).order)
    assert engine.serialized() is engine
    assert engine.evaluate(PlanParams(serialize=True)).plan.order_edges == ()


def test_shared_edges_naming_ops_a_graph_lacks_are_found_again() -> None:
    engine = Engine.build(training_branches())
    engine.shared["edges"] = {engine.lower_bound: (("elsewhere", "gradient_tape/b1"),)}
    plan = engine.evaluate(PlanParams(serialize=True)).plan
    assert plan.order_edges and all(n in engine.graph.ops for e in plan.order_edges for n in e)
    assert engine.shared["edges"][engine.lower_bound] == plan.order_edges


def test_serialize_keeps_deferral_edges_that_lower_the_peak() -> None:
    engine = Engine.build(momentum_step())
    serial = engine.evaluate(PlanParams(n_tensors=0, serialize=True))
    assert ("grad", "decay") in serial.plan.order_edges
    assert serial.peak_bytes < engine.evaluate(PlanParams(n_tensors=0)).peak_bytes


def test_serialize_drops_deferral_edges_that_raise_the_peak() -> None:
    # `spike` reads only a variable and makes a large output nobody reads: run at the start
    # it holds it alone for a moment; deferred to its reader, next to `a` and `b`
    g = Graph("spike")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    w = add(g, "w", [], 256, type="VarHandleOp", kind=TensorKind.VARIABLE)
    spike = add(g, "spike", w, [1 << 16, 16])
    a = add(g, "a", x, 1 << 15)
    b = add(g, "b", a, 1 << 15)
    r = add(g, "r", spike[1:] + b, 16)
    g.mark_outputs(add(g, "out", a + r, 16))
    engine = Engine.build(g)
    assert deferral_edges(g, engine.order) == (("b", "spike"),)
    serial = engine.evaluate(PlanParams(n_tensors=0, serialize=True))
    assert serial.plan.order_edges == ()
    assert serial.peak_bytes == engine.evaluate(PlanParams(n_tensors=0)).peak_bytes


def test_the_limit_swaps_only_the_backward_tensors_live_where_the_plan_passes_it() -> None:
    engine = Engine.build(held_gradient())
    jit = PlanParams(ub=1, sync_out=True)
    without = engine.evaluate(jit)
    memory = without.result.memory
    live = memory.trace.live_by_step(len(engine.order.ops), memory.persistent_bytes)
    pos = engine.order.position
    held = int(live[pos["gradient_tape/gw"] : pos["sgd/update"] + 1].max())

    def swapped(limit: int) -> set[str]:
        p = replace(jit, backward_swaps=True, limit=limit)
        return {s.tensor for s in engine.evaluate(p).plan.swaps}

    forward = {s.tensor for s in without.plan.swaps}
    assert swapped(0) == swapped(held - 1) == forward | {"gradient_tape/gw:0"}
    assert swapped(held) == forward


def test_the_backward_pass_starts_at_its_first_reader_of_an_activation() -> None:
    g = training_chain()
    add(g, "gradient_tape/pad_spec", [], 64, type="Const")
    g.mark_outputs(add(g, "gradient_tape/stack", ["gradient_tape/pad_spec:0"], 64, type="Pack"))
    engine = Engine.build(g)
    assert engine.order.position["gradient_tape/stack"] < engine.order.position["f3"]
    assert engine.backward_start == engine.order.position["gradient_tape/b3"]


def test_the_time_bound_prices_a_recompute_by_the_ops_it_must_re_run() -> None:
    # the bias add and the activation overwrite the convolution's buffer in place: freeing
    # the activation to recompute it means running the convolution again
    from simulator import get_preset

    g = Graph("conv_bias_relu")
    mib = 1 << 20
    x = add(g, "x", [], mib, type="Placeholder", kind=TensorKind.INPUT)
    conv = add(g, "conv", x, mib, type="Conv2D")
    bias = add(g, "bias", conv, mib, type="BiasAdd", inplace=(0,))
    relu = add(g, "relu", bias, mib, type="Relu", inplace=(0,))
    big = add(g, "big", add(g, "l1", relu, 256), 4 * mib)  # the peak, after relu's reader
    loss = add(g, "loss", add(g, "l2", big, 256), 256)
    grad = add(g, "gradient_tape/grad", loss + relu, mib)
    g.mark_outputs(add(g, "gradient_tape/gx", grad + x, 256))
    preset = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1.0)
    cost = {n: 1e-3 for n in g.ops} | {"conv": 1.0}
    engine = Engine.build(g, device=preset, cost=cost)
    compute = sum(cost.values())
    heavy = PlanParams(n_tensors=0, recompute="cheap", recompute_ops=8, recompute_heavy=1e6)
    ev = engine.evaluate(heavy)
    assert [rc.tensor for rc in ev.plan.recomputes] == ["relu:0"]
    assert "conv" in ev.plan.recomputes[0].ops
    budget = ev.result.memory.live_peak_bytes
    bare = engine.evaluate(PlanParams(n_tensors=0)).result.memory.live_peak_bytes
    assert bare - budget >= mib
    bound = engine.time_bound(budget)
    assert bound is not None and ev.step_seconds is not None
    assert compute + 0.9 <= bound <= ev.step_seconds  # the relu alone would price it at 1 ms


def test_replicas_sharing_one_link_each_swap_at_their_share_of_it() -> None:
    from simulator import get_preset

    g = Graph("swap_one")
    mib = 1 << 20
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    act = add(g, "act", x, mib)
    big = add(g, "big", add(g, "f", act, 256), 4 * mib)  # the peak, while act waits
    loss = add(g, "loss", big, 256)
    g.mark_outputs(add(g, "gradient_tape/grad", loss + act, 256))
    alone = get_preset("v100-16gb-pcie3").with_overrides(link_bytes_per_s=mib)  # 1 s a swap
    shared = alone.sharing_link(4)
    assert shared.name == "v100-16gb-pcie3 (link shared by 4)"
    assert shared.d2h_bytes_per_s == alone.d2h_bytes_per_s / 4 == shared.h2d_bytes_per_s
    assert alone.sharing_link(1) is alone
    cost = {n: 1e-3 for n in g.ops}
    times = []
    for preset in (alone, shared):
        ev = Engine.build(g, device=preset, cost=cost).evaluate(PlanParams(sync_out=True))
        assert [s.tensor for s in ev.plan.swaps] == ["act:0"]
        times.append(ev.step_seconds)
    assert times[0] is not None and times[1] is not None
    # the step waits for the swap both ways: 1 s each alone, 4 s each on a quarter of the link
    assert abs(times[0] - 2) < 0.01 and abs(times[1] - 8) < 0.01


def test_an_engine_built_from_one_at_other_sizes_is_the_engine_built_alone() -> None:
    """`resized` takes over the levels and what follows data edges, which sizes do not move:
    the engine, its candidates and its plans are those of an engine built from nothing."""
    small = Engine.build(held_gradient())
    g = held_gradient()
    for t in g.tensors.values():
        if not t.kind.resident:
            t.nbytes *= 3
    alone, resized = Engine.build(g), Engine.build(g, resized=small)
    assert resized.order is small.order and resized.context.order is small.context.order
    assert resized.context.candidates == alone.context.candidates
    assert resized.lower_bound == alone.lower_bound > small.lower_bound
    assert resized.program == alone.program
    for params in (PlanParams(), PlanParams(n_tensors=-1, sync_out=True, backward_swaps=True)):
        a, r = alone.evaluate(params), resized.evaluate(params)
        assert a.plan == r.plan and a.result.peak_bytes == r.result.peak_bytes


@pytest.mark.parametrize("empty_at_first", ["", "output", "scratch"])
def test_a_program_lowered_from_one_at_other_sizes_is_the_program_lowered_alone(
    empty_at_first: str,
) -> None:
    """Only sizes are taken anew, scratch buffers included; where a tensor has bytes at one
    size and none at the other (what is walked differs) the graph is lowered in full."""

    def sized(k: int) -> Graph:
        g = held_gradient()
        for t in g.tensors.values():
            if not t.kind.resident:
                t.nbytes *= k
        g.ops["f2"].scratch = 1000 * k
        g.ops["f3"].scratch = 0 if empty_at_first == "scratch" and k == 1 else 500 * k
        if empty_at_first == "output" and k == 1:
            g.tensors[g.ops["f1"].outputs[0]].nbytes = 0
        return g

    small, g = Engine.build(sized(1)), sized(3)
    alone = compile_program(g, small.order)
    resized = compile_program(g, small.order, resized=small.program)
    assert resized == alone
    assert alone.alloc_bytes != small.program.alloc_bytes


def _loop_step(ahead: int) -> Graph:
    """training_chain whose f2 is a loop holding `ahead` bytes for iterations running ahead,
    on top of 1 KiB its one iteration needs."""
    g = training_chain()
    g.ops["f2"] = replace(
        g.ops["f2"], calls=("body",), repeats=10, scratch=1024 + ahead, ahead=ahead
    )
    return g


def test_serialize_runs_loops_one_iteration_at_a_time() -> None:
    ahead = 1 << 20
    engine = Engine.build(_loop_step(ahead))
    plain = engine.evaluate(PlanParams(n_tensors=0))
    serial = engine.evaluate(PlanParams(n_tensors=0, serialize=True))
    assert (plain.plan.serial_loops, serial.plan.serial_loops) == ((), ("f2",))
    assert plain.plan.changes_nothing and not serial.plan.changes_nothing
    unheld = Engine.build(_loop_step(0)).evaluate(PlanParams(n_tensors=0)).result.memory
    assert serial.result.memory.live_peak_bytes == unheld.live_peak_bytes
    assert plain.result.memory.peak_op == "f2"
    assert plain.result.memory.live_peak_bytes > unheld.live_peak_bytes + ahead - 4096
    # no plan keeps the iterations running ahead: the bound counts one iteration
    assert engine.lower_bound == Engine.build(_loop_step(0)).lower_bound
    assert engine.lower_bound < plain.result.memory.live_peak_bytes - ahead // 2
