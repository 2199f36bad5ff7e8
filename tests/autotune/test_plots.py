"""Plot data is computed from the simulation (tested exactly); renderers draw it (smoke)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from autotune.report import plots  # noqa: E402
from simulator import Link, get_preset  # noqa: E402
from simulator.derive import PlanParams  # noqa: E402
from simulator.engine import Engine, Evaluation  # noqa: E402
from simulator.plan import Recompute, Swap, SwapIn, SwapPlan  # noqa: E402
from tests.simulator.builders import training_branches, training_chain  # noqa: E402


@pytest.fixture
def engine() -> Engine:
    g = training_chain()
    preset = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1024 / 3.5)
    assert preset.link == Link(1024 / 3.5, 1024 / 3.5)
    return Engine.build(g, device=preset, cost={n: 1.0 for n in g.ops})


def test_memory_timeline_follows_the_traces(engine: Engine) -> None:
    tuned, base = engine.evaluate(PlanParams()), engine.evaluate(PlanParams(n_tensors=0))
    data = plots.memory_timeline(tuned, base, 4096, engine.lower_bound)
    n = len(engine.order.ops)
    assert len(data.before) == len(data.after) == len(data.host) == n
    assert data.before.max() == base.result.memory.live_peak_bytes
    assert data.after.max() == tuned.result.memory.live_peak_bytes
    outs = {e.step for e in tuned.result.memory.trace if e.kind.name == "SWAP_OUT"}
    assert set(data.swap_out_steps.tolist()) == outs
    assert data.host.max() == tuned.result.memory.host_peak_bytes
    fig = plots.render_memory_timeline(data)
    assert 1024 <= max(data.peak_before, 4096) < 1 << 20  # a budget of 4 KiB: read in KiB
    assert fig.axes[0].get_ylabel() == "device memory (KiB)"


def test_time_view_streams_add_up_to_the_step(engine: Engine) -> None:
    ev = engine.evaluate(PlanParams())
    data = plots.time_view(ev)
    assert data is not None and ev.result.time is not None
    busy = sum(w for _, w in data.compute_after)
    waited = sum(w for bars in data.waits.values() for _, w in bars)
    assert busy == pytest.approx(ev.result.time.baseline_seconds)
    assert busy + waited == pytest.approx(ev.result.time.step_seconds)
    assert len(data.d2h) == len(ev.plan.swaps)
    fig = plots.render_time_view(data)
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


def test_time_view_shows_each_wait_by_what_it_waits_for(engine: Engine) -> None:
    plan = _waiting_plan()
    result = engine.simulate(plan)
    t = result.time
    assert t is not None
    data = plots.time_view(Evaluation(PlanParams(), plan, result, 0.0))
    assert data is not None
    totals = {k: sum(w for _, w in bars) for k, bars in data.waits.items()}
    assert totals == pytest.approx(t.waits())
    assert totals == pytest.approx({"swap-out": 3.5, "swap-in": 7.0, "recompute input": 3.5})
    assert sum(w for _, w in data.rerun) == pytest.approx(t.recompute_seconds) == 1.0
    busy = sum(w for _, w in data.compute_after)
    assert busy == pytest.approx(t.baseline_seconds)
    assert busy + 1.0 + sum(totals.values()) == pytest.approx(t.step_seconds)
    assert t.end()[-1] == pytest.approx(t.step_seconds)
    labels = [x.get_text() for x in plots.render_time_view(data).axes[0].get_yticklabels()]
    assert "waiting for swap-ins: 7000.0 ms" in labels


def test_time_view_splits_the_waits_at_the_backward_pass(engine: Engine) -> None:
    # f2 waits 3.5 s in the forward pass; b3 and f2's re-run wait in the backward
    plan = _waiting_plan()
    ev = Evaluation(PlanParams(), plan, engine.simulate(plan), 0.0)
    first = engine.order.ops[engine.backward_start]
    data = plots.time_view(ev, first)
    assert data is not None and ev.result.time is not None
    assert data.by_phase == {
        "swap-out": pytest.approx((3.5, 0.0)),
        "swap-in": pytest.approx((0.0, 7.0)),
        "recompute input": pytest.approx((0.0, 3.5)),
    }
    t, at = ev.result.time, engine.order.position[first]
    assert data.backward_at == pytest.approx(t.end()[at] - 1.0 - t.stalls.get(at, 0.0))
    assert plots.time_view(ev).by_phase is None  # type: ignore[union-attr]
    fig = plots.render_time_view(data)
    labels = [x.get_text() for x in fig.axes[0].get_yticklabels()]
    assert "waiting for swap-outs: 3500.0 ms (3500.0 forward, 0.0 backward)" in labels
    marks = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert marks == pytest.approx([data.backward_before * 1e3, data.backward_at * 1e3])
    assert data.backward_before == pytest.approx(t.timeline.base_end[at] - 1.0)


def test_batch_curve_grid_reaches_past_the_largest_batch(engine: Engine) -> None:
    curve = plots.batch_curve(lambda b: engine, PlanParams(), 4096, 10, 40, points=5)
    assert curve.batches[-1] >= 40 and len(curve.batches) == len(curve.no_swap) == 5
    assert curve.tuned[0] == engine.evaluate(PlanParams()).peak_bytes
    assert curve.no_swap[0] == engine.evaluate(PlanParams(n_tensors=0)).peak_bytes
    assert plots.render_batch_curve(curve).axes[0].get_xlabel() == "batch size"


def test_batch_curve_orders_every_size_by_the_tuned_sizes_edges() -> None:
    shared: dict = {}
    small, big = (Engine.build(training_branches(n), shared=shared) for n in (1 << 20, 1 << 22))
    params = PlanParams(serialize=True)
    curve = plots.batch_curve(lambda b: big if b >= 30 else small, params, 1 << 30, 10, 40, 5)
    assert list(shared["edges"]) == [big.lower_bound]  # none searched for the small size
    assert curve.tuned[0] == small.ordered_like(big).evaluate(params).peak_bytes


def test_search_plots_come_from_optuna(engine: Engine) -> None:
    from autotune.search.core import Budget, in_memory_study, run_study

    out = run_study(engine, Budget(1 << 20, 1.0), in_memory_study("tpe", 0), 6)
    figs = plots.render_search(out.study)
    assert {"optimization_history", "param_importances"} <= set(figs)
    two = run_study(engine, Budget(1 << 20, 1.0), in_memory_study("tpe", 0, 2), 6, objectives=2)
    assert "pareto_front" in plots.render_search(two.study)


def test_verification_plot_draws_both_peaks() -> None:
    class V:
        def to_dict(self):  # type: ignore[no-untyped-def]
            return {
                "device": "emulated",
                "measured_peak_bytes": 3 << 30,
                "baseline_measured_peak_bytes": 5 << 30,
                "predicted_peak_bytes": 2 << 30,
                "baseline_predicted_peak_bytes": 5 << 30,
                "error_percent": -33.3,
            }

    fig = plots.render_verification(V())
    heights = sorted(p.get_height() for p in fig.axes[0].patches)
    assert np.allclose(heights, [2, 3, 5, 5])


def test_the_parameter_importances_show_their_labels_whole() -> None:
    # "efetch_share" and "mpute_heavy" were cut at the figure's left edge
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(
        lambda t: t.suggest_float("prefetch_share", 0, 1) + t.suggest_int("recompute_heavy", 0, 3),
        n_trials=12,
    )
    fig = plots.render_search(study)["param_importances"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    labels = [t for ax in fig.axes for t in ax.get_yticklabels() if t.get_text()]
    assert {t.get_text() for t in labels} >= {"prefetch_share", "recompute_heavy"}
    assert all(t.get_window_extent(renderer).x0 >= 0 for t in labels)
