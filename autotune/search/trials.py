"""Running a study: the seeded samplers, the refinement of the best plans found, in-memory
studies for the baselines, and random search."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from autotune.search.budget import Budget
from autotune.search.helpers import Helpers, helper_count
from autotune.search.objective import (
    STUDY_RUNNING,
    Outcome,
    best_feasible,
    constraints,
    lowest_peak,
    make_objective,
)
from autotune.search.space import Space, moved
from simulator.derive import PlanParams
from simulator.engine import Engine

__all__ = [
    "in_memory_study",
    "quiet_optuna",
    "random_search",
    "run_study",
    "sampler",
    "stop_when_fits",
]


def sampler(kind: str, seed: int, objectives: int = 1) -> Any:
    """A sampler seeded per trial: TPE for ours, uniform for random search.

    Its random state is set from `seed` and the trial's number before each trial, so a study
    proposes the same plans whether it is kept in memory or in a database, a resumed study
    does not repeat its first proposals, and workers sharing one study (the database numbers
    their trials) explore different points."""
    import optuna

    if kind == "random":
        return _trial_seeded(optuna.samplers.RandomSampler)(seed=seed)
    return _trial_seeded(optuna.samplers.TPESampler)(seed=seed, multivariate=objectives == 1)


@functools.cache
def _trial_seeded(base: type) -> type:
    """`base` (an Optuna sampler class) reseeded from its seed and the trial number."""

    class TrialSeeded(base):
        def __init__(self, *, seed: int, **options: Any) -> None:
            super().__init__(seed=seed, **options)
            self._base_seed = seed

        def before_trial(self, study: Any, trial: Any) -> None:
            _reseed(self, (self._base_seed * 1_000_003 + trial.number) % 2**32)
            super().before_trial(study, trial)

    TrialSeeded.__name__ = f"TrialSeeded{base.__name__}"
    return TrialSeeded


def _reseed(sampler: Any, seed: int) -> None:
    """Set the random state of an Optuna sampler and of the random sampler TPE falls back to."""
    sampler._rng.rng.seed(seed)
    inner = getattr(sampler, "_random_sampler", None)
    if inner is not None:
        inner._rng.rng.seed(seed ^ 0x5EED)


#: ours spends the trials after this share of its budget on local moves around its best plan
REFINE_AFTER = 1 / 3
#: it queues this many moves at a time, so that it moves on from a better plan soon
REFINE_BATCH = 4


@dataclass
class Refine:
    """An Optuna callback: once `after` trials have finished and no trial is queued, queue the
    untried `Space.neighbours` of the fastest plan that fits (a pattern search: where the
    budget leaves a small feasible region, as at the largest batches, TPE rarely samples it).
    First it goes on along the move that made that plan (a pattern move, `Space.beyond`);
    the moves that did no better from the last best come after the other neighbours
    (`_Walk`); last, it goes on past each neighbour that scored the same as the plan (a flat
    axis). Queued before the neighbours, those steps across plateaus took the trials that
    TPE's proposals used better on some steps (docs/method.md, "Search"). It reads everything
    from the study, so a resumed study refines where it stopped."""

    space: Space
    after: int
    total: int  # the study's trials: no more are queued than are left to run
    lock: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext  # see `run_study`

    def __call__(self, study: Any, trial: Any) -> None:
        with self.lock():
            self._queue(study)

    def _queue(self, study: Any) -> None:
        import optuna

        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        waiting = optuna.trial.TrialState.WAITING
        running = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)
        left = self.total - len(done) - running  # other workers' trials finish too
        if len(done) < self.after or left <= 0 or any(t.state == waiting for t in trials):
            return
        walk = _Walk(done)
        if walk.best is None:
            return
        best, seen = walk.best, {_key(t.params) for t in trials}
        on = [self.space.beyond(walk.before.params, best.params)] if walk.before else []
        near = self.space.neighbours(best.params, best.user_attrs.get("swapped_tensors"))
        near.sort(key=lambda p: moved(best.params, p) in walk.failed)  # stable: MOVES' order
        past = [self.space.beyond(best.params, t.params) for t in walk.ties]
        untried = {_key(p): p for p in [*on, *near, *past] if p is not None}
        for params in [p for k, p in untried.items() if k not in seen][: min(left, REFINE_BATCH)]:
            study.enqueue_trial(params)


class _Walk:
    """The pattern search's walk so far, read from the finished trials in their order: the
    best plan that fits (fastest, then lowest peak), the best before it, the trials that
    scored the same as it, and the moves whose last try from the best of its time did no
    better (or did not fit), which are queued after the other neighbours of the next best,
    as they likely fail again."""

    def __init__(self, done: list[Any]) -> None:
        self.best: Any = None
        self.before: Any = None
        last: dict[tuple[str, bool], bool] = {}
        fitting = []
        for t in sorted(done, key=lambda t: t.number):
            fits = max(constraints(t)) <= 0
            if fits:
                fitting.append(t)
            if self.best is not None and t.system_attrs.get("fixed_params"):
                move = moved(self.best.params, t.params)
                if move is not None:
                    last[move] = not fits or _score(t) >= _score(self.best)
            if fits and (self.best is None or _score(t) < _score(self.best)):
                self.before, self.best = self.best, t
        self.failed = {move for move, worse in last.items() if worse}
        self.ties = [t for t in fitting if t is not self.best and _score(t) == _score(self.best)]


def _score(trial: Any) -> tuple[float, int]:
    """What the pattern search ranks fitting trials by: time, then peak."""
    return trial.values[0], trial.user_attrs["peak_bytes"]


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def run_study(
    engine: Engine,
    budget: Budget,
    study: Any,
    trials: int,
    *,
    objectives: int = 1,
    warm_start: bool = True,
    starts: tuple[PlanParams, ...] = (),
    callbacks: list[Any] | None = None,
    recompute: str = "search",
    after_starts: int | None = None,
    lock: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Outcome:
    """Run `study` until it holds `trials` finished trials (resuming one that has some). A new
    study with `warm_start` first tries `Space.starts` and `starts` (e.g. what the original
    auto-tuner chose), so it can only improve on them. `recompute` is as in `Space`. With
    `after_starts`, a new study stops that many trials after its warm starts (a probe that
    only asks whether some plan fits, `stop_when_fits`, and none has). Workers that share the
    study queue trials holding `lock` (`autotune.search.studies.queue_lock`): each checks what
    is queued and queues more as one step, so none queues what another just did."""
    import optuna
    from optuna.study import MaxTrialsCallback

    start = time.perf_counter()
    complete = (optuna.trial.TrialState.COMPLETE,)
    space = Space.of(engine, recompute, budget.bytes)
    with lock():
        fresh = not study.trials
        if warm_start and fresh:
            queued = {_key(p): p for p in (*space.starts(), *map(space.of_params, starts))}
            for params in list(queued.values())[:trials]:  # none left waiting past the budget
                study.enqueue_trial(params)
    left = trials - len(study.get_trials(deepcopy=False, states=complete))
    if after_starts is not None and fresh:
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        left = min(left, len(waiting) + after_starts)
    refine = []
    if warm_start and objectives == 1:
        refine = [Refine(space, int(trials * REFINE_AFTER), trials, lock)]
    if left > 0:
        helpers = Helpers(engine, helper_count() if warm_start else 0, left)
        with quiet_optuna(), _trials_running(), helpers:
            study.optimize(
                make_objective(engine, budget, objectives, recompute, helpers),
                n_trials=left,
                callbacks=[MaxTrialsCallback(trials, states=complete), *refine, *(callbacks or [])],
            )
    best = best_feasible(engine, study)
    nearest = None if best else lowest_peak(engine, study)
    name = "ours" if warm_start else "random search"
    return Outcome(name, best, max(left, 0), time.perf_counter() - start, study, nearest)


@contextlib.contextmanager
def _trials_running() -> Iterator[None]:
    """Mark a study's optimize loop as running (`STUDY_RUNNING`), nested loops included."""
    nested = STUDY_RUNNING.is_set()
    STUDY_RUNNING.set()
    try:
        yield
    finally:
        if not nested:
            STUDY_RUNNING.clear()


def in_memory_study(kind: str, seed: int, objectives: int = 1) -> Any:
    """A fresh study kept in memory (for probes and baselines)."""
    import optuna

    directions: list[Any] = ["minimize"] * objectives
    with quiet_optuna():
        return optuna.create_study(directions=directions, sampler=sampler(kind, seed, objectives))


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's per-trial log lines off (the progress bar and the report show the trials)."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def random_search(
    engine: Engine,
    budget: Budget,
    trials: int,
    seed: int,
    callbacks: list[Any] | None = None,
    recompute: str = "search",
) -> Outcome:
    """Uniform random proposals from the same space, as many as ours had."""
    study = in_memory_study("random", seed)
    return run_study(
        engine, budget, study, trials, warm_start=False, callbacks=callbacks, recompute=recompute
    )


def stop_when_fits(study: Any, trial: Any) -> None:
    """An Optuna callback that stops the study at its first trial that fits the budget: enough
    to tell whether a batch fits (the seeded trials before it are the same as in a full run)."""
    if trial.state.name == "COMPLETE" and max(constraints(trial)) <= 0:
        study.stop()
