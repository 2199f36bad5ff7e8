"""`autotune.fit`: the fastest swap plan that fits a memory budget, and a step that uses it.

`fit` captures the step (or a Keras model's training step), checks the budget against the lower
bound and the no-swap peak, runs the baselines and our Optuna search on the same engine, and
returns a `TuningResult`: callable like the step, with the parameters, the plan, the prediction,
the rewritten GraphDef, the study and `report(dir)`. With `max_batch=True` it first finds the
largest batch each method fits (from two captures, see `autotune.search.batching`), then
tunes there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.calibration import resolve_device
from autotune.progress import Progress
from autotune.search.asrun import confirmed
from autotune.search.baselines import (
    warm_starts,
)
from autotune.search.batching import (
    CAPTURE_BATCHES,
    StepFamily,
    largest_batches_beside,
    method_at,
)
from autotune.search.core import (
    DEFAULT_SAFETY_RATIO,
    Budget,
    Outcome,
    check_recompute,
    run_study,
)
from autotune.search.result import (
    BudgetError,
    NoFitError,
    TunedGraph,
    TuningResult,
    with_tuned_ours,
)
from autotune.search.steps import leading_dim, model_name, step_capturer
from autotune.search.studies import default_storage, open_study, queue_lock, study_name
from autotune.search.tuned import TrainingStep
from autotune.units import format_sized as _sized
from rewriter.capture import Captured
from rewriter.replicas import Distributed
from simulator import DevicePreset, get_preset
from simulator.derive import PlanParams
from simulator.engine import Engine, Evaluation
from simulator.errors import UserError
from simulator.memory import fewer_collections

__all__ = [
    "BudgetError",
    "NoFitError",
    "TunedGraph",
    "TuningResult",
    "fit",
    "resolve_host_memory",
    "tune_captured",
]

_log = logging.getLogger("autotune")

DEFAULT_DEVICE = "v100-16gb-nvlink2"
DEFAULT_TRIALS = 50


def check_budget(engine: Engine, budget: Budget) -> None:
    """BudgetError when even a perfect plan could not fit."""
    if engine.lower_bound > budget.bytes:
        need = math.ceil(engine.lower_bound / budget.ratio)
        raise BudgetError(
            f"budget {_sized(budget.bytes)} ({budget.ratio:.2f} of {_sized(budget.device_bytes)}) "
            f"is below the lower bound {_sized(engine.lower_bound)}: no plan fits; the smallest "
            f"device memory that could ever fit is {_sized(need)}"
        )


@fewer_collections()
def tune_captured(
    captured: Captured | None,
    engine: Engine,
    budget: Budget,
    *,
    trials: int,
    seed: int,
    storage: str,
    name: str,
    objectives: int = 1,
    batch_size: int | None = None,
    progress: Progress | None = None,
    recompute: str = "search",
    later: Callable[[], Captured] | None = None,
) -> TuningResult:
    """Tune one captured step on its engine: baselines, then our study (resumed if stored);
    `recompute` is what the search may do with recomputes (`autotune.search.space.Space`).
    Without `captured`, `later` captures the step when it is first needed."""
    check_budget(engine, budget)
    start = time.perf_counter()
    baseline = engine.evaluate(PlanParams(n_tensors=0))
    outcomes: dict[str, Outcome] = {}
    study, as_run = None, None
    if budget.admits(baseline):
        best = baseline
    else:
        outcomes = _baselines(engine, budget, trials, seed, recompute)
        study = open_study(storage, name, seed=seed, objectives=objectives)
        callbacks = (progress or Progress(False)).trials(trials, _finished(study))
        starts = warm_starts(engine, budget, outcomes["original auto-tuner"])
        ours = run_study(
            engine, budget, study, trials, objectives=objectives, starts=starts,
            callbacks=callbacks, recompute=recompute, lock=queue_lock(storage),
        )  # fmt: skip
        outcomes["ours"] = ours
        best = ours.shown or baseline
        # confirmed as TensorFlow runs it, for a step on one device
        if captured is not None and len(captured.replicas) < 2 and ours.best is not None:
            best, as_run = confirmed(captured, engine, budget, study, best)
            outcomes["ours"] = replace(ours, best=best)
    device = engine.device or get_preset(DEFAULT_DEVICE)
    return TuningResult(
        batch_size,
        budget,
        device,
        best,
        baseline,
        engine.lower_bound,
        study,
        outcomes,
        time.perf_counter() - start,
        captured.trace_seconds if captured is not None else 0.0,
        TrainingStep(captured, best.plan, best.params, device, batch_size, later=later),
        engine.time_bound(budget.bytes),
        unordered_peak_bytes=_unordered_peak(engine, best),
        graph=engine.graph,
        backward_op=engine.order.ops[engine.backward_start] if engine.context.flow else None,
        as_run_peak_bytes=as_run,
    )


def _unordered_peak(engine: Engine, best: Evaluation) -> int | None:
    """What `best`'s order edges and serial loops save: its parameters' peak without them
    (None where it has neither)."""
    if not (best.plan.order_edges or best.plan.serial_loops):
        return None
    return engine.evaluate(replace(best.params, serialize=False)).peak_bytes


def _finished(study: Any) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def _baselines(
    engine: Engine, budget: Budget, trials: int, seed: int, recompute: str
) -> dict[str, Outcome]:
    from autotune.search.baselines import original_autotuner
    from autotune.search.core import RECOMPUTE_ONLY, random_search, single_plan

    return {
        "no swapping": single_plan(engine, PlanParams(n_tensors=0), budget, "no swapping"),
        "recompute only": single_plan(engine, RECOMPUTE_ONLY, budget, "recompute only"),
        "original defaults": single_plan(engine, PlanParams(), budget, "original defaults"),
        "original auto-tuner": original_autotuner(engine, budget),
        "random search": random_search(engine, budget, trials, seed, recompute=recompute),
    }


@fewer_collections()
def fit(
    step_or_model: Any,
    *example_args: Any,
    gpu_memory: int | str | None = None,
    device: str | DevicePreset = DEFAULT_DEVICE,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    storage: str | None = None,
    study: str | None = None,
    out: str | Path = "autotune-out",
    safety_ratio: float = DEFAULT_SAFETY_RATIO,
    host_memory: int | str | None = None,
    objectives: int = 1,
    max_batch: bool = False,
    progress: bool = False,
    loss: Any = None,
    optimizer: Any = None,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    recompute: str = "search",
    strategy: Any = None,
) -> TuningResult:
    """Find the fastest swap plan whose predicted peak fits `gpu_memory` x `safety_ratio` on
    `device` (a preset name; `gpu_memory` defaults to its memory) and whose swapped tensors
    fit `host_memory` on the host (default: on a GPU machine the smaller of free RAM and
    TensorFlow's pinned host cap, else no limit), and return the tuned step.

    `step_or_model` is a tf.function with example args (tensors or TensorSpecs), or a Keras
    model with `loss=`, `optimizer=` and `batch_size=`. The study is stored in `storage` (an
    Optuna database URL; default SQLite in `out`) under `study`, and resumed if it exists.
    With `max_batch=True` the batch size is searched (the batch is the leading dimension of
    every example argument) and the step is tuned at the largest batch that fits.
    `recompute`: "search" (default) lets the search choose whether to recompute cheap
    element-wise tensors instead of swapping them; "none" never recomputes, "cheap" always.
    With `strategy` (a `tf.distribute` strategy) the step runs `strategy.run` itself and the
    example args are distributed values: each replica's share of the step is tuned to fit
    `gpu_memory` on its own device and an equal share of `host_memory` (the machine's; the
    replicas of one machine swap into the same host memory); sizes are per replica.
    """
    _check_options(trials, objectives, recompute)
    preset = resolve_device(device)
    host = resolve_host_memory(host_memory)
    distributed, named = None, step_or_model
    if strategy is not None:
        distributed = Distributed.of(strategy, example_args)
        example_args = tuple(distributed.components(example_args))
        step_or_model = distributed.flat(step_or_model)
        host = host // len(distributed.devices) if host else None  # the machine's, shared
    budget = Budget(_memory(gpu_memory, preset), safety_ratio, host)
    capture_at = step_capturer(
        step_or_model, example_args, loss, optimizer, batch_size, input_shape, distributed
    )
    bars = Progress(progress)
    url = storage or default_storage(Path(out))
    opts: dict[str, Any] = {"trials": trials, "seed": seed, "storage": url,
                            "objectives": objectives, "recompute": recompute}  # fmt: skip
    if max_batch:
        given = batch_size or leading_dim(example_args)
        return _fit_max_batch(capture_at, preset, budget, study, bars, batch_size=given, **opts)
    return _fit_one_batch(capture_at, model_name(named), preset, budget, study, bars, **opts)


def _fit_one_batch(
    capture_at: Callable[[int | None], Captured],
    model: str,
    preset: DevicePreset,
    budget: Budget,
    study: str | None,
    bars: Progress,
    *,
    trials: int,
    seed: int,
    storage: str,
    objectives: int,
    recompute: str,
) -> TuningResult:
    """`fit` at the step's own batch: capture, estimate op costs, tune."""
    bars.expect(3)
    bars.stage("tracing the step")
    captured = capture_at(None)
    bars.stage("estimating op costs")
    batch = leading_dim(captured.specs)
    engine = _engine(captured, preset)
    name = study or study_name(
        model, batch or "x", preset.name, budget.bytes, budget.host_bytes, recompute
    )
    bars.stage("baselines")
    tuned = tune_captured(
        captured, engine, budget, trials=trials, seed=seed, storage=storage, name=name,
        objectives=objectives, batch_size=batch, progress=bars, recompute=recompute,
    )  # fmt: skip
    if batch is not None:
        tuned.training.retuner = Retuner(
            capture_at, preset, budget, name, trials, seed, storage, recompute
        )
    return tuned.check_fits()


@dataclass(frozen=True)
class Retuner:
    """A tuned step at another batch: the step captured there, with the plan the parameters
    tuned at the first batch give there if it fits the budget, else a plan tuned there (in a
    study named after the first one's, with its options)."""

    capture_at: Callable[[int | None], Captured]
    device: DevicePreset
    budget: Budget
    name: str
    trials: int
    seed: int
    storage: str
    recompute: str

    def step_at(self, batch: int, params: PlanParams) -> Any:
        captured = self.capture_at(batch)
        engine = _engine(captured, self.device)
        ev = engine.evaluate(params)
        if not self.budget.admits(ev):
            tuned = tune_captured(
                captured, engine, self.budget, name=f"{self.name}-at{batch}", batch_size=batch,
                trials=self.trials, seed=self.seed, storage=self.storage, recompute=self.recompute,
            )  # fmt: skip
            ev = tuned.check_fits().evaluation
        _log.info("batch %d: plan %s, predicted peak %s", batch, ev.params.to_dict(),
                  _sized(ev.peak_bytes))  # fmt: skip
        from autotune.run.verify import training_step

        return training_step(captured, ev.plan, self.device)


def _check_options(trials: int, objectives: int, recompute: str) -> None:
    check_recompute(recompute)
    if trials < 1:
        raise UserError(f"trials must be at least 1, got {trials}")
    if objectives not in (1, 2):
        raise UserError(f"objectives must be 1 (time) or 2 (peak and time), got {objectives}")


def _memory(gpu_memory: int | str | None, preset: DevicePreset) -> int:
    from autotune.units import parse_size

    if gpu_memory is None:
        if not preset.memory_bytes:
            raise UserError(f"{preset.description} does not say its memory: give gpu_memory")
        return preset.memory_bytes
    return parse_size(gpu_memory) if isinstance(gpu_memory, str) else int(gpu_memory)


def resolve_host_memory(host_memory: int | str | None) -> int | None:
    """The host limit given, or the default for this machine (see autotune.search.host)."""
    from autotune.search.host import default_host_memory
    from autotune.units import parse_size

    if host_memory is not None:
        return parse_size(host_memory) if isinstance(host_memory, str) else int(host_memory)
    import tensorflow as tf

    return default_host_memory(bool(tf.config.list_physical_devices("GPU")))


def _engine(captured: Captured, preset: DevicePreset) -> Engine:
    from autotune.api import build_engine

    return build_engine(captured, preset, "analytical")


def _fit_max_batch(
    capture_at: Callable[[int | None], Captured],
    preset: DevicePreset,
    budget: Budget,
    study: str | None,
    bars: Progress,
    **opts: Any,
) -> TuningResult:
    """Capture at two batches (the given one and its double, so that per-op costs are of that
    size; else 16 and 32), find each method's largest batch, tune ours there (`opts` are
    tune_captured's: trials, seed, storage, objectives; and the given batch_size)."""
    trials, seed, recompute = opts["trials"], opts["seed"], opts["recompute"]
    given = opts.pop("batch_size", None)
    pair = (given, 2 * given) if given and given >= 2 else CAPTURE_BATCHES
    bars.expect(2 * len(pair))  # a trace and costs at each batch
    steps = StepFamily.or_captures(capture_at, preset, pair, on_stage=bars.stage)
    here, beside = largest_batches_beside(
        steps, budget, trials=trials, seed=seed, on_probe=bars.probe, tuned_later=("ours",),
        recompute=recompute, on_expect=bars.expect,
    )  # fmt: skip
    # ours is tuned at its batch while the search beside (random search's) goes on: neither
    # depends on the other, and this process would otherwise wait for it
    beside.hidden()
    try:  # an error or an interrupt here ends the worker too
        best = here["ours"].batch or here["no swapping"].batch
        if best == 0:
            check_budget(steps.engine(2), budget)
        engine = steps.engine(best)
        name = study or study_name(
            "step", f"max{best}", preset.name, budget.bytes, budget.host_bytes, recompute
        )
        # the step is captured at `best` when it is first run or verified: tuning, the
        # report and the plan file need only the graph scaled from the two captures
        tuned = tune_captured(
            None, engine, budget, name=name, batch_size=best, progress=bars,
            later=lambda: capture_at(best), **opts,
        )  # fmt: skip
        batches = beside.joined(here)
    finally:
        beside.stop()
    tuned.batches = with_tuned_ours(
        batches,
        tuned.outcomes.get("ours"),
        lambda: method_at(steps, "ours", best, budget, trials, seed, recompute=recompute),
    )
    tuned.steps = steps
    tuned.trace_seconds += steps.trace_seconds
    tuned.training.retuner = Retuner(
        capture_at, preset, budget, name, trials, seed, opts["storage"], recompute
    )
    return tuned.check_fits()
