"""Search the swap parameters: Optuna with the budget as a constraint, and the baselines.

A trial proposes `n_tensors`, `lb`, `ub`, `threshold` (how far a reader must lie to swap),
`groupby` (fusion distance of swap-ins), the trigger strategy and whether swap-outs are
synchronized (`sync_out`, which keeps the forward pass from outrunning the link) and how many
levels the forward pass may run ahead of a swap-out then (`sync_lag`), whether
order edges reorder the backward pass (`serialize`: not the original tool's, so its baselines
never use it; random search draws it from the same space), and, unless the run fixes it
(`recompute`: "none" or "cheap" instead of the default "search"), whether cheap element-wise
tensors are recomputed instead of swapped and how long their chains may be (the recomputes that
hold bytes at a peak over the budget are then swapped instead, `PlanParams.limit`),
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

The pieces: `budget` (what a plan must fit), `space` (the ranges and how a trial draws them,
the fixed parameter sets), `objective` (one trial, and what a method found), `trials` (running
a study: seeded samplers, refinement, random search). This module gathers their names.
"""

from __future__ import annotations

from autotune.search.budget import DEFAULT_SAFETY_RATIO, Budget
from autotune.search.objective import (
    INTERRUPTED,
    STUDY_RUNNING,
    Outcome,
    best_feasible,
    lowest_peak,
    make_objective,
    single_plan,
)
from autotune.search.space import (
    LEAST_MEMORY_ORDERED,
    RECOMPUTE_CHOICES,
    RECOMPUTE_ONLY,
    Space,
    check_recompute,
)
from autotune.search.trials import (
    in_memory_study,
    quiet_optuna,
    random_search,
    run_study,
    sampler,
    stop_when_fits,
)

__all__ = [
    "DEFAULT_SAFETY_RATIO",
    "INTERRUPTED",
    "LEAST_MEMORY_ORDERED",
    "RECOMPUTE_CHOICES",
    "RECOMPUTE_ONLY",
    "STUDY_RUNNING",
    "Budget",
    "Outcome",
    "Space",
    "best_feasible",
    "check_recompute",
    "in_memory_study",
    "lowest_peak",
    "make_objective",
    "quiet_optuna",
    "random_search",
    "run_study",
    "sampler",
    "single_plan",
    "stop_when_fits",
]
