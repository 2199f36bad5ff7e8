"""Branches (`tf.cond`): what the gradient keeps of the branch taken, and its working set."""

from __future__ import annotations

import pytest

from tests.autotune.cli_helpers import cli_json

pytestmark = pytest.mark.tf

MODEL, BATCH, COPIES, WIDTH = "tests/models.py:branch", 512, 8, 512


def test_a_branch_keeps_its_values_for_the_gradient_and_holds_its_working_set() -> None:
    from autotune.api import capture
    from autotune.zoo import resolve_model
    from rewriter.capture import capture_function  # noqa: F401  (TensorFlow first)

    m = resolve_model(MODEL)
    graph = capture(m.model, loss=m.loss, optimizer=m.optimizer, batch_size=BATCH).graph
    branches = [op for op in graph.ops.values() if op.type.endswith("If")]
    forward, backward = sorted(branches, key=lambda op: op.name.startswith("gradient_tape/"))
    tiled = COPIES * BATCH * WIDTH * 4
    # the optional holding the tanh of the tiled input: read by the gradient's branch op
    kept = [graph.tensors[t] for t in forward.outputs if graph.tensors[t].dtype == "variant"]
    assert tiled in [t.nbytes for t in kept]
    assert any(backward.name in graph.tensors[t].consumers for t in forward.outputs)
    # the forward branch's tanh takes over the tiled input's buffer, and is what it keeps; the
    # gradient's branch makes the tanh's gradient, as large, inside: its working set
    assert backward.scratch >= tiled


def test_a_branch_costs_its_costliest_branch() -> None:
    from autotune.api import capture
    from rewriter.costs import step_costs
    from simulator import get_preset
    from tests.models import branch

    preset, seconds = get_preset("v100-16gb-nvlink2"), []
    for copies in (8, 16):  # the branch taken tiles and takes the tanh of twice as much
        m = branch(copies=copies)
        captured = capture(m.model, loss=m.loss, optimizer=m.optimizer, batch_size=BATCH)
        ifs = [n for n, op in captured.graph.ops.items() if op.type.endswith("If")]
        costs = step_costs(captured, preset)
        seconds.append(sum(costs[n] for n in ifs))
    assert seconds[0] > 0 and seconds[1] == pytest.approx(2 * seconds[0], rel=0.1)


def test_a_step_with_a_branch_is_predicted_within_10_percent_of_its_measured_peak() -> None:
    # before branches were sized: 4.07 MiB predicted against 20.06 MiB measured
    common = ("--model", MODEL, "--batch-size", str(BATCH))
    predicted = cli_json("simulate", *common, "--schedule", "categorized")["peak_bytes"]
    measured = cli_json("measure", *common)["peak_bytes"]
    assert abs(predicted / measured - 1) < 0.10, (predicted, measured)
