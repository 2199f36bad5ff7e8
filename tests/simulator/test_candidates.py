"""The candidate rule: buffers the backward pass reads, directly or through aliases, and the
backward pass told from the forward one by what the gradients and the loss need."""

from __future__ import annotations

from simulator import Graph, TensorKind
from simulator.derive import PlanContext, PlanParams, backward_ops, gradient_flow
from simulator.engine import Engine
from simulator.order import categorized_order
from simulator.order_edges import feeder_edges
from tests.simulator.builders import add

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
