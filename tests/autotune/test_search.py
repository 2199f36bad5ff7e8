import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.search.baselines import (
    _original_search,
    largest,
    original_autotuner,
    warm_starts,
)
from autotune.search.core import (
    DEFAULT_SAFETY_RATIO,
    INTERRUPTED,
    Budget,
    Space,
    in_memory_study,
    random_search,
    run_study,
    single_plan,
    stop_when_fits,
)
from autotune.search.trials import REFINE_AFTER
from simulator.derive import RECOMPUTE_MAX_OPS, PlanParams
from simulator.errors import UserError

RESULTS = Path(__file__).parents[2] / "results" / "simulator_accuracy.json"


def test_safety_ratio_covers_the_measured_error_of_large_steps() -> None:
    rows = json.loads(RESULTS.read_text())["rows"]
    large = [r for r in rows if r["measured"] >= 1 << 29]  # steps peaking at 0.5 GiB or more
    assert len(large) >= 2
    # every single process, not only the median: predicted <= ratio x memory must keep each
    # measured peak within the memory
    worst = min(r["predicted"] / m for r in large for m in r["measured_all"])
    assert worst >= DEFAULT_SAFETY_RATIO
    assert worst - DEFAULT_SAFETY_RATIO < 0.08, "the margin is far wider than the measured error"


@pytest.mark.parametrize("memory,ratio", [(0, 0.9), (-5, 0.9), (1 << 30, 0.0), (1 << 30, 1.5)])
def test_budget_rejects_nonsense(memory: int, ratio: float) -> None:
    with pytest.raises(ValueError):
        Budget(memory, ratio)


def test_budget_is_the_share_of_memory() -> None:
    assert Budget(1000, 0.9).bytes == 900


def test_space_sorts_lb_ub_and_maps_all_candidates_to_minus_one() -> None:
    space = Space(candidates=20, levels=300, limit_bytes=1 << 30)
    trial = optuna.trial.FixedTrial(
        {"n_tensors": 20, "lb": 40, "ub": 7, "threshold": 3, "groupby": 2, "trigger": "chain_rule",
         "sync_out": True, "sync_lag": 9, "serialize": True, "recompute": "cheap",
         "recompute_ops": 3, "backward_swaps": False}
    )  # fmt: skip
    p = space.suggest(trial)
    assert (p.n_tensors, p.lb, p.ub, p.threshold, p.groupby) == (-1, 7, 40, 3, 2)
    assert p.sync_out and p.sync_lag == 9 and p.serialize
    assert p.trigger == "direct_order" and "trigger" not in space.of_params(p)  # not drawn
    assert (p.recompute, p.recompute_ops) == ("cheap", 3)
    assert space.of_params(p)["serialize"] is True and space.of_params(p)["sync_lag"] == 9
    assert space.least_memory()["serialize"] is True and space.defaults()["serialize"] is False
    assert not p.backward_swaps and space.of_params(p)["backward_swaps"] is False
    both = space.suggest(optuna.trial.FixedTrial({**trial.params, "backward_swaps": True}))
    assert both.backward_swaps and space.of_params(both)["backward_swaps"] is True
    assert both.limit == p.limit == 1 << 30  # the budget, where it applies
    alone = space.suggest(optuna.trial.FixedTrial({**trial.params, "recompute": "none"}))
    assert alone.limit == 0 and not alone.backward_swaps
    timed = Space(candidates=20, levels=300, budget_bytes=1 << 30)
    fixed = {**trial.params, "prefetch": True, "prefetch_share": 0.9, "postpone_waits": False,
             "recompute_heavy": 0.25}  # fmt: skip
    kept = timed.suggest(optuna.trial.FixedTrial(fixed))
    assert kept.prefetch_bytes and not kept.postpone_waits
    assert timed.of_params(kept)["postpone_waits"] is False
    assert kept.recompute_heavy == 0.25 and timed.of_params(kept)["recompute_heavy"] == 0.25
    assert "recompute_heavy" not in space.of_params(kept)  # no time model: not searched
    unsynced = timed.suggest(optuna.trial.FixedTrial({**fixed, "sync_out": False}))
    assert unsynced.postpone_waits and "postpone_waits" not in timed.of_params(unsynced)
    # asked for only when every forward candidate is swapped
    some = space.suggest(optuna.trial.FixedTrial({**trial.params, "n_tensors": 19}))
    assert not some.backward_swaps and "backward_swaps" not in space.of_params(some)
    for q in space.neighbours(space.of_params(some)):  # 3 % more swaps is every one of them
        assert ("backward_swaps" in q) == (q["n_tensors"] == 20)


def test_the_space_counts_forward_candidates_all_of_which_bring_backward_ones() -> None:
    from simulator.engine import Engine
    from tests.simulator.builders import held_gradient

    engine = Engine.build(held_gradient())
    forward = [c for c in engine.context.candidates if not c.made_in_backward]
    assert Space.of(engine).candidates == len(forward) < len(engine.context.candidates)


def test_a_sampled_lag_of_one_level_is_the_readers_own_wait() -> None:
    space = Space(candidates=20, levels=300)
    fixed = {"n_tensors": 5, "lb": 1, "ub": 1, "threshold": 1, "groupby": 0,
             "trigger": "direct_order", "sync_out": True, "sync_lag": 1, "serialize": False,
             "recompute": "none", "recompute_ops": 5}  # fmt: skip
    p = space.suggest(optuna.trial.FixedTrial(fixed))
    assert p.sync_out and p.sync_lag == 0
    assert space.of_params(p)["sync_lag"] == 1  # and back: the least-memory start is exact
    assert "sync_lag" not in space.of_params(replace(p, sync_out=False))


def test_neighbours_move_one_axis_each_within_the_ranges() -> None:
    space = Space(candidates=200, levels=300, budget_bytes=1 << 30)
    base = {"n_tensors": 200, "lb": 2, "ub": 4, "threshold": 1, "groupby": 0,
            "trigger": "direct_order", "sync_out": True, "sync_lag": 16, "serialize": True,
            "recompute": "cheap", "recompute_ops": 8, "recompute_heavy": 0.25,
            "prefetch": True, "prefetch_share": 1.0}  # fmt: skip
    moves = space.neighbours(base, swapped=100)
    assert moves and base not in moves
    for q in moves:
        changed = {k for k in base if q[k] != base[k]}
        assert len(changed) == 1 or changed == {"ub", "lb"}, changed
        assert 1 <= q["lb"] <= q["ub"] <= 300 and 1 <= q["recompute_ops"] <= 8
        assert 0.7 <= q["prefetch_share"] <= 1.0 and 1 <= q["sync_lag"] <= 300
    # fewer swapped tensors counted from the 100 the plan swapped, not from n_tensors
    assert sorted(q["n_tensors"] for q in moves if q["n_tensors"] != 200) == [80, 90, 97, 103]
    assert {q["sync_lag"] for q in moves} >= {8, 32} and {q["ub"] for q in moves} >= {2, 8}
    assert {q["recompute_ops"] for q in moves} == {7, 8} and {q["groupby"] for q in moves} >= {2}
    assert {q["recompute_heavy"] for q in moves} == {0.0, 0.25, 1.0}


def test_a_fixed_recompute_mode_is_not_searched() -> None:
    swap = {"n_tensors": 5, "lb": 1, "ub": 2, "threshold": 1, "groupby": 0,
            "trigger": "direct_order", "sync_out": False, "serialize": False}  # fmt: skip
    never = Space(20, 300, "none").suggest(optuna.trial.FixedTrial(swap))
    assert never.recompute == "none"
    always = Space(20, 300, "cheap").suggest(optuna.trial.FixedTrial({**swap, "recompute_ops": 2}))
    assert (always.recompute, always.recompute_ops) == ("cheap", 2)
    heavy = {**swap, "recompute": "cheap", "recompute_ops": 8, "recompute_heavy": 1.0,
             "prefetch": False}  # fmt: skip
    timed = Space(20, 300, budget_bytes=1 << 30).suggest(optuna.trial.FixedTrial(heavy))
    assert timed.recompute_heavy == 1.0  # drawn only with a time model to weigh ops by
    assert Space(20, 300).suggest(optuna.trial.FixedTrial(heavy)).recompute_heavy == 0.0
    searched = Space(20, 300).starts()
    assert [s["recompute"] for s in searched] == ["none", "none", "cheap", "cheap"]
    assert searched[-1]["n_tensors"] == 0  # recompute only
    off = Space(20, 300, "none")
    assert [off.suggest(optuna.trial.FixedTrial(s)).recompute for s in off.starts()] == [
        "none",
        "none",
    ]
    # what the run fixes is no trial parameter, and no neighbour moves what it does not draw
    assert not any({"recompute", "recompute_ops"} & set(s) for s in off.starts())
    assert all("recompute_ops" not in q for q in off.neighbours(off.starts()[1]))
    with pytest.raises(UserError, match="recompute must be one of"):
        Space(20, 300, "sometimes")


@pytest.mark.parametrize("limit", [1, 2, 37, 99, 100])
def test_largest_is_the_last_x_that_is_ok(limit: int) -> None:
    assert largest(lambda x: x <= limit, 1, 100) == limit


def test_original_search_runs_three_binary_searches_in_order() -> None:
    calls = []

    def fits(t: int, a: int, g: int) -> bool:
        calls.append((t, a, g))
        return t <= 37 and a <= 12 and g <= 5

    assert _original_search(fits, levels=200) == (37, 12, 5)
    first_ahead = next(i for i, c in enumerate(calls) if c[0] == 37 and c[1] > 1)
    assert all(a == 1 for _, a, _ in calls[:first_ahead])  # threshold first, ahead fixed at 1
    assert _original_search(lambda t, a, g: False, levels=200) is None


def test_original_search_takes_full_grouping_when_it_fits() -> None:
    assert _original_search(lambda t, a, g: t <= 3, levels=50) == (3, 50, 50)


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    from autotune.api import build_engine, capture
    from autotune.zoo import get_entry
    from simulator import get_preset

    zm = get_entry("tiny-cnn").build()
    captured = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=256)
    return build_engine(captured, get_preset("v100-16gb-nvlink2"))


def budget_at(engine, share: float) -> Budget:  # type: ignore[no-untyped-def]
    """A budget `share` of the way from the lower bound to the no-swap peak."""
    top = engine.evaluate(PlanParams(n_tensors=0)).peak_bytes
    return Budget(int(engine.lower_bound + share * (top - engine.lower_bound)), 1.0)


@pytest.mark.tf
def test_study_starts_from_the_original_defaults(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.6)
    out = run_study(engine, budget, in_memory_study("tpe", 0), 12)
    first, second = out.study.trials[:2]
    space = Space.of(engine, budget_bytes=budget.bytes)
    assert first.params == space.defaults()
    assert second.params == space.least_memory()
    early = out.study.trials[len(space.starts()) - 1]  # the least-memory plan, prefetched
    assert early.params["prefetch"] and early.params["prefetch_share"] == 1.0
    ahead = [(s["sync_lag"] > 1, s["backward_swaps"], s["postpone_waits"], s["recompute_heavy"])
             for s in space.starts()[-8:]]  # fmt: skip
    assert ahead == [(False, False, True, 0.0), (False, True, True, 0.0), (True, False, True, 0.0),
                     (True, True, True, 0.0), (False, False, False, 0.0),
                     (True, False, False, 0.0), (False, True, True, 1.0),
                     (True, True, True, 1.0)]  # fmt: skip
    # the heavy ones by chains long enough for a batch norm, its activation and a convolution
    chains = [s["recompute_ops"] for s in space.starts()[-8:]]
    assert chains == [PlanParams().recompute_ops] * 6 + [RECOMPUTE_MAX_OPS] * 2
    assert first.user_attrs["plan_params"] == PlanParams().to_dict() | {
        "ub": Space.of(engine).levels
    }
    assert second.user_attrs["plan_params"]["backward_swaps"] is True


@pytest.mark.tf
def test_best_fits_and_beats_every_feasible_trial(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.5)
    out = run_study(engine, budget, in_memory_study("tpe", 1), 25)
    assert out.best is not None and out.best.peak_bytes <= budget.bytes
    feasible = [t for t in out.study.trials if t.user_attrs["peak_bytes"] <= budget.bytes]
    assert out.best.step_seconds == min(t.user_attrs["step_seconds"] for t in feasible)


@pytest.mark.tf
def test_search_never_does_worse_than_the_defaults(engine) -> None:  # type: ignore[no-untyped-def]
    defaults = engine.evaluate(PlanParams())
    budget = Budget(defaults.peak_bytes, 1.0)  # the defaults just fit
    out = run_study(engine, budget, in_memory_study("tpe", 2), 15)
    assert out.best is not None
    assert out.best.step_seconds <= defaults.step_seconds


@pytest.mark.tf
def test_same_seed_same_trials(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.5)
    runs = [run_study(engine, budget, in_memory_study("tpe", 7), 12) for _ in range(2)]
    params = [[t.params for t in r.study.trials] for r in runs]
    assert params[0] == params[1]


@pytest.mark.tf
def test_a_study_stopped_at_its_first_fit_is_a_full_run_cut_there(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.3)
    full = random_search(engine, budget, 20, 4)
    cut = random_search(engine, budget, 20, 4, [stop_when_fits])
    fits = [t.user_attrs["peak_bytes"] <= budget.bytes for t in full.study.trials]
    assert any(fits) and not all(fits)
    first = fits.index(True)
    assert [t.params for t in cut.study.trials] == [t.params for t in full.study.trials][
        : first + 1
    ]
    assert cut.fits


@pytest.fixture
def interrupted():  # type: ignore[no-untyped-def]
    INTERRUPTED.set()
    yield
    INTERRUPTED.clear()


@pytest.mark.tf
def test_a_dropped_ctrl_c_still_stops_the_study_at_its_next_trial(engine, interrupted) -> None:  # type: ignore[no-untyped-def]
    study = in_memory_study("tpe", 0)
    # as when Python dropped the KeyboardInterrupt in a garbage-collector callback
    with pytest.raises(KeyboardInterrupt):
        run_study(engine, budget_at(engine, 0.5), study, 20)
    states = [t.state.name for t in study.trials]
    assert states[0] == "FAIL" and "COMPLETE" not in states and "RUNNING" not in states


@pytest.mark.tf
def test_baselines_report_their_nearest_plan_when_they_do_not_fit(engine) -> None:  # type: ignore[no-untyped-def]
    budget = Budget(engine.lower_bound, 1.0)
    none = single_plan(engine, PlanParams(n_tensors=0), budget, "no swapping")
    assert not none.fits and none.summary()["peak_bytes"] > budget.bytes
    rnd = random_search(engine, budget, 5, seed=0)
    assert rnd.evaluations == 5 and rnd.summary()["peak_bytes"] is not None


@pytest.mark.tf
def test_original_autotuner_fits_by_its_memory_only_simulation(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.8)
    out = original_autotuner(engine, budget)
    params = PlanParams.from_dict(out.summary()["params"])
    assert params.n_tensors == -1 and params.ub - params.lb == 9
    assert engine.evaluate(params, timed=False).peak_bytes <= budget.bytes


@pytest.mark.tf
def test_a_study_shorter_than_its_warm_starts_leaves_none_waiting(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.6)
    assert len(Space.of(engine, budget_bytes=budget.bytes).starts()) > 3
    out = run_study(engine, budget, in_memory_study("tpe", 0), 3)
    states = [t.state.name for t in out.study.trials]
    assert states == ["COMPLETE"] * 3
    assert all("plan_params" in t.user_attrs for t in out.study.trials)


@pytest.mark.tf
def test_study_also_starts_from_the_original_autotuners_pick(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.8)
    original = original_autotuner(engine, budget)
    assert original.best is not None
    out = run_study(engine, budget, in_memory_study("tpe", 3), 14, starts=(original.best.params,))
    after = len(Space.of(engine, budget_bytes=budget.bytes).starts())  # the defaults, ...
    picked = PlanParams.from_dict(out.study.trials[after].user_attrs["plan_params"])
    assert engine.evaluate(picked).plan == original.best.plan
    assert out.best is not None and out.best.step_seconds <= original.best.step_seconds


@pytest.mark.tf
def test_warm_starts_add_the_autotuners_pick_on_the_step_with_order_edges(engine) -> None:  # type: ignore[no-untyped-def]
    # a budget where the original search finds a plan on the step with its order edges (with
    # no trigger on what Grappler fuses or regroups, from 80 % of the way: docs/method.md)
    budget = budget_at(engine, 0.8)
    picked, ordered = warm_starts(engine, budget)
    assert picked == original_autotuner(engine, budget).shown.params
    assert ordered.serialize and not picked.serialize
    serialized = engine.serialized()
    assert serialized is not engine and serialized.edges
    assert original_autotuner(serialized, budget).best is not None
    # the original search, run on the step with its order edges
    assert replace(ordered, serialize=False) == original_autotuner(serialized, budget).shown.params
    # it fits by the original's memory-only simulation (copies instant), as the original's does
    assert engine.evaluate(ordered, timed=False).peak_bytes <= budget.bytes


def test_a_cost_model_that_gives_no_time_leaves_the_time_model_off() -> None:
    from simulator import get_preset
    from simulator.engine import Engine
    from tests.simulator.builders import training_chain

    g = training_chain()
    preset = get_preset("v100-16gb-nvlink2")
    engine = Engine.build(g, device=preset, cost={n: 0.0 for n in g.ops})
    ev = engine.evaluate(PlanParams())
    assert engine.timeline is None and ev.step_seconds is None and ev.overhead is None


def test_budget_rejects_a_host_limit_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="host memory"):
        Budget(1 << 30, 0.9, 0)


@pytest.mark.tf
def test_a_host_limit_makes_plans_that_swap_too_much_infeasible(engine) -> None:  # type: ignore[no-untyped-def]
    # the least-memory plan fits the device, but keeps more on the host than allowed
    least = engine.evaluate(PlanParams(ub=1, sync_out=True))
    top = engine.evaluate(PlanParams(n_tensors=0)).peak_bytes
    budget = Budget((least.peak_bytes + top) // 2, 1.0)
    host = least.host_peak_bytes // 2
    limited = Budget(budget.device_bytes, 1.0, host)
    assert budget.admits(least) and not limited.admits(least)
    assert limited.limit(least) == "host memory"
    out = run_study(engine, limited, in_memory_study("tpe", 3), 30)
    assert out.best is not None, "some plan swaps little enough to fit both"
    assert out.best.peak_bytes <= limited.bytes and out.best.host_peak_bytes <= host
    for t in out.study.trials:
        feasible = t.user_attrs["host_peak_bytes"] <= host
        feasible = feasible and t.user_attrs["peak_bytes"] <= limited.bytes
        assert (max(t.user_attrs["constraint"]) <= 0) == feasible
    unlimited = run_study(engine, budget, in_memory_study("tpe", 3), 30)
    assert unlimited.best is not None and unlimited.best.host_peak_bytes > 0


@pytest.mark.tf
def test_ours_moves_from_its_best_plan_one_axis_at_a_time(engine) -> None:  # type: ignore[no-untyped-def]
    budget = budget_at(engine, 0.5)
    out = run_study(engine, budget, in_memory_study("tpe", 5), 30)
    trials = out.study.trials
    space = Space.of(engine, budget_bytes=budget.bytes)
    moves = [t for t in trials[len(space.starts()) :] if t.system_attrs.get("fixed_params")]
    assert moves and all(t.number >= 30 * REFINE_AFTER for t in moves)
    for t in moves:  # a neighbour of a plan that fit before it, or past two such plans
        earlier = [e for e in trials[: t.number] if max(e.user_attrs["constraint"]) <= 0]
        near = [space.neighbours(e.params, e.user_attrs["swapped_tensors"]) for e in earlier]
        past = [space.beyond(a.params, b.params) for a in trials[: t.number] for b in earlier]
        assert any(t.params in n for n in near) or t.params in past, t.params


def test_a_move_that_changed_nothing_leads_two_moves_on_along_its_axis() -> None:
    space = Space(candidates=200, levels=300, budget_bytes=1 << 30)
    base = {"n_tensors": 200, "lb": 1, "ub": 1, "threshold": 1, "sync_out": True,
            "sync_lag": 16, "recompute": "cheap", "recompute_heavy": 0.0,
            "backward_swaps": True}  # fmt: skip
    assert space.beyond(base, {**base, "threshold": 2}) == {**base, "threshold": 8}
    assert space.beyond(base, {**base, "sync_lag": 8}) == {**base, "sync_lag": 2}
    assert space.beyond(base, {**base, "recompute_heavy": 0.25}) == {**base, "recompute_heavy": 1.0}
    assert space.beyond(base, {**base, "ub": 256}) == {**base, "ub": 300}  # the range ends
    assert space.beyond(base, {**base, "ub": 300}) is None
    assert space.beyond(base, {**base, "backward_swaps": False}) is None  # a flip has no "on"
    assert space.beyond(base, {**base, "ub": 2, "threshold": 2}) is None  # two axes
    fewer = {k: v for k, v in base.items() if k != "sync_lag"}  # a parameter drawn in one only
    assert space.beyond(base, {**fewer, "threshold": 2}) is None


@pytest.mark.tf
def test_tpe_alone_finds_a_fitting_plan_without_warm_starts(engine) -> None:  # type: ignore[no-untyped-def]
    # the warm starts enqueue the least-memory plan, so a search that only replays them would
    # pass the other tests; here TPE must find a fitting plan by itself
    budget = budget_at(engine, 0.5)
    study = in_memory_study("tpe", 11)
    out = run_study(engine, budget, study, 40, warm_start=False)
    assert not any(t.system_attrs.get("fixed_params") for t in out.study.trials)
    assert out.best is not None and out.best.peak_bytes <= budget.bytes
    first_fit = next(
        i for i, t in enumerate(out.study.trials) if max(t.user_attrs["constraint"]) <= 0
    )
    assert first_fit < 40


def test_the_space_is_the_parameter_table() -> None:
    from autotune.search.space import MOVES
    from simulator.params import PARAMS

    drawn = [p for p in PARAMS if p.draw is not None]
    assert set(MOVES) == {p.name for p in drawn if p.draw and p.draw.move}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    space = Space(candidates=20, levels=300, budget_bytes=1 << 30, limit_bytes=1 << 30)
    for _ in range(30):  # each drawn parameter is a trial's, with the table's range
        trial = study.ask()
        plan = space.suggest(trial)
        for name, dist in trial.distributions.items():
            if isinstance(dist, optuna.distributions.IntDistribution):
                row = next(p for p in drawn if p.name == name)
                assert dist.log == row.draw.log and dist.high in (300, 20, 8)  # type: ignore[union-attr]
        assert plan == space.suggest(optuna.trial.FixedTrial(space.of_params(plan)))
