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


def _step(trips: int | None) -> tuple[Any, Any]:
    """A training step with a recurrence h = tanh(h @ w + x) in a tf.while_loop, run `trips`
    times, or (None) until its state's sum is large: a bound that depends on the data."""
    w = tf.Variable(tf.random.normal((WIDTH, WIDTH), stddev=0.1, seed=1))

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

    return step, tf.random.normal((BATCH, WIDTH), seed=2)


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
