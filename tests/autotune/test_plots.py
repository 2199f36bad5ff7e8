"""Plot data is computed from the simulation (tested exactly); renderers draw it (smoke)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from autotune.report import plots  # noqa: E402
from simulator.derive import PlanParams  # noqa: E402
from simulator.engine import Engine  # noqa: E402
from tests.simulator.builders import training_branches  # noqa: E402


def test_memory_timeline_follows_the_traces(timed_chain: Engine) -> None:
    tuned, base = timed_chain.evaluate(PlanParams()), timed_chain.evaluate(PlanParams(n_tensors=0))
    data = plots.memory_timeline(tuned, base, 4096, timed_chain.lower_bound)
    n = len(timed_chain.order.ops)
    assert len(data.before) == len(data.after) == len(data.host) == n
    assert data.before.max() == base.result.memory.live_peak_bytes
    assert data.after.max() == tuned.result.memory.live_peak_bytes
    outs = {e.step for e in tuned.result.memory.trace if e.kind.name == "SWAP_OUT"}
    assert set(data.swap_out_steps.tolist()) == outs
    assert data.host.max() == tuned.result.memory.host_peak_bytes
    fig = plots.render_memory_timeline(data)
    assert 1024 <= max(data.peak_before, 4096) < 1 << 20  # a budget of 4 KiB: read in KiB
    assert fig.axes[0].get_ylabel() == "device memory (KiB)"


def test_batch_curve_grid_reaches_past_the_largest_batch(timed_chain: Engine) -> None:
    curve = plots.batch_curve(lambda b: timed_chain, PlanParams(), 4096, 10, 40, points=5)
    assert curve.batches[-1] >= 40 and len(curve.batches) == len(curve.no_swap) == 5
    assert curve.tuned[0] == timed_chain.evaluate(PlanParams()).peak_bytes
    assert curve.no_swap[0] == timed_chain.evaluate(PlanParams(n_tensors=0)).peak_bytes
    assert plots.render_batch_curve(curve).axes[0].get_xlabel() == "batch size"


def test_batch_curve_orders_every_size_by_the_tuned_sizes_edges() -> None:
    shared: dict = {}
    small, big = (Engine.build(training_branches(n), shared=shared) for n in (1 << 20, 1 << 22))
    params = PlanParams(serialize=True)
    curve = plots.batch_curve(lambda b: big if b >= 30 else small, params, 1 << 30, 10, 40, 5)
    assert list(shared["edges"]) == [big.lower_bound]  # none searched for the small size
    assert curve.tuned[0] == small.ordered_like(big).evaluate(params).peak_bytes


def test_search_plots_come_from_optuna(timed_chain: Engine) -> None:
    from autotune.search.core import Budget, in_memory_study, run_study

    out = run_study(timed_chain, Budget(1 << 20, 1.0), in_memory_study("tpe", 0), 6)
    figs = plots.render_search(out.study)
    assert {"optimization_history", "param_importances"} <= set(figs)
    two = run_study(
        timed_chain, Budget(1 << 20, 1.0), in_memory_study("tpe", 0, 2), 6, objectives=2
    )
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
