"""The original tool's auto-tuner as a baseline, and ours' warm starts from it.

It ran three one-dimensional binary searches in a fixed order (swap threshold, then swap-in
distance, then grouping) against a memory-only simulation (docs/method.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from autotune.search.core import Budget, Outcome
from simulator.derive import PlanParams
from simulator.engine import Engine

__all__ = ["ORIGINAL_TRIGGER_WINDOW", "largest", "original_autotuner", "warm_starts"]

#: The original tool's auto-tuner searched the trigger between `ahead` and 10 levels further.
ORIGINAL_TRIGGER_WINDOW = 10


def original_autotuner(engine: Engine, budget: Budget) -> Outcome:
    """The original tool's auto-tuner: on a memory-only simulation (no time model), find the
    largest swap threshold that fits, then the largest swap-in distance, then the largest
    swap-in grouping, each by binary search with the others fixed; all candidates swapped."""
    start = time.perf_counter()
    count = [0]
    levels = engine.order.n_levels

    def fits(threshold: int, ahead: int, groupby: int) -> bool:
        count[0] += 1
        params = _original_params(threshold, ahead, groupby)
        return budget.admits(engine.evaluate(params, timed=False))

    chosen = _original_search(fits, levels)
    ev = engine.evaluate(_original_params(*(chosen or (1, 1, 0))))
    best = ev if chosen is not None and budget.admits(ev) else None
    seconds = time.perf_counter() - start
    return Outcome("original auto-tuner", best, count[0] + 1, seconds, None, ev)


def warm_starts(
    engine: Engine, budget: Budget, autotuner: Outcome | None = None
) -> tuple[PlanParams, ...]:
    """Ours' warm starts besides the defaults and the least-memory plan: the original
    auto-tuner's pick (`autotuner`, run here if not given), and the pick of the same search on
    the step with order edges, with `serialize`: the edges lower the peak, so its binary
    searches can swap in earlier and stall less."""
    picked = (autotuner or original_autotuner(engine, budget)).starts()
    ordered = engine.serialized()
    if ordered is engine:
        return picked
    found = original_autotuner(ordered, budget).starts()
    return picked + tuple(replace(p, serialize=True) for p in found)


def _original_params(threshold: int, ahead: int, groupby: int) -> PlanParams:
    return PlanParams(
        n_tensors=-1,
        lb=ahead,
        ub=ahead + ORIGINAL_TRIGGER_WINDOW - 1,
        threshold=threshold,
        groupby=groupby,
    )


def _original_search(
    fits: Callable[[int, int, int], bool], levels: int
) -> tuple[int, int, int] | None:
    if not fits(1, 1, 0):
        return None
    threshold = largest(lambda t: fits(t, 1, 0), 1, levels)
    ahead = largest(lambda a: fits(threshold, a, 0), 1, levels)
    if fits(threshold, ahead, levels):
        return threshold, ahead, levels
    return threshold, ahead, largest(lambda g: fits(threshold, ahead, g), 0, levels)


def largest(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest x in [lo, hi] with ok(x), by binary search, given ok(lo) (monotone ok)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
