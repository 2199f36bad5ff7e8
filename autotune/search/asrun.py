"""A tuned plan confirmed on the graph TensorFlow runs.

The search simulates plans on the captured graph. Where Grappler regroups a sum or a product
that reads a swap-in (`autotune.run.predict.reads_regrouped`), the graph that runs can hold
more: a transformer's GELU gradient, hoisted out of its two terms, keeps a swapped-in input a
dozen ops longer. There the best plan is also simulated as TensorFlow runs it
(`as_run_peak`); if that passes the budget, the study's next fastest plans that fit, and the
one that fits with the lowest peak, are tried the same way, `AS_RUN_TRIES` in all. Each try
rewrites the step and has Grappler optimize it: about a second for a small model.
"""

from __future__ import annotations

from typing import Any

from autotune.search.budget import Budget
from rewriter.capture import Captured
from simulator.derive import PlanParams
from simulator.engine import Engine, Evaluation

__all__ = ["AS_RUN_TRIES", "confirmed"]

#: at most this many of a study's plans that fit are simulated as TensorFlow runs them
AS_RUN_TRIES = 4


def confirmed(
    captured: Captured, engine: Engine, budget: Budget, study: Any, best: Evaluation
) -> tuple[Evaluation, int | None]:
    """`best`, or the fastest of the study's plans that fit whose graph as TensorFlow runs it
    fits too; with that plan's peak as run (None where the plan's own simulation holds: it
    reads no regrouped product, or its graph as run could not be captured). When none of
    those tried fits as run, `best` with its peak as run."""
    from autotune.run.predict import reads_regrouped

    if not reads_regrouped(captured.graph, best.plan):
        return best, None
    best_peak = as_run(captured, best)
    if best_peak is None or best_peak <= budget.bytes:  # uncapturable: its own simulation holds
        return best, best_peak
    for params in _others(study, best.params):
        ev = engine.evaluate(params)  # derived again only when its turn comes
        if not reads_regrouped(captured.graph, ev.plan):
            return ev, None
        peak = as_run(captured, ev)
        if peak is not None and peak <= budget.bytes:
            return ev, peak
    return best, best_peak


def as_run(captured: Captured, ev: Evaluation) -> int | None:
    """The peak of `ev`'s plan simulated on the graph TensorFlow runs (None: not capturable)."""
    from autotune.run.measure import current_device
    from autotune.run.predict import as_run_peak
    from autotune.run.verify import rewrite_captured

    tuned = rewrite_captured(captured, ev.plan, pin_order=True)
    return as_run_peak(captured, tuned, current_device())


def _others(study: Any, best: PlanParams) -> list[PlanParams]:
    """The parameters of the study's next fastest trials that fit, and of its trial that fits
    with the lowest peak (the likeliest to fit as run too): with `best`, `AS_RUN_TRIES`."""
    import optuna

    from autotune.search.objective import constraints

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ok = [t for t in done if max(constraints(t)) <= 0]
    ok.sort(key=lambda t: (t.user_attrs["step_seconds"] or 0, t.user_attrs["peak_bytes"]))
    params = [PlanParams.from_dict(t.user_attrs["plan_params"]) for t in ok]
    fastest = [p for p in dict.fromkeys(params) if p != best][: AS_RUN_TRIES - 2]
    low = min(ok, key=lambda t: t.user_attrs["peak_bytes"], default=None)
    lowest = [PlanParams.from_dict(low.user_attrs["plan_params"])] if low is not None else []
    return [p for p in dict.fromkeys([*fastest, *lowest]) if p != best]
