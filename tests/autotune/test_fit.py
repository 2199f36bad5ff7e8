import numpy as np
import pytest

import autotune
from autotune.planfile import load_plan
from autotune.search.tuning import BudgetError

pytestmark = pytest.mark.tf


def make_step():  # type: ignore[no-untyped-def]
    """A custom training loop step: eight dense layers, plain SGD on tf.Variables."""
    import tensorflow as tf

    shapes = [(64, 256)] + [(256, 256)] * 6 + [(256, 10)]
    ws = [
        tf.Variable(tf.random.stateless_normal(s, seed=[i, 1]) * 0.1) for i, s in enumerate(shapes)
    ]

    @tf.function
    def step(x, y):  # type: ignore[no-untyped-def]
        with tf.GradientTape() as tape:
            h = x
            for w in ws[:-1]:
                h = tf.nn.relu(h @ w)
            logits = h @ ws[-1]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        for w, g in zip(ws, tape.gradient(loss, ws)):
            w.assign_sub(0.1 * g)
        return loss

    return step, ws


def specs(batch: int = 512):  # type: ignore[no-untyped-def]
    import tensorflow as tf

    return tf.TensorSpec([batch, 64], tf.float32), tf.TensorSpec([batch], tf.int32)


def tight_budget(step, share: float = 0.5) -> int:  # type: ignore[no-untyped-def]
    sim = autotune.simulate(step, *specs(), device="v100-16gb-nvlink2")
    low, top = sim.lower_bound_bytes, sim.peak_bytes
    return int(low + share * (top - low))


def test_fit_tunes_a_custom_step_that_trains_exactly_like_the_original(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, ws = make_step()
    budget = tight_budget(step)
    tuned = autotune.fit(
        step, *specs(), gpu_memory=budget, safety_ratio=1.0, trials=15, out=tmp_path
    )
    assert tuned.plan.swaps and tuned.predicted_peak_bytes <= budget
    assert tuned.predicted_step_seconds > 0 and tuned.predicted_overhead >= 1.0
    assert tuned.params.n_tensors != 0
    assert len(tuned.study.trials) == 15
    assert any("swap_out" in n.name for n in tuned.graph_def.node)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 64)).astype("float32")
    y = rng.integers(0, 10, size=512).astype("int32")
    start = [w.numpy() for w in ws]
    want = step(x, y).numpy()
    after = [w.numpy() for w in ws]
    for w, v in zip(ws, start):
        w.assign(v)
    got = tuned(x, y)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert np.array_equal(np.asarray(got), want)
    assert all(np.array_equal(w.numpy(), a) for w, a in zip(ws, after))


def test_fit_a_keras_model_and_write_its_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autotune.zoo import get_entry

    zm = get_entry("tiny-cnn").build()
    kw = {"loss": zm.loss, "optimizer": zm.optimizer, "batch_size": 256}
    tuned = autotune.fit(zm.model, gpu_memory="80MiB", trials=10, out=tmp_path, **kw)
    assert tuned.batch_size == 256 and (tuned.plan.swaps or tuned.plan.recomputes)
    assert tuned.predicted_peak_bytes <= tuned.budget.bytes < tuned.baseline.peak_bytes
    report = tuned.report(tmp_path / "report")
    files = ("summary.json", "plan.json", "trials.csv", "report.md", "report.html")
    plots = ("memory_timeline", "time_view", "optimization_history", "param_importances")
    for name in (*files, *(f"{p}.png" for p in plots)):
        assert (report.parent / name).stat().st_size > 0
    assert "original auto-tuner" in report.read_text()
    html = (report.parent / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(plots) and "<table" in html
    # the history's grey points are the trials whose plan did not fit: said under the plot
    history = report.read_text().split("## Search: optimization history")[1].split("##")[0]
    assert "grey points are trials whose plan did not fit the budget" in history
    assert "grey points are trials whose plan did not fit the budget" in html
    # the time view splits the waits where the backward pass starts
    assert tuned.backward_op is not None and tuned.backward_op.startswith("gradient_tape/")
    assert "dashed line is where the backward pass starts" in report.read_text()


def test_a_budget_that_fits_without_swapping_returns_the_untouched_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, _ = make_step()
    tuned = autotune.fit(step, *specs(), gpu_memory="16GiB", trials=5, out=tmp_path)
    assert tuned.fits_without_swapping and not tuned.plan.swaps
    assert tuned.study is None
    assert tuned.step is tuned.captured.concrete_function


def test_the_search_runs_with_fewer_collections(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import gc

    from simulator.engine import Engine
    from simulator.memory import SEARCH_GC_THRESHOLD

    seen, evaluate = [], Engine.evaluate

    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.get_threshold()[0])
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "evaluate", recorded)
    before = gc.get_threshold()
    step, _ = make_step()
    autotune.fit(step, *specs(), gpu_memory="16MiB", trials=3, out=tmp_path)
    assert seen and min(seen) >= SEARCH_GC_THRESHOLD
    assert gc.get_threshold() == before


def test_a_budget_below_the_lower_bound_names_the_smallest_that_could_fit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, _ = make_step()
    with pytest.raises(BudgetError, match=r"smallest device memory that could ever fit is .* B\)"):
        autotune.fit(step, *specs(), gpu_memory=1 << 20, trials=5, out=tmp_path)


@pytest.mark.parametrize("trials", [0, -3])
def test_trials_must_be_positive(trials: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, _ = make_step()
    with pytest.raises(ValueError, match="trials must be at least 1"):
        autotune.fit(step, *specs(), gpu_memory="16GiB", trials=trials, out=tmp_path)


def test_max_batch_for_a_custom_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, _ = make_step()
    budget = tight_budget(step, 1.0)  # the no-swap peak at batch 512
    tuned = autotune.fit(
        step, *specs(), gpu_memory=budget, safety_ratio=1.0, trials=8, max_batch=True,
        out=tmp_path,
    )  # fmt: skip
    d = tuned.to_dict()
    assert d["max_batch_tuned"] == tuned.batch_size >= d["max_batch_no_swap"] >= 512
    # tuned on the graph scaled from two captures: the step is captured at its batch only
    # when it is needed, and not for the plan file, which is that of the step captured there
    assert tuned.training.captured is None
    saved = load_plan(tuned.save_plan(tmp_path / "plan.json"))
    assert tuned.training.captured is None
    assert tuned.captured.specs[0].shape[0] == tuned.batch_size
    assert saved.fingerprint == tuned.captured.graph.fingerprint()
    assert saved.for_step(tuned.captured, tuned.batch_size) == tuned.plan
    # ours' outcome at its largest batch is the full tuning there, not the probe's first fit
    assert tuned.batches is not None
    assert tuned.batches["ours"].outcome is tuned.outcomes["ours"]
    assert tuned.outcomes["ours"].study is tuned.study and len(tuned.study.trials) >= 8
    assert set(d["baselines"]) == {
        "no swapping", "recompute only", "original defaults", "original auto-tuner",
        "random search",
    }  # fmt: skip
    # the plan simulated on the graph built from two captures applies to the step captured at
    # the batch found, as it is (order edges included)
    from autotune.run.measure import example_tensors

    assert np.isfinite(tuned(*example_tensors(tuned.captured.specs)).numpy())
    assert tuned.plan.swaps and tuned.step.plan == tuned.plan


def test_two_objectives_keep_the_pareto_front(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, _ = make_step()
    budget = tight_budget(step)
    tuned = autotune.fit(
        step, *specs(), gpu_memory=budget, safety_ratio=1.0, trials=12, objectives=2,
        out=tmp_path,
    )  # fmt: skip
    front = tuned.to_dict()["pareto_front"]
    assert front and all(p["peak_bytes"] <= budget for p in front)
    peaks = [p["peak_bytes"] for p in front]
    times = [p["step_seconds"] for p in front]
    assert peaks == sorted(peaks) and times == sorted(times, reverse=True)  # a real trade-off
    assert "pareto_front.png" in {p.name for p in tuned.report(tmp_path / "r").parent.iterdir()}


def test_a_tuned_step_takes_any_batch_and_numpy_defaults(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the same custom step, twice: one run untouched, one through the tuned result, fed what
    # a user has at hand (float64 arrays, int64 labels) at the tuned batch, then a smaller one
    step, ws = make_step()
    twin, twin_ws = make_step()
    budget = tight_budget(step)
    tuned = autotune.fit(
        step, *specs(), gpu_memory=budget, safety_ratio=1.0, trials=8, out=tmp_path
    )
    assert tuned.plan.swaps or tuned.plan.recomputes  # recompute only, matmuls too, may win
    assert tuned.step is not tuned.captured.concrete_function  # applied, if recompute only too
    rng = np.random.default_rng(1)
    for batch in (512, 100, 512, 100):
        x, y = rng.normal(size=(batch, 64)), rng.integers(0, 10, size=batch)
        assert x.dtype == np.float64 and y.dtype == np.int64
        loss = tuned(x, y)
        want = twin(x.astype("float32"), y.astype("int32"))
        assert np.array_equal(loss.numpy(), want.numpy()), batch
    for w, v in zip(ws, twin_ws, strict=True):
        assert np.array_equal(w.numpy(), v.numpy())
    assert set(tuned.training._at) == {100}  # derived once, then cached
    again = tuned.training.at_batch(100).plan  # the parameters give a plan there too
    assert again.swaps or again.recomputes


def test_a_tuned_step_names_an_argument_it_cannot_take(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rewriter.inputs import InputError

    step, _ = make_step()
    tuned = autotune.fit(step, *specs(), gpu_memory=1 << 30, trials=2, out=tmp_path)
    x = np.zeros((512, 64), "float32")
    with pytest.raises(InputError, match=r"argument 1.*expected int32.*got float32"):
        tuned(x, np.zeros(512, "float32"))
    with pytest.raises(InputError, match=r"argument 0.*expected float32 of shape \[batch, 64\]"):
        tuned(np.zeros((512, 65), "float32"), np.zeros(512, "int32"))
    with pytest.raises(InputError, match="int32"):
        tuned(x, np.full(512, 2**40))  # int64 labels that do not fit int32
    with pytest.raises(InputError, match="takes 2 arguments, got 1"):
        tuned(x)


@pytest.mark.tf
@pytest.mark.parametrize("mode", ["search", "none", "cheap"])
def test_the_search_recomputes_as_the_mode_allows(mode: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.models import bn_cnn

    zm = bn_cnn(32)  # 49.6 MiB without a plan; recompute only fits 44 MiB
    tuned = autotune.fit(
        zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=128, gpu_memory="44MiB",
        safety_ratio=1.0, trials=8, out=tmp_path, recompute=mode,
    )  # fmt: skip
    d = tuned.to_dict()
    only = d["methods"]["recompute only"]
    assert only["fits"] and only["params"]["n_tensors"] == 0 and only["overhead"] > 1
    modes = {t.user_attrs["plan_params"]["recompute"] for t in tuned.study.trials}
    assert modes == ({"none", "cheap"} if mode == "search" else {mode})
    assert d["recomputed_tensors"] == len(tuned.plan.recomputes)
    assert (d["recomputed_tensors"] > 0) == (d["recompute_seconds"] > 0)
    assert d["recomputed_tensors"] == 0 or mode != "none"
    if mode == "search":  # recompute only is one of its warm starts
        assert d["predicted_overhead"] <= only["overhead"]
    assert d["baseline_step_seconds"] <= d["time_bound_seconds"] <= d["predicted_step_seconds"]


def test_max_cube_shows_ours_as_tuned_at_its_edge(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the largest-edge table printed ours' first plan that fit during the search (2.826x on
    # the Isensee U-Net) beside the tuned plan (2.098x): it shows the tuned one
    from autotune.search.core import Budget
    from autotune.search.cubes import fit_max_cube
    from autotune.zoo import get_entry
    from simulator import get_preset

    entry = get_entry("tiny-unet3d")
    tuned = fit_max_cube(
        lambda edge: entry.build(cube=edge), entry.cube_step, get_preset("v100-16gb-nvlink2"),
        Budget(40 * 2**20), trials=4, out=tmp_path,
    )  # fmt: skip
    shown = tuned.batches["ours"].outcome
    assert shown is tuned.outcomes["ours"] and shown.best is not None
    assert shown.evaluations == 4  # the tuning ran every trial
