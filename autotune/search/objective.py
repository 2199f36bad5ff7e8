"""The objective of a trial (derive the plan, simulate it, record the budget as a constraint) and
what a method's search found (`Outcome`)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.search.budget import Budget
from autotune.search.helpers import Figures, Helpers, upcoming
from autotune.search.space import Space
from simulator.derive import PlanParams
from simulator.engine import Engine, Evaluation

__all__ = [
    "INTERRUPTED",
    "STUDY_RUNNING",
    "better",
    "constraints",
    "Outcome",
    "best_feasible",
    "lowest_peak",
    "make_objective",
    "single_plan",
]


@dataclass
class Outcome:
    """What one method found: its best evaluation that fits (or None), else the one nearest
    to fitting (lowest peak), and what the search cost."""

    method: str
    best: Evaluation | None
    evaluations: int
    seconds: float
    study: Any = None
    nearest: Evaluation | None = None

    @property
    def fits(self) -> bool:
        return self.best is not None

    @property
    def shown(self) -> Evaluation | None:
        """What the method offers: its best plan that fits, else the one nearest to fitting."""
        return self.best or self.nearest

    def starts(self) -> tuple[PlanParams, ...]:
        """Its parameters as a warm start for another search (none if it tried nothing)."""
        return (self.shown.params,) if self.shown is not None else ()

    def summary(self) -> dict[str, Any]:
        b = self.shown
        return {
            "method": self.method,
            "fits": self.fits,
            "params": b.params.to_dict() if b else None,
            "peak_bytes": b.peak_bytes if b else None,
            "step_seconds": b.step_seconds if b else None,
            "overhead": b.overhead if b else None,
            "evaluations": self.evaluations,
            "seconds": self.seconds,
        }


def better(a: Evaluation | None, b: Evaluation) -> bool:
    """True when `b` beats `a`: faster, then lower peak."""
    if a is None:
        return True
    key_a = (a.step_seconds or 0.0, a.peak_bytes)
    return (b.step_seconds or 0.0, b.peak_bytes) < key_a


def single_plan(engine: Engine, params: PlanParams, budget: Budget, method: str) -> Outcome:
    """One fixed set of parameters (no swapping, or the original defaults) judged alike."""
    start = time.perf_counter()
    ev = engine.evaluate(params)
    fits = budget.admits(ev)
    return Outcome(method, ev if fits else None, 1, time.perf_counter() - start, None, ev)


def _record(trial: Any, ev: Figures, budget: Budget) -> None:
    over, host_over = budget.excess(ev)
    trial.set_constraint("peak_over_budget_bytes", over)
    trial.set_constraint("host_peak_over_limit_bytes", host_over)
    trial.set_user_attr("constraint", [over, host_over])
    trial.set_user_attr("peak_bytes", ev.peak_bytes)
    trial.set_user_attr("host_peak_bytes", ev.host_peak_bytes)
    trial.set_user_attr("step_seconds", ev.step_seconds)
    trial.set_user_attr("overhead", ev.overhead)
    trial.set_user_attr("swapped_tensors", ev.swapped_tensors)
    trial.set_user_attr("plan_params", ev.params.to_dict())


def constraints(trial: Any) -> list[float]:
    return list(trial.user_attrs.get("constraint", [1.0]))


#: Set by the command line's Ctrl-C handler. Python drops a KeyboardInterrupt that lands in a
#: garbage-collector callback (SQLAlchemy registers some; the command line keeps it from being
#: printed), and a study then runs on; each trial raises it again at its start, so an
#: interrupted study always stops.
INTERRUPTED = threading.Event()
#: Set while a study runs its trials: a Ctrl-C then only sets INTERRUPTED, and the next trial
#: stops the study. Raised at any point, a KeyboardInterrupt can land inside the database
#: driver's critical sections and leave a lock held: one run hung for minutes after a Ctrl-C
#: (test_interrupted_study_resumes_with_its_trials_kept, in CI).
STUDY_RUNNING = threading.Event()


def make_objective(
    engine: Engine,
    budget: Budget,
    objectives: int = 1,
    recompute: str = "search",
    helpers: Helpers | None = None,
) -> Callable[[Any], float | tuple[float, float]]:
    """The Optuna objective: propose, derive, simulate; record the constraint on the trial.
    With `helpers`, queued trials are evaluated ahead in other processes (the same figures);
    without, every trial is evaluated here."""
    space = Space.of(engine, recompute, budget.bytes)
    here = helpers or Helpers(engine, 0, 0)

    def objective(trial: Any) -> float | tuple[float, float]:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        ahead = functools.partial(upcoming, trial.study, space)
        ev = here.figures(space.suggest(trial), ahead, INTERRUPTED.is_set)
        _record(trial, ev, budget)
        seconds = ev.step_seconds if ev.step_seconds is not None else float(ev.peak_bytes)
        return (float(ev.peak_bytes), seconds) if objectives == 2 else seconds

    return objective


def best_feasible(engine: Engine, study: Any) -> Evaluation | None:
    """Re-evaluate the fastest trial that fits (plans are cheap to derive again, exactly)."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    ok = [t for t in done if max(constraints(t)) <= 0]
    if not ok:
        return None
    best = min(ok, key=lambda t: (t.user_attrs["step_seconds"] or 0, t.user_attrs["peak_bytes"]))
    return engine.evaluate(PlanParams.from_dict(best.user_attrs["plan_params"]))


def lowest_peak(engine: Engine, study: Any) -> Evaluation | None:
    """The trial nearest to fitting: the lowest predicted peak (re-evaluated)."""
    done = [t for t in study.trials if "peak_bytes" in t.user_attrs]
    if not done:
        return None
    low = min(done, key=lambda t: t.user_attrs["peak_bytes"])
    return engine.evaluate(PlanParams.from_dict(low.user_attrs["plan_params"]))
