"""The largest batch each method fits.

On the engines of a step at any size (`autotune.search.families`), `largest_batches` searches the
batch size for each method: no swapping, recompute only, the original tool's defaults, its
auto-tuner, random search and ours, with tuning inside.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.search.aside import Aside, Beside
from autotune.search.baselines import (
    largest,
    original_autotuner,
    warm_starts,
)
from autotune.search.core import (
    LEAST_MEMORY_ORDERED,
    RECOMPUTE_ONLY,
    Budget,
    Outcome,
    Space,
    in_memory_study,
    random_search,
    run_study,
    single_plan,
    stop_when_fits,
)
from autotune.search.families import CAPTURE_BATCHES, CapturedSteps, StepFamily, Steps
from simulator.derive import PlanParams
from simulator.engine import Engine
from simulator.errors import UserError

__all__ = [
    "CAPTURE_BATCHES",
    "METHODS",
    "SWAPPING",
    "BatchSearch",
    "CapturedSteps",
    "StepFamily",
    "Steps",
    "Beside",
    "largest_batches",
    "largest_batches_beside",
]

METHODS = (
    "no swapping",
    "recompute only",
    "original defaults",
    "original auto-tuner",
    "random search",
    "ours",
)
#: A probe of ours (does some plan fit this size?) runs its warm starts and then at most this
#: many trials of the search: on the corpus every probe that fit did so among its warm starts
#: or within 3 trials after them (docs/method.md, "Constants"). A probe of random search runs
#: as many trials as ours' warm starts and these.
PROBE_AFTER_STARTS = 10
#: the methods that swap (the others fit less; sizes all methods fit are taken among these)
SWAPPING = METHODS[2:]
_WARM_STARTS = ("original defaults", "original auto-tuner")
#: the methods that run a study of trials
_SEARCHES = ("random search", "ours")
#: the method whose largest batch is searched in a worker process, beside the others
ASIDE = "random search"


@dataclass
class BatchSearch:
    """The largest batch one method fits, its outcome there, and the search's cost."""

    method: str
    batch: int
    outcome: Outcome | None
    probes: int
    seconds: float
    limit: str = ""

    def summary(self) -> dict[str, Any]:
        o = self.outcome
        return {
            "method": self.method,
            "max_batch": self.batch,
            "overhead": o.best.overhead if o and o.best else None,
            "peak_bytes": o.best.peak_bytes if o and o.best else None,
            "params": o.best.params.to_dict() if o and o.best else None,
            "probes": self.probes,
            "seconds": self.seconds,
            "limited_by": self.limit,
        }


def method_at(
    steps: Steps,
    method: str,
    batch: int,
    budget: Budget,
    trials: int,
    seed: int,
    *,
    first_fit: bool = False,
    recompute: str = "search",
) -> Outcome:
    """Run `method` on the step at `batch`; with `first_fit` a search stops at its first plan
    that fits (its outcome then says only whether the batch fits). `recompute` is what the
    searches may do with recomputes (`autotune.search.space.Space`)."""
    engine = steps.engine(batch)
    callbacks = [stop_when_fits] if first_fit else None
    if method == "no swapping":
        return single_plan(engine, PlanParams(n_tensors=0), budget, method)
    if method == "recompute only":
        return single_plan(engine, RECOMPUTE_ONLY, budget, method)
    if method == "original defaults":
        return single_plan(engine, PlanParams(), budget, method)
    if method == "original auto-tuner":
        return original_autotuner(engine, budget)
    if method == "random search":
        if first_fit:  # as many trials as a probe of ours that fails runs, at most
            queued = len(Space.of(engine, recompute, budget.bytes).starts())
            trials = min(trials, queued + PROBE_AFTER_STARTS)
        return random_search(engine, budget, trials, seed, callbacks, recompute)
    if method == "ours":
        # a probe whose least-memory trial (the second) fits stops there: the warm starts
        # queued after it would never run, so they are not searched for
        skip = first_fit and _least_memory_fits(engine, budget)
        starts = () if skip else warm_starts(engine, budget)
        study = in_memory_study("tpe", seed)
        after = PROBE_AFTER_STARTS if first_fit else None
        return run_study(
            engine, budget, study, trials, starts=starts, callbacks=callbacks,
            recompute=recompute, after_starts=after,
        )  # fmt: skip
    raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def _least_memory_fits(engine: Engine, budget: Budget) -> bool:
    """Whether ours' least-memory warm start fits: a probe of ours where it does stops there
    (`method_at`), so the size search takes it as the probe's answer where it fits."""
    return budget.admits(engine.evaluate(LEAST_MEMORY_ORDERED))


def largest_possible(steps: Steps, budget: Budget) -> int:
    """The largest batch whose lower bound fits: no plan can fit a larger one (0 if none)."""
    if steps.lower_bound(2) > budget.bytes:
        return 0
    hi = 4
    while steps.lower_bound(hi) <= budget.bytes:
        hi *= 2
    return largest(lambda b: steps.lower_bound(b) <= budget.bytes, hi // 2, hi)


def max_probes(low: int, high: int, method: str = "") -> int:
    """The most sizes `largest_batch` probes in [low, high]: `low`, then a binary search (for
    ours, a binary search of its least-memory plan, then up to three probes at its end or at
    `low`, and a binary search beyond them)."""
    if high < low:
        return 0
    steps = math.ceil(math.log2(high - low + 1))
    return 3 + 2 * steps if method == "ours" else 1 + steps


def largest_batch(
    steps: Steps,
    method: str,
    budget: Budget,
    *,
    trials: int,
    seed: int,
    low: int,
    high: int,
    on_probe: Callable[[str, int], None] | None = None,
    full_outcome: bool = True,
    recompute: str = "search",
) -> BatchSearch:
    """Binary search of the batch in [low, high] for `method` (its outcome at the result).

    A search method's probes stop at their first plan that fits; with `full_outcome` it runs
    all its trials at the batch found, so that its outcome there is the one a full run gives
    (else the outcome only says that the batch fits: for a caller that tunes there itself)."""
    start = time.perf_counter()
    outcomes: dict[int, Outcome] = {}

    def fits(batch: int) -> bool:
        if on_probe:
            on_probe(method, batch)
        outcomes[batch] = method_at(
            steps, method, batch, budget, trials, seed, first_fit=True, recompute=recompute
        )
        return outcomes[batch].fits

    checked = 0  # sizes whose least-memory plan alone was evaluated
    if high < low:
        best = 0
    elif method == "ours":
        best, checked = _largest_past_least_memory(steps, budget, fits, low, high, on_probe)
    else:
        best = largest(fits, low, high) if fits(low) else 0
    if not best:
        limit = _limit(outcomes, 0, budget) if outcomes else "the lower bound: device memory"
        probes = len(outcomes) + checked
        return BatchSearch(method, 0, None, probes, time.perf_counter() - start, limit)
    outcome = outcomes[best]
    if method in _SEARCHES and full_outcome:
        outcome = method_at(steps, method, best, budget, trials, seed, recompute=recompute)
    limit = _limit(outcomes, best, budget)
    probes = len(outcomes) + checked
    return BatchSearch(method, best, outcome, probes, time.perf_counter() - start, limit)


def _largest_past_least_memory(
    steps: Steps,
    budget: Budget,
    fits: Callable[[int], bool],
    low: int,
    high: int,
    on_probe: Callable[[str, int], None] | None,
) -> tuple[int, int]:
    """The largest batch in [low, high] ours fits (0 if not even `low`), and how many sizes
    it evaluated the least-memory plan at.

    A probe that fits is cheap (its least-memory warm start fits, and it stops there); one
    that fails runs all its trials. So the batch search first finds the largest batch whose
    least-memory plan fits by single evaluations (`sure`; `low` if none above it), then
    probes it and the batch above it: only where a search finds a plan that the
    least-memory plan does not is it searched further up, by probes as before."""

    checked = []

    def least_fits(batch: int) -> bool:
        if on_probe:
            on_probe("ours", batch)
        checked.append(batch)
        return _least_memory_fits(steps.engine(batch), budget)

    sure = largest(least_fits, low, high)
    if not fits(sure):  # its least-memory warm start differs: search below
        best = 0 if sure == low or not fits(low) else largest(fits, low, sure - 1)
    elif sure == high or not fits(sure + 1):
        best = sure
    else:
        best = largest(fits, sure + 1, high)
    return best, len(checked)


def _limit(outcomes: dict[int, Outcome], best: int, budget: Budget) -> str:
    """What kept the first batch probed above `best` from fitting: device memory, host memory
    (the nearest plan's excess), or, when none failed there, the lower bound."""
    failed = sorted(b for b, o in outcomes.items() if b > best and not o.fits)
    if not failed:
        return "the lower bound: device memory"
    nearest = outcomes[failed[0]].shown
    return (budget.limit(nearest) or "device memory") if nearest else "device memory"


def largest_batches(steps: Steps, budget: Budget, **search: Any) -> dict[str, BatchSearch]:
    """The largest batch of every method (`search`: `largest_batches_beside`'s options), the
    `ASIDE` method's search in its worker waited for."""
    here, beside = largest_batches_beside(steps, budget, **search)
    return beside.joined(here)


def largest_batches_beside(
    steps: Steps,
    budget: Budget,
    *,
    trials: int,
    seed: int,
    methods: tuple[str, ...] = METHODS,
    on_probe: Callable[[str, int], None] | None = None,
    tuned_later: tuple[str, ...] = (),
    recompute: str = "search",
    on_expect: Callable[[int], None] | None = None,
) -> tuple[dict[str, BatchSearch], Beside]:
    """The largest batch of every method but the `ASIDE` one, and that one's search, run in a
    worker process meanwhile (`Beside`: its `joined` waits for it, `stop` ends it; the caller
    must call one). The others search above the no-swap batch; the methods `tuned_later` (by
    the caller, at their batch) get no full outcome there. `on_expect(n)` is told how many
    more probes to expect (for a progress bar's total): at most `max_probes` a method at
    first, then fewer by those a search did not need."""
    ceiling = largest_possible(steps, budget)
    expect = on_expect or (lambda n: None)
    expect(sum(max_probes(2, ceiling, m) for m in {"no swapping", *methods}))
    told = on_probe or (lambda method, batch: None)
    beside = Beside(None, methods, told, expect, max_probes(2, ceiling, ASIDE))

    def search(method: str, low: int) -> BatchSearch:
        found = largest_batch(
            steps, method, budget, trials=trials, seed=seed, low=low, high=ceiling,
            on_probe=beside.probed, full_outcome=method not in tuned_later, recompute=recompute,
        )  # fmt: skip
        expect(found.probes - max_probes(2, ceiling, method))
        return found

    out = {"no swapping": search("no swapping", 2)}
    low = max(2, out["no swapping"].batch)
    beside.side = _aside(steps, methods, budget, trials, seed, low, ceiling, recompute, tuned_later)
    starts = _WARM_STARTS + (("recompute only",) if recompute == "search" else ())
    try:
        for method in methods:
            if method == "ours":
                # warm-started with the original defaults, its auto-tuner's choice (and
                # recompute only, when recomputes are searched), ours fits wherever they fit:
                # its search starts at their largest batch
                low = max([low, *(out[m].batch for m in starts if m in out)])
            if method != "no swapping" and not (beside.side and method == ASIDE):
                out[method] = search(method, low)
    except BaseException:
        beside.stop()
        raise
    return out, beside


def _aside(
    steps: Steps,
    methods: tuple[str, ...],
    budget: Budget,
    trials: int,
    seed: int,
    low: int,
    high: int,
    recompute: str,
    tuned_later: tuple[str, ...],
) -> Aside | None:
    """The `ASIDE` method's search started in a worker process, where it is asked for and
    the step is a `StepFamily` (see `autotune.search.aside`); None else."""
    if ASIDE not in methods or not isinstance(steps, StepFamily):
        return None
    return Aside.start(
        steps, ASIDE, budget=budget, trials=trials, seed=seed, low=low, high=high,
        full_outcome=ASIDE not in tuned_later, recompute=recompute,
    )  # fmt: skip
