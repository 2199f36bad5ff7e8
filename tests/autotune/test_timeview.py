"""The time view's data is computed from the time model (tested exactly); its renderer draws
it (smoke)."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from autotune.report import timeview  # noqa: E402
from simulator.derive import PlanParams  # noqa: E402
from simulator.engine import Engine, Evaluation  # noqa: E402
from simulator.plan import Recompute, Swap, SwapIn, SwapPlan  # noqa: E402


def test_time_view_streams_add_up_to_the_step(timed_chain: Engine) -> None:
    ev = timed_chain.evaluate(PlanParams())
    data = timeview.time_view(ev)
    assert data is not None and ev.result.time is not None
    busy = sum(w for _, w in data.compute_after)
    waited = sum(w for bars in data.waits.values() for _, w in bars)
    assert busy == pytest.approx(ev.result.time.baseline_seconds)
    assert busy + waited == pytest.approx(ev.result.time.step_seconds)
    assert len(data.d2h) == len(ev.plan.swaps)
    fig = timeview.render_time_view(data)
    assert fig.axes[0].get_xlabel() == "time in the step (ms)"


def _waiting_plan() -> SwapPlan:
    """Ops take 1 s, a 1 KiB copy 3.5 s: f2 waits for f1's synchronized swap-out, b3 for f3's
    swap-in (triggered by f3, after its swap-out), f2's re-run after b3 for f1's swap-in."""
    b = "gradient_tape/"
    return SwapPlan(
        swaps=(
            Swap("f1:0", 1024, (SwapIn(b + "b3", (b + "b1",)),), sync=True),
            Swap("f3:0", 1024, (SwapIn("f3", (b + "b3",)),)),
        ),
        recomputes=(Recompute("f2:0", 1024, ("f2",), b + "b3", (b + "b2",), (("f1:0", 0),)),),
    )


def test_time_view_shows_each_wait_by_what_it_waits_for(timed_chain: Engine) -> None:
    plan = _waiting_plan()
    result = timed_chain.simulate(plan)
    t = result.time
    assert t is not None
    data = timeview.time_view(Evaluation(PlanParams(), plan, result, 0.0))
    assert data is not None
    totals = {k: sum(w for _, w in bars) for k, bars in data.waits.items()}
    assert totals == pytest.approx(t.waits())
    assert totals == pytest.approx({"swap-out": 3.5, "swap-in": 7.0, "recompute input": 3.5})
    assert sum(w for _, w in data.rerun) == pytest.approx(t.recompute_seconds) == 1.0
    busy = sum(w for _, w in data.compute_after)
    assert busy == pytest.approx(t.baseline_seconds)
    assert busy + 1.0 + sum(totals.values()) == pytest.approx(t.step_seconds)
    assert t.end()[-1] == pytest.approx(t.step_seconds)
    labels = [x.get_text() for x in timeview.render_time_view(data).axes[0].get_yticklabels()]
    assert "waiting for swap-ins: 7000.0 ms" in labels


def test_time_view_splits_the_waits_at_the_backward_pass(timed_chain: Engine) -> None:
    # f2 waits 3.5 s in the forward pass; b3 and f2's re-run wait in the backward
    plan = _waiting_plan()
    ev = Evaluation(PlanParams(), plan, timed_chain.simulate(plan), 0.0)
    first = timed_chain.order.ops[timed_chain.backward_start]
    data = timeview.time_view(ev, first)
    assert data is not None and ev.result.time is not None
    assert data.by_phase == {
        "swap-out": pytest.approx((3.5, 0.0)),
        "swap-in": pytest.approx((0.0, 7.0)),
        "recompute input": pytest.approx((0.0, 3.5)),
    }
    t, at = ev.result.time, timed_chain.order.position[first]
    assert data.backward_at == pytest.approx(t.end()[at] - 1.0 - t.stalls.get(at, 0.0))
    assert timeview.time_view(ev).by_phase is None  # type: ignore[union-attr]
    fig = timeview.render_time_view(data)
    labels = [x.get_text() for x in fig.axes[0].get_yticklabels()]
    assert "waiting for swap-outs: 3500.0 ms (3500.0 forward, 0.0 backward)" in labels
    marks = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert marks == pytest.approx([data.backward_before * 1e3, data.backward_at * 1e3])
    assert data.backward_before == pytest.approx(t.timeline.base_end[at] - 1.0)
