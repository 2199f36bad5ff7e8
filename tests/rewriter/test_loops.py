"""Loops: trip counts, the bytes their lists hold, and the iterations running ahead."""

from __future__ import annotations

import time
from typing import Any

import pytest
import tensorflow as tf

from autotune.api import _resolved_schedule
from rewriter.capture import CaptureError, capture_function
from rewriter.loops import Loop
from simulator.errors import UserError
from simulator.opsemantics import LOOP_TYPES

BATCH, WIDTH = 8, 16


def _step(trips: int | None, batch: int = BATCH, width: int = WIDTH) -> tuple[Any, Any]:
    """A training step with a recurrence h = tanh(h @ w + x) in a tf.while_loop, run `trips`
    times, or (None) until its state's sum is large: a bound that depends on the data."""
    w = tf.Variable(tf.random.normal((width, width), stddev=0.1, seed=1))

    @tf.function
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:

            def body(i: Any, h: Any) -> Any:
                return i + 1, tf.tanh(tf.matmul(h, w) + x)

            if trips is None:
                cond = lambda i, h: tf.reduce_sum(h) < 1e9  # noqa: E731
            else:
                cond = lambda i, h: i < trips  # noqa: E731
            _, h = tf.while_loop(cond, body, (tf.constant(0), x))
            loss = tf.reduce_sum(h)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return step, tf.random.normal((batch, width), seed=2)


def _lists(trips: int) -> tuple[list[int], int]:
    """(trip counts of the step's loops, bytes of the lists the forward loop hands its
    gradient's loop)."""
    step, x = _step(trips)
    graph = capture_function(step, x).graph
    loops = [op for op in graph.ops.values() if op.type in LOOP_TYPES]
    names = {op.name for op in loops}
    handed = sum(
        t.nbytes
        for op in loops
        for t in (graph.tensors[o] for o in op.outputs)
        if t.dtype == "variant" and any(c in names for c in t.consumers)
    )
    return sorted(op.repeats for op in loops), handed


@pytest.mark.parametrize("trips", [5, 15])
def test_a_loop_runs_its_trip_count_and_its_lists_hold_one_state_per_iteration(
    trips: int,
) -> None:
    repeats, handed = _lists(trips)
    assert repeats == [trips, trips]  # the loop and the loop of its gradient
    # the gradient needs each step's tanh output; the weight read is the variable's buffer,
    # and the previous state is the tanh output of the step before: pushed once each
    assert handed == trips * BATCH * WIDTH * 4


def test_a_list_costs_the_allocator_model_its_bytes_not_a_region() -> None:
    from simulator import simulate

    step, x = _step(200, 256, 512)  # a 105 MB list of 0.5 MB elements
    sim = simulate(capture_function(step, x).graph)
    # as one 105 MB request it held a whole 128 MiB chunk: 1.28x the live peak
    assert sim.peak_bytes < 1.05 * sim.live_peak_bytes


def test_a_loop_costs_its_trip_count_times_its_body() -> None:
    from rewriter.costs import step_costs
    from simulator import get_preset

    preset = get_preset("v100-16gb-nvlink2")
    seconds = []
    for steps in (6, 12):
        _, captured = _lstm(0, steps, units=256, batch=64)  # ops Grappler prices above 0 ns
        loops = [n for n, op in captured.graph.ops.items() if op.type in LOOP_TYPES]
        costs = step_costs(captured, preset)
        seconds.append(sum(costs[n] for n in loops))
    assert seconds[0] > 0 and seconds[1] == pytest.approx(2 * seconds[0], rel=0.02)


def test_a_loop_bound_by_the_data_is_refused_naming_it_within_seconds() -> None:
    step, x = _step(None)
    start = time.perf_counter()
    with pytest.raises(CaptureError, match=r"loop 'while' \(While\).*not a constant"):
        capture_function(step, x)
    assert time.perf_counter() - start < 60


def test_a_step_with_loops_is_simulated_in_the_categorized_order() -> None:
    assert _resolved_schedule("auto", None, None, ["while"]) == "categorized"
    with pytest.raises(UserError, match="lowered to frames"):
        _resolved_schedule("executor", None, None, ["while"])


def _loop(**fields: int) -> Loop:
    return Loop(trips=10, list_bytes={}, passed={}, body=None, body_scratch=7, **fields)


def test_the_iterations_running_ahead_hold_what_waits_for_the_lagging_chain() -> None:
    # one iteration at a time: only the body's working set
    assert _loop(ahead=100, parallel=1, shrink=30).scratch == 7
    # a gradient loop: its recurrence runs 3 iterations ahead of the weight gradients' sum,
    # each holding a 100-byte product and having popped 30 bytes
    assert _loop(ahead=100, parallel=4, shrink=30).scratch == 7 + 3 * (100 - 30)
    # more iterations allowed than there are: as many as there are
    assert _loop(ahead=100, parallel=64, shrink=30).scratch == 7 + 10 * (100 - 30)
    # a forward loop whose lists grow faster than what runs ahead: nothing above its outputs
    assert _loop(ahead=20, parallel=4, grow=50).scratch == 7


def _lstm(seed: int, steps: int = 12, units: int = 16, batch: int = 8) -> tuple[Any, Any]:
    """Two stacked Keras LSTMs (not unrolled) after an embedding, with Adam: the model and its
    captured training step."""
    import keras

    from autotune.api import capture

    keras.utils.set_random_seed(seed)
    ids = keras.Input((steps,), dtype="int32")
    x = keras.layers.Embedding(50, 8)(ids)
    x = keras.layers.LSTM(units, return_sequences=True)(x)
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.LSTM(units)(x)))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(1e-3)
    return (model, optimizer), capture(model, loss=loss, optimizer=optimizer, batch_size=batch)


def test_lists_that_share_their_elements_with_another_are_not_swap_candidates() -> None:
    step, x = _step(5)
    graph = capture_function(step, x).graph
    lists = [t for t in graph.tensors.values() if t.dtype == "variant" and t.nbytes]
    # the recurrence pushes each step's tanh output, and as the next step's input again
    assert lists and not any(t.element_dtype for t in lists)
    _, captured = _lstm(0)
    graph = captured.graph
    saved = [
        t
        for t in graph.tensors.values()
        if t.element_dtype
        and graph.ops[t.producer].type in LOOP_TYPES
        and any(graph.ops[c].type in LOOP_TYPES for c in t.consumers)
    ]
    # what the forward loops hand their gradients' loops: an element per time step
    assert len(saved) > 5 and all(t.shape[0] == 12 for t in saved)
    # the first layer's output sequence is stacked right after its loop; its states are
    # counted (and swapped) in the list the gradient's loop reads, which outlives it
    stacked = [
        t
        for t in graph.tensors.values()
        if t.dtype == "variant"
        and graph.ops[t.producer].type in LOOP_TYPES
        and t.consumers
        and all(graph.ops[c].type == "TensorListStack" for c in t.consumers)
    ]
    assert stacked and all(t.nbytes == 0 for t in stacked)


@pytest.mark.parametrize("mode", ["emulated", "device"])
def test_a_recurrent_step_with_its_lists_swapped_and_loops_serial_trains_bitwise(
    mode: str,
) -> None:
    import numpy as np

    from autotune.run.measure import example_tensors
    from rewriter.apply import apply_plan
    from simulator.derive import PlanContext, PlanParams
    from simulator.engine import Engine

    (model_a, opt_a), cap_a = _lstm(3)
    (model_b, opt_b), cap_b = _lstm(3)
    params = PlanParams(ub=1, sync_out=True, serialize=True)
    plan = Engine.build(cap_b.graph).evaluate(params).plan
    assert len(plan.serial_loops) == 2 and all("while_grad" in n for n in plan.serial_loops)
    swapped = {s.tensor for s in plan.swaps}
    assert any(cap_b.graph.tensors[t].dtype == "variant" for t in swapped)
    gates = PlanContext.build(cap_b.graph).gates  # a waiter holds the backward pass back
    assert all(s.waiter in gates for s in plan.swaps if s.waiter)
    devices: dict[str, Any] = {"compute_device": "/device:CPU:0", "host_device": "/device:CPU:1"}
    tuned = apply_plan(cap_b, plan, mode=mode, **(devices if mode == "device" else {}))
    inputs = example_tensors(cap_a.specs, seed=7)
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    state_a = [*model_a.weights, *opt_a.variables]
    state_b = [*model_b.weights, *opt_b.variables]
    for va, vb in zip(state_a, state_b, strict=True):
        assert np.array_equal(np.asarray(va), np.asarray(vb)), va.path
    if mode == "device":  # every swap-in ran on the host after its trigger (Grappler kept them)
        from autotune.run.gating import check_gating, executed_partitions

        again = apply_plan(cap_b, plan, mode=mode, **devices)
        partitions = executed_partitions(again, *inputs)
        report = check_gating(again, partitions)
        assert report.gates and report.gated == len(report.gates) and not report.leaks
        # the gradients' loops, as Grappler lowered them, run one iteration at a time
        frames = {
            (n.attr["frame_name"].s.decode(), n.attr["parallel_iterations"].i)
            for p in partitions
            for n in p.node
            if n.op == "Enter"
        }
        serial = {f for f, k in frames if k == 1}  # (the profile may see earlier steps' too)
        assert set(plan.serial_loops) <= serial and all("while_grad" in f for f in serial)
        assert {f for f, k in frames if k == 32} - serial  # the forward loops run as before


def test_the_forward_loop_is_not_in_the_gradient_flow_its_empty_lists_are_named_in() -> None:
    from simulator.candidates import gradient_flow

    step, x = _step(5)
    graph = capture_function(step, x).graph
    flow = gradient_flow(graph)
    assert any(graph.ops[n].type == "EmptyTensorList" for n in flow)  # in the tape's scope
    assert "while" not in flow and "gradient_tape/while/while_grad" in flow
    assert not any(graph.ops[n].type in LOOP_TYPES for n in graph.rewritten)
