"""`fit_max_cube`: the largest cube edge a volumetric model trains at, then tuned there.

A 3-D model's activations grow with the cube of its edge and its ops are not the same at two
edges (the shapes of its poolings change), so the size search captures the step at every edge
it probes (`CapturedSteps`) instead of scaling two captures as the batch search does. Edges are
multiples of the model's `cube_step` (its poolings halve the edge that many times over); the
search is the batch search's (`autotune.search.batching.largest_batches`) over those multiples,
for no swapping and for ours, and the result is tuned at our largest edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.progress import Progress
from autotune.search.batching import BatchSearch, CapturedSteps, largest_batches
from autotune.search.core import Budget
from autotune.search.result import NoFitError, TuningResult, with_tuned_ours
from autotune.search.studies import default_storage, study_name
from autotune.units import format_sized as _sized
from rewriter.capture import Captured
from simulator import DevicePreset
from simulator.memory import fewer_collections

__all__ = ["cube_capturer", "fit_max_cube"]

#: the volumetric model at a cube edge: an object with `model`, `loss` and `optimizer` (a
#: zoo entry's `build(cube=edge)`)
Builder = Callable[[int], Any]


@fewer_collections()
def fit_max_cube(
    build: Builder,
    cube_step: int,
    preset: DevicePreset,
    budget: Budget,
    *,
    batch_size: int = 1,
    trials: int,
    seed: int = 0,
    storage: str | None = None,
    study: str | None = None,
    out: str | Path = "autotune-out",
    objectives: int = 1,
    recompute: str = "search",
    progress: bool = False,
) -> TuningResult:
    """The largest edge (a multiple of `cube_step`) at which the step of `build(edge)` fits the
    budget with our plan, at `batch_size`, and that step tuned there (`TuningResult` with
    `cube_step` set: its searches count edges)."""
    from autotune.search.tuning import check_budget, tune_captured

    bars = Progress(progress)
    bars.expect(1)  # the trace at the edge found
    steps = CapturedSteps(cube_capturer(build, cube_step, batch_size), preset)
    searches = largest_batches(
        steps, budget, trials=trials, seed=seed, methods=("ours",),
        on_probe=lambda method, k: bars.stage(f"{method}: cube {k * cube_step}"),
        tuned_later=("ours",), recompute=recompute, on_expect=bars.expect,
    )  # fmt: skip
    best = searches["ours"].batch or searches["no swapping"].batch
    if best == 0:
        check_budget(steps.engine(2), budget)
        raise NoFitError(
            f"no plan fits cube {2 * cube_step} (the smallest edge searched) in the budget "
            f"{_sized(budget.bytes)}"
        )
    edge = best * cube_step
    bars.stage(f"tracing at cube {edge}")
    captured = steps.captured(best)
    name = study or study_name(
        "step", f"cube{edge}x{batch_size}", preset.name, budget.bytes, budget.host_bytes,
        recompute,
    )  # fmt: skip
    url = storage or default_storage(Path(out))
    tuned = tune_captured(
        captured, steps.engine(best), budget, trials=trials, seed=seed, storage=url,
        name=name, objectives=objectives, batch_size=batch_size, progress=bars,
        recompute=recompute,
    )  # fmt: skip
    shown = with_tuned_ours(searches, tuned.outcomes.get("ours"))
    tuned.batches = {m: _in_edges(s, cube_step) for m, s in shown.items()}
    tuned.cube_step = cube_step
    tuned.trace_seconds = steps.trace_seconds  # every edge's capture, the tuned one's too
    return tuned.check_fits()


def cube_capturer(build: Builder, cube_step: int, batch_size: int) -> Callable[[int], Captured]:
    """capture(k): the step of `build`'s model at cube edge k x `cube_step`, at `batch_size`."""
    from autotune.api import capture

    def at(k: int) -> Captured:
        built = build(k * cube_step)
        return capture(
            built.model, loss=built.loss, optimizer=built.optimizer, batch_size=batch_size
        )

    return at


def _in_edges(search: BatchSearch, cube_step: int) -> BatchSearch:
    return replace(search, batch=search.batch * cube_step)
