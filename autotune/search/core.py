"""Search the swap parameters: Optuna with the budget as a constraint, and the baselines.

A trial proposes `n_tensors`, `lb`, `ub`, `threshold` (how far a reader must lie to swap),
`groupby` (fusion distance of swap-ins), the trigger strategy and whether swap-outs are
synchronized (`sync_out`, which keeps the forward pass from outrunning the link) and how many
levels the forward pass may run ahead of a swap-out then (`sync_lag`), whether
order edges reorder the backward pass (`serialize`: not the original tool's, so its baselines
never use it; random search draws it from the same space), and, unless the run fixes it
(`recompute`: "none" or "cheap" instead of the default "search"), whether cheap element-wise
tensors are recomputed instead of swapped and how long their chains may be (the recomputes that
hold bytes at a peak over the budget are then swapped instead, `PlanParams.recompute_limit`),
and whether swap-ins
are moved earlier where the memory has room (`prefetch`, with the share of the budget the live
bytes may then reach, `simulator.prefetch`); the engine derives the plan and simulates it.
"Predicted peak <= budget" is an Optuna constraint and the predicted step time the objective (or
peak and time as two objectives, Pareto front kept). The study is warm-started with the original
tool's defaults and with what its auto-tuner picks, so it can only improve on them, and with the
plan that saves the most memory (with and without recomputes), so that a budget that can be met
is met early.

The baselines run in the same engine against the same budget: no swapping, recompute only
(checkpointing without swapping, as `tf.recompute_grad` does, here of cheap element-wise chains
of up to `RECOMPUTE_MAX_OPS` ops), the original tool's defaults, the original tool's
auto-tuner (three one-dimensional binary searches on a memory-only simulation, see
docs/method.md), and random search with as many trials.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from simulator.derive import (
    LEAST_MEMORY,
    RECOMPUTE_MAX_OPS,
    RECOMPUTE_MODES,
    TRIGGER_STRATEGIES,
    PlanParams,
)
from simulator.engine import Engine, Evaluation
from simulator.errors import UserError

__all__ = [
    "DEFAULT_SAFETY_RATIO",
    "RECOMPUTE_CHOICES",
    "RECOMPUTE_ONLY",
    "Budget",
    "Outcome",
    "Space",
    "random_search",
    "run_study",
    "single_plan",
]

#: Budget = device memory x this ratio. Measured against the CPU allocator (3 fresh processes,
#: results/simulator_accuracy.md), the simulator's error on steps that peak at 0.5 GiB or more
#: (ResNet-50) stayed within 2.5 % of the median over three regenerations, but single processes
#: spread more in the fifth: ResNet-50 at batch 16 measured up to 8.0 % above the prediction in
#: one process (TensorFlow's executor order, and with it the peak, varies between processes);
#: in the sixth (prediction in the executor's order, CPU without oneDNN) up to 6.4 % above; in
#: the seventh (an AMD EPYC, another job running beside it) ResNet-50 at batch 8 measured 8.9 %
#: above in one process (1.125 GB against 1.033 predicted; the other two within 0.6 %).
#: 0.91 covers every single process measured. Smaller steps err more (up to -20 % at a few MiB,
#: where the CPU allocator's 2 MiB region growth dominates) but are not what a GPU budget is
#: about. A test re-derives the bound from the committed results.
DEFAULT_SAFETY_RATIO = 0.91


@dataclass(frozen=True)
class Budget:
    """The device memory the user named and the share of it a predicted peak may use, and
    the host memory swapped tensors may take (None: no limit)."""

    device_bytes: int
    ratio: float = DEFAULT_SAFETY_RATIO
    host_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.device_bytes <= 0:
            raise UserError(f"device memory must be positive, got {self.device_bytes} B")
        if not 0 < self.ratio <= 1:
            raise UserError(f"safety ratio must be in (0, 1], got {self.ratio}")
        if self.host_bytes is not None and self.host_bytes <= 0:
            raise UserError(f"host memory must be positive, got {self.host_bytes} B")

    @property
    def bytes(self) -> int:
        return int(self.device_bytes * self.ratio)

    def excess(self, ev: Evaluation) -> tuple[float, float]:
        """Bytes by which `ev` exceeds the device budget and the host limit (<= 0: within)."""
        host = -1.0 if self.host_bytes is None else float(ev.host_peak_bytes - self.host_bytes)
        return float(ev.peak_bytes - self.bytes), host

    def admits(self, ev: Evaluation) -> bool:
        """True when `ev`'s predicted peaks fit both the device budget and the host limit."""
        return max(self.excess(ev)) <= 0

    def limit(self, ev: Evaluation) -> str:
        """What keeps `ev` from fitting: 'device memory', 'host memory', both, or ''."""
        over = [w for w, x in zip(("device memory", "host memory"), self.excess(ev)) if x > 0]
        return " and ".join(over)


#: The plan that saves the most memory, with order edges and backward tensors swapped too: ours'
#: second warm start.
LEAST_MEMORY_ORDERED = replace(LEAST_MEMORY, serialize=True, backward_swaps=True)
#: The recompute-only baseline, checkpointing as `tf.recompute_grad` does: no swapping, every
#: chain of up to RECOMPUTE_MAX_OPS pure ops recomputed, convolutions too whatever they cost
#: (with a time model to weigh them by; else cheap chains only).
RECOMPUTE_ONLY = PlanParams(
    n_tensors=0, recompute="cheap", recompute_ops=RECOMPUTE_MAX_OPS, recompute_heavy=1e6
)
#: The range of the share of the budget prefetched swap-ins may fill (of the live bytes: the
#: allocator's peak is higher by its fragmentation)
PREFETCH_SHARES = (0.7, 1.0)
#: The last warm start lets the forward pass run this share of the levels ahead of the link
SYNC_LAG_SHARE = 64
#: The shares of the transfer time a chain through convolutions or matrix products may cost
#: (`PlanParams.recompute_heavy`; 0: never), searched with cheap recomputes and a time model
RECOMPUTE_HEAVY = (0.0, 0.25, 1.0)
#: What a run lets the search do with recomputes: search whether (the default), or fix a mode.
RECOMPUTE_CHOICES = ("search", *RECOMPUTE_MODES)


def check_recompute(recompute: str) -> str:
    """`recompute` if it is one of RECOMPUTE_CHOICES, else a UserError."""
    if recompute not in RECOMPUTE_CHOICES:
        raise UserError(f"recompute must be one of {', '.join(RECOMPUTE_CHOICES)}")
    return recompute


@dataclass(frozen=True)
class Space:
    """The parameter ranges of one graph: its forward swap candidates (all of them, and only
    then, may bring the backward ones: `PlanParams.backward_swaps`) and its number of levels,
    and whether recomputes are searched ("search") or fixed ("none", "cheap")."""

    candidates: int
    levels: int
    recompute: str = "search"
    #: the budget prefetching keeps the live bytes under a share of (0: no prefetch searched)
    budget_bytes: int = 0
    #: the budget recompute plans are guarded at (`PlanParams.recompute_limit`; 0: never)
    limit_bytes: int = 0

    def __post_init__(self) -> None:
        check_recompute(self.recompute)

    @classmethod
    def of(cls, engine: Engine, recompute: str = "search", budget_bytes: int = 0) -> Space:
        n = max(1, sum(not c.made_in_backward for c in engine.context.candidates))
        timed = engine.timeline is not None and engine.device is not None
        levels = max(2, engine.order.n_levels)
        return cls(n, levels, recompute, budget_bytes if timed else 0, budget_bytes)

    def suggest(self, trial: Any) -> PlanParams:
        """The parameters a trial proposes; `lb` and `ub` are sampled alike and sorted; no
        swapped tensor (`n_tensors` 0) only when recomputes may free memory instead."""
        n = trial.suggest_int("n_tensors", self._fewest(), self.candidates)
        lb = trial.suggest_int("lb", 1, self.levels, log=True)
        ub = trial.suggest_int("ub", 1, self.levels, log=True)
        return PlanParams(
            n_tensors=-1 if n == self.candidates else n,
            lb=min(lb, ub),
            ub=max(lb, ub),
            threshold=trial.suggest_int("threshold", 1, self.levels, log=True),
            groupby=trial.suggest_int("groupby", 0, self.levels),
            trigger=trial.suggest_categorical("trigger", list(TRIGGER_STRATEGIES)),
            **self._suggest_sync(trial),
            serialize=trial.suggest_categorical("serialize", [False, True]),
            **self._suggest_prefetch(trial),
            **self._suggest_recompute(trial),
            **self._suggest_backward(trial, n),
        )

    def _suggest_backward(self, trial: Any, n: int) -> dict[str, Any]:
        """Backward swaps only with every forward candidate, and then only of the tensors
        live where the plan without them passes the budget (`PlanParams.backward_limit`)."""
        if n < self.candidates or not trial.suggest_categorical("backward_swaps", [False, True]):
            return {}
        return {"backward_swaps": True, "backward_limit": self.limit_bytes}

    def _suggest_sync(self, trial: Any) -> dict[str, Any]:
        """`sync_out` and, with it, its lag in levels (log-sampled; 1 stands for 0, the
        readers' own wait, which is what a lag of one level nearly is)."""
        if not trial.suggest_categorical("sync_out", [False, True]):
            return {"sync_out": False}
        lag = trial.suggest_int("sync_lag", 1, self.levels, log=True)
        return {"sync_out": True, "sync_lag": lag if lag > 1 else 0}

    def _suggest_prefetch(self, trial: Any) -> dict[str, Any]:
        """`prefetch_bytes` and, with `sync_out` (drawn before), `postpone_waits`: the later
        frees may fragment the heap more than the live bytes it plans with can show."""
        if not self.budget_bytes or not trial.suggest_categorical("prefetch", [False, True]):
            return {}
        share = trial.suggest_float("prefetch_share", PREFETCH_SHARES[0], PREFETCH_SHARES[1])
        out: dict[str, Any] = {"prefetch_bytes": int(self.budget_bytes * share)}
        if trial.params.get("sync_out"):
            out["postpone_waits"] = trial.suggest_categorical("postpone_waits", [False, True])
        return out

    def _fewest(self) -> int:
        return 1 if self.recompute == "none" else 0

    def _suggest_recompute(self, trial: Any) -> dict[str, Any]:
        if self.recompute == "none":
            return {}
        mode = self.recompute
        if mode == "search":
            mode = trial.suggest_categorical("recompute", list(RECOMPUTE_MODES))
        ops = trial.suggest_int("recompute_ops", 1, RECOMPUTE_MAX_OPS)
        limit = self.limit_bytes if mode == "cheap" else 0
        out = {"recompute": mode, "recompute_ops": ops, "recompute_limit": limit}
        if mode == "cheap" and self.budget_bytes:
            out["recompute_heavy"] = trial.suggest_categorical("recompute_heavy", RECOMPUTE_HEAVY)
        return out

    def of_params(self, p: PlanParams) -> dict[str, Any]:
        """Trial parameters that give `p` (sizes clamped to this graph's ranges)."""
        fewest = self._fewest()
        n = self.candidates if p.n_tensors == -1 else min(max(p.n_tensors, fewest), self.candidates)
        return {
            "n_tensors": n,
            "lb": min(p.lb, self.levels),
            "ub": min(p.ub, self.levels),
            "threshold": min(p.threshold, self.levels),
            "groupby": min(p.groupby, self.levels),
            "trigger": p.trigger,
            "sync_out": p.sync_out,
            **({"sync_lag": min(max(p.sync_lag, 1), self.levels)} if p.sync_out else {}),
            "serialize": p.serialize,
            "recompute": p.recompute if self.recompute == "search" else self.recompute,
            "recompute_ops": min(p.recompute_ops, RECOMPUTE_MAX_OPS),
            **self._heavy_params(p),
            **self._prefetch_params(p),
            **({"backward_swaps": p.backward_swaps} if n == self.candidates else {}),
        }

    def _heavy_params(self, p: PlanParams) -> dict[str, Any]:
        """`recompute_heavy` as the nearest searched share, where the search draws it."""
        mode = p.recompute if self.recompute == "search" else self.recompute
        if not self.budget_bytes or mode != "cheap":
            return {}
        return {"recompute_heavy": min(RECOMPUTE_HEAVY, key=lambda x: abs(x - p.recompute_heavy))}

    def _prefetch_params(self, p: PlanParams) -> dict[str, Any]:
        if not self.budget_bytes:
            return {}
        if not p.prefetch_bytes:
            return {"prefetch": False}
        low, high = PREFETCH_SHARES
        share = min(max(p.prefetch_bytes / self.budget_bytes, low), high)
        postpone = {"postpone_waits": p.postpone_waits} if p.sync_out else {}
        return {"prefetch": True, "prefetch_share": share, **postpone}

    def least_memory(self) -> dict[str, Any]:
        """The corner that saves the most memory: every candidate, synchronized swap-outs,
        swap-ins just before their readers, order edges; if anything fits, this usually does."""
        return self.of_params(LEAST_MEMORY_ORDERED)

    def starts(self) -> list[dict[str, Any]]:
        """A new study's first trials: the original defaults, the least-memory plan (backward
        tensors swapped too) and, when recomputes are searched, the least-memory plan with them
        and recompute only; with a time model, last, the least-memory plan without backward
        swaps (with recomputes unless the run forbids them) with its swap-ins as early as the
        budget leaves room for (its swap-outs waited for where their copies should end), that
        plan with the backward swaps the budget needs, and both again with the forward pass let
        run 1/SYNC_LAG_SHARE of the levels ahead of its swap-outs instead, and the two without
        backward swaps again with their waits left at the readers or the lag, and the two with
        backward swaps again recomputing through convolutions and matrix products wherever
        that costs less than the transfers it saves, by chains as long as the search allows
        (a batch norm, its activation and the next convolution are 7 ops), unless the run
        forbids recomputes."""
        out = [self.defaults(), self.least_memory()]
        if self.recompute == "search":
            cheap = replace(
                LEAST_MEMORY_ORDERED, recompute="cheap", recompute_ops=RECOMPUTE_MAX_OPS
            )
            out += [self.of_params(cheap), self.of_params(RECOMPUTE_ONLY)]
        if self.budget_bytes:
            mode = "none" if self.recompute == "none" else "cheap"
            early = replace(
                LEAST_MEMORY_ORDERED,
                recompute=mode,
                prefetch_bytes=self.budget_bytes,
                backward_swaps=False,
            )
            lagged = replace(early, sync_lag=max(2, self.levels // SYNC_LAG_SHARE))
            ahead = [replace(p, backward_swaps=b) for p in (early, lagged) for b in (False, True)]
            ahead += [replace(p, postpone_waits=False) for p in (early, lagged)]
            if mode == "cheap":
                ahead += [
                    replace(
                        p,
                        backward_swaps=True,
                        recompute_heavy=RECOMPUTE_HEAVY[-1],
                        recompute_ops=RECOMPUTE_MAX_OPS,
                    )
                    for p in (early, lagged)
                ]
            out += [self.of_params(p) for p in ahead]
        return out

    def neighbours(
        self, params: dict[str, Any], swapped: int | None = None
    ) -> list[dict[str, Any]]:
        """Trial parameters one step from `params` along one axis each: fewer or more swapped
        tensors (counted from `swapped`, the tensors its plan swapped, when given: `n_tensors`
        caps the swaps, and recomputes and the threshold leave fewer), a swap-in window,
        fusion distance, threshold and forward lag halved or doubled, a recompute chain one op
        shorter or longer, a prefetch share 0.05 apart, backward swaps on or off."""
        out: list[dict[str, Any]] = []

        def move(key: str, value: Any, low: Any, high: Any) -> None:
            value = min(max(value, low), high)
            if key in params and value != params[key]:
                out.append({**params, key: value})

        n, top = params.get("n_tensors", 0), self.candidates
        n = n if swapped is None else min(n, swapped)
        for factor in (0.8, 0.9, 0.97, 1.03):
            move("n_tensors", round(n * factor), self._fewest(), top)
        for key in ("ub", "threshold", "sync_lag"):
            x = params.get(key, 1)
            move(key, x * 2, 1, self.levels)
            move(key, x // 2, 1, self.levels)
        g = params.get("groupby", 0)
        for x in (g // 2, max(2 * g, 2)):
            move("groupby", x, 0, self.levels)
        ops = params.get("recompute_ops", 1)
        for x in (ops - 1, ops + 1):
            move("recompute_ops", x, 1, RECOMPUTE_MAX_OPS)
        share = params.get("prefetch_share", 0.0)
        for x in (round(share - 0.05, 4), round(share + 0.05, 4)):
            move("prefetch_share", x, *PREFETCH_SHARES)
        for key in ("backward_swaps", "postpone_waits"):
            if key in params:
                out.append({**params, key: not params[key]})
        if "recompute_heavy" in params:
            i = RECOMPUTE_HEAVY.index(params["recompute_heavy"])
            for j in (i - 1, i + 1):
                move(
                    "recompute_heavy",
                    RECOMPUTE_HEAVY[min(max(j, 0), len(RECOMPUTE_HEAVY) - 1)],
                    0.0,
                    1.0,
                )
        if params.get("ub", 1) < params.get("lb", 1):  # ub halved under lb: lb follows
            out = [{**q, "lb": min(q["lb"], q["ub"])} for q in out]
        return [self._with_backward(q) for q in out]

    def _with_backward(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with `backward_swaps` where every candidate is swapped, and only there."""
        if params.get("n_tensors") != self.candidates:
            return {k: v for k, v in params.items() if k != "backward_swaps"}
        return {"backward_swaps": False, **params}

    def defaults(self) -> dict[str, Any]:
        """The original tool's defaults as trial parameters (ub=10000 reaches every level)."""
        return self.of_params(PlanParams())


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


def _better(a: Evaluation | None, b: Evaluation) -> bool:
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


def _record(trial: Any, ev: Evaluation, budget: Budget) -> None:
    over, host_over = budget.excess(ev)
    trial.set_constraint("peak_over_budget_bytes", over)
    trial.set_constraint("host_peak_over_limit_bytes", host_over)
    trial.set_user_attr("constraint", [over, host_over])
    trial.set_user_attr("peak_bytes", ev.peak_bytes)
    trial.set_user_attr("host_peak_bytes", ev.host_peak_bytes)
    trial.set_user_attr("step_seconds", ev.step_seconds)
    trial.set_user_attr("overhead", ev.overhead)
    trial.set_user_attr("swapped_tensors", len(ev.plan.swaps))
    trial.set_user_attr("plan_params", ev.params.to_dict())


def _constraints(trial: Any) -> list[float]:
    return list(trial.user_attrs.get("constraint", [1.0]))


#: Set by the command line's Ctrl-C handler. Python drops a KeyboardInterrupt that lands in a
#: garbage-collector callback (SQLAlchemy registers some; the command line keeps it from being
#: printed), and a study then runs on; each trial raises it again at its start, so an
#: interrupted study always stops.
INTERRUPTED = threading.Event()


def make_objective(
    engine: Engine, budget: Budget, objectives: int = 1, recompute: str = "search"
) -> Callable[[Any], float | tuple[float, float]]:
    """The Optuna objective: propose, derive, simulate; record the constraint on the trial."""
    space = Space.of(engine, recompute, budget.bytes)

    def objective(trial: Any) -> float | tuple[float, float]:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        ev = engine.evaluate(space.suggest(trial))
        _record(trial, ev, budget)
        seconds = ev.step_seconds if ev.step_seconds is not None else float(ev.peak_bytes)
        return (float(ev.peak_bytes), seconds) if objectives == 2 else seconds

    return objective


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


def best_feasible(engine: Engine, study: Any) -> Evaluation | None:
    """Re-evaluate the fastest trial that fits (plans are cheap to derive again, exactly)."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    ok = [t for t in done if max(_constraints(t)) <= 0]
    if not ok:
        return None
    best = min(ok, key=lambda t: (t.user_attrs["step_seconds"] or 0, t.user_attrs["peak_bytes"]))
    return engine.evaluate(PlanParams.from_dict(best.user_attrs["plan_params"]))


#: ours spends the trials after this share of its budget on local moves around its best plan
REFINE_AFTER = 1 / 3
#: it queues this many moves at a time, so that it moves on from a better plan soon
REFINE_BATCH = 4


@dataclass
class Refine:
    """An Optuna callback: once `after` trials have finished and no trial is queued, queue the
    untried `Space.neighbours` of the fastest plan that fits (a pattern search: where the
    budget leaves a small feasible region, as at the largest batches, TPE rarely samples it).
    It reads everything from the study, so a resumed study refines where it stopped."""

    space: Space
    after: int
    total: int  # the study's trials: no more are queued than are left to run

    def __call__(self, study: Any, trial: Any) -> None:
        import optuna

        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        waiting = optuna.trial.TrialState.WAITING
        running = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)
        left = self.total - len(done) - running  # other workers' trials finish too
        if len(done) < self.after or left <= 0 or any(t.state == waiting for t in trials):
            return
        fits = [t for t in done if max(_constraints(t)) <= 0]
        if not fits:
            return
        best = min(fits, key=lambda t: (t.values[0], t.user_attrs["peak_bytes"]))
        seen = {_key(t.params) for t in trials}
        swapped = best.user_attrs.get("swapped_tensors")
        untried = {_key(p): p for p in self.space.neighbours(best.params, swapped)}
        for params in [p for k, p in untried.items() if k not in seen][: min(left, REFINE_BATCH)]:
            study.enqueue_trial(params)


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
) -> Outcome:
    """Run `study` until it holds `trials` finished trials (resuming one that has some). A new
    study with `warm_start` first tries `Space.starts` and `starts` (e.g. what the original
    auto-tuner chose), so it can only improve on them. `recompute` is as in `Space`."""
    import optuna
    from optuna.study import MaxTrialsCallback

    start = time.perf_counter()
    complete = (optuna.trial.TrialState.COMPLETE,)
    if warm_start and not study.trials:
        space = Space.of(engine, recompute, budget.bytes)
        queued = {_key(p): p for p in (*space.starts(), *map(space.of_params, starts))}
        for params in list(queued.values())[:trials]:  # none left waiting past the budget
            study.enqueue_trial(params)
    left = trials - len(study.get_trials(deepcopy=False, states=complete))
    refine = []
    if warm_start and objectives == 1:
        space = Space.of(engine, recompute, budget.bytes)
        refine = [Refine(space, int(trials * REFINE_AFTER), trials)]
    if left > 0:
        with quiet_optuna():
            study.optimize(
                make_objective(engine, budget, objectives, recompute),
                n_trials=left,
                callbacks=[MaxTrialsCallback(trials, states=complete), *refine, *(callbacks or [])],
            )
    best = best_feasible(engine, study)
    nearest = None if best else lowest_peak(engine, study)
    name = "ours" if warm_start else "random search"
    return Outcome(name, best, max(left, 0), time.perf_counter() - start, study, nearest)


def lowest_peak(engine: Engine, study: Any) -> Evaluation | None:
    """The trial nearest to fitting: the lowest predicted peak (re-evaluated)."""
    done = [t for t in study.trials if "peak_bytes" in t.user_attrs]
    if not done:
        return None
    low = min(done, key=lambda t: t.user_attrs["peak_bytes"])
    return engine.evaluate(PlanParams.from_dict(low.user_attrs["plan_params"]))


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
    if trial.state.name == "COMPLETE" and max(_constraints(trial)) <= 0:
        study.stop()
