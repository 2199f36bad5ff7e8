"""The candidate rule: buffers the backward pass reads, directly or through aliases, and the
backward pass told from the forward one by what the gradients and the loss need."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Graph, TensorKind
from simulator.derive import PlanContext, PlanParams, backward_ops, gradient_flow
from simulator.engine import Engine
from simulator.order import categorized_order
from simulator.order_edges import feeder_edges
from tests.simulator.builders import add
from tests.simulator.test_swap_properties import training_graphs

NO_SWAP = PlanParams(n_tensors=0)
LEAST = PlanParams(ub=1, sync_out=True)


def read_through_reshape() -> Graph:
    """A convolution's output the backward pass reads only through a reshape of it (as a
    group normalization's backward reads its input)."""
    g = Graph("reshaped")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    conv = add(g, "conv", x, 8192)
    r = add(g, "reshape", conv, 8192, type="Reshape", forwards={0: 0})
    f2 = add(g, "f2", r, 1024)
    f3 = add(g, "f3", f2, 16384)  # the peak, where the convolution's output is held
    loss = add(g, "loss", f3, 4)
    g3 = add(g, "gradient_tape/f3", loss + f2, 1024)
    g2 = add(g, "gradient_tape/f2", g3 + r, 1024)
    g.mark_outputs(loss + g2)
    return g


def test_an_alias_read_by_the_backward_pass_is_a_candidate() -> None:
    ctx = PlanContext.build(read_through_reshape())
    assert "reshape:0" in {c.tensor for c in ctx.candidates}


def test_swapping_the_alias_frees_the_buffer_it_names() -> None:
    engine = Engine.build(read_through_reshape())
    kept = engine.evaluate(NO_SWAP)
    swapped = engine.evaluate(LEAST)
    assert "reshape:0" in {s.tensor for s in swapped.plan.swaps}
    assert kept.peak_bytes - swapped.peak_bytes >= 8192


def test_an_alias_of_a_variable_is_never_a_candidate() -> None:
    g = Graph("variable")
    v = add(g, "v", [], 4096, type="VarHandleOp", kind=TensorKind.VARIABLE)
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    read = add(g, "read", v, 4096, type="Identity", forwards={0: 0})
    f = add(g, "f", x + read, 1024)
    loss = add(g, "loss", f, 4)
    grad = add(g, "gradient_tape/f", loss + read, 4096)
    g.mark_outputs(loss + grad)
    assert "read:0" not in {c.tensor for c in PlanContext.build(g).candidates}


def custom_gradient() -> Graph:
    """A custom gradient (swish's): `sig` and `term` remake from the forward tensor `act`,
    outside the tape's name scope, the factor the incoming gradient is multiplied by."""
    g = Graph("custom_gradient")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    act = add(g, "act", x, 8192)
    f2 = add(g, "f2", act, 8192)
    f3 = add(g, "f3", f2, 16384)  # the peak, where `term` would be held
    loss = add(g, "loss", f3, 4)
    g3 = add(g, "gradient_tape/f3", loss + f2, 8192)
    sig = add(g, "sig", act, 8192, type="Sigmoid")
    term = add(g, "term", sig + act, 8192, type="Mul")
    g2 = add(g, "gradient_tape/f2", g3 + term, 8192)
    g.mark_outputs(loss + g2)
    return g


def test_a_custom_gradients_ops_are_backward_ops_outside_the_gradient_flow() -> None:
    g = custom_gradient()
    flow = gradient_flow(g)
    backward = backward_ops(g, categorized_order(g), flow)
    assert {"sig", "term"} <= backward - flow
    assert not {"act", "f2", "f3", "loss"} & backward
    assert "act:0" in {c.tensor for c in PlanContext.build(g).candidates}


def test_without_a_result_outside_the_flow_nothing_is_taken_for_a_feeder() -> None:
    g = custom_gradient()
    g.outputs = [t for t in g.outputs if t != "loss:0"]
    flow = gradient_flow(g)
    assert backward_ops(g, categorized_order(g), flow) == flow


def test_feeders_wait_for_the_gradient_they_serve_and_lower_the_peak() -> None:
    g = custom_gradient()
    order = categorized_order(g)
    ctx = PlanContext.build(g, order)
    edges = feeder_edges(g, order, ctx.backward - ctx.flow)
    assert set(edges) == {("gradient_tape/f3", "sig"), ("gradient_tape/f3", "term")}
    engine = Engine.build(g)
    plain = engine.evaluate(LEAST)
    deferred = engine.evaluate(PlanParams(ub=1, sync_out=True, serialize=True))
    assert deferred.peak_bytes < plain.peak_bytes


def residual_sum() -> Graph:
    """A batch norm's output `bn = hs + b` added to the shortcut `h`, `bn` read by the sum
    alone: Grappler's arithmetic optimizer sums the two adds as one group (the capture
    records them as rewritten)."""
    g = Graph("residual_sum")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    h = add(g, "h", x, 4096)
    conv = add(g, "conv", h, 4096)
    hs = add(g, "hs", conv, 4096, type="Mul")
    bn = add(g, "bn", hs, 4096, type="AddV2")
    out = add(g, "sum", bn + h, 4096, type="AddV2")
    f = add(g, "f", out, 1024)
    loss = add(g, "loss", f, 4)
    g1 = add(g, "gradient_tape/f", loss + out, 4096)
    g2 = add(g, "gradient_tape/conv", g1 + conv, 4096)
    g3 = add(g, "gradient_tape/h", g2 + h, 4096)
    g.mark_outputs(loss + g3)
    g.rewritten = frozenset({"bn", "sum"})
    return g


def test_a_rewritten_sum_is_never_a_trigger_or_a_waiter() -> None:
    g = residual_sum()
    ctx = PlanContext.build(g)
    assert ctx.regrouped == {"bn", "sum"}
    assert not ctx.regrouped & {o for ops in ctx.by_level for o in ops}
    for lag in (0, 1, 2, 3):
        plan = Engine.build(g).evaluate(PlanParams(ub=1, sync_out=True, sync_lag=lag)).plan
        assert plan.swaps and all(s.waiter not in ctx.regrouped for s in plan.swaps)


def test_a_swap_read_by_a_rewritten_op_is_waited_for_after_its_last_forward_reader() -> None:
    g = residual_sum()
    ctx = PlanContext.build(g)
    plan = Engine.build(g).evaluate(PlanParams(ub=1, sync_out=True)).plan
    by_tensor = {s.tensor: s for s in plan.swaps}
    assert by_tensor["conv:0"].waiter == ""  # its forward reader `hs` may wait
    waiter = by_tensor["h:0"].waiter  # `sum` may not
    assert waiter and ctx.order.level[waiter] > ctx.order.level["sum"]


def test_levels_of_rewritten_ops_alone_do_not_count_toward_the_trigger_distance() -> None:
    # a's reader follows two adds that Grappler sums as one group: with ub=1 the swap-in
    # waits for the op before them instead of being dropped
    g = Graph("regrouped_levels")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 8192)
    f = add(g, "f", a, 1024)
    big = add(g, "big", f, 16384)
    loss = add(g, "loss", big, 4)
    gl = add(g, "gradient_tape/loss", loss, 1024)
    s1 = add(g, "gradient_tape/s1", gl + gl, 1024, type="AddV2")
    s2 = add(g, "gradient_tape/s2", s1 + gl, 1024, type="AddV2")
    r = add(g, "gradient_tape/a", s2 + a, 1024)
    g.mark_outputs(loss + r)
    g.rewritten = frozenset({"gradient_tape/s1", "gradient_tape/s2"})
    ctx = PlanContext.build(g)
    level = ctx.order.level
    assert ctx.hidden == {level["gradient_tape/s1"], level["gradient_tape/s2"]}
    plan = Engine.build(g).evaluate(PlanParams(ub=1, sync_out=True)).plan
    swap = next(s for s in plan.swaps if s.tensor == "a:0")
    assert [s.trigger for s in swap.swap_ins] == ["gradient_tape/loss"]


@settings(max_examples=80, deadline=None)
@given(training_graphs(), st.data())
def test_a_context_built_like_another_equals_one_built_from_scratch(
    g: Graph, data: st.DataObject
) -> None:
    """With order edges added (control edges, forward in the order), a context built like
    the graph's own (`like=`: its flow, backward pass and folded ops taken over) is the one
    built from scratch."""
    base = PlanContext.build(g)
    ops = list(base.order.ops)
    pairs = data.draw(
        st.lists(st.tuples(st.integers(0, len(ops) - 1), st.integers(0, len(ops) - 1)), max_size=4)
    )
    edges = tuple((ops[min(i, j)], ops[max(i, j)]) for i, j in pairs if i != j)
    edged = g.with_control_edges(edges)
    fresh, like = PlanContext.build(edged), PlanContext.build(edged, like=base)
    assert (like.flow, like.backward, like.unswappable) == (
        fresh.flow,
        fresh.backward,
        fresh.unswappable,
    )
    assert like.candidates == fresh.candidates and like.order == fresh.order
    assert like.by_level == fresh.by_level and like.last_read == fresh.last_read
