"""What `fit` returns: the record of a tuning (`TuningResult`): what was tuned, the plan and the
figures, beside the tuned step it hands calls to (`autotune.search.tuned.TrainingStep`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.search.batching import BatchSearch
from autotune.search.core import Budget, Outcome
from autotune.search.tuned import TrainingStep
from autotune.units import format_sized as _sized
from rewriter.capture import Captured
from simulator import DevicePreset, Graph, SwapPlan
from simulator.engine import Evaluation
from simulator.errors import UserError
from simulator.params import PlanParams

__all__ = [
    "BudgetError",
    "NoFitError",
    "TunedGraph",
    "TuningResult",
    "pareto_front",
    "with_tuned_ours",
]


class BudgetError(UserError):
    """No plan can fit the budget: it is below the lower bound."""


class NoFitError(UserError):
    """The search found no plan that fits (the study keeps its trials for a resumed search)."""


@dataclass
class TuningResult:
    """What was tuned, the plan and the figures; call it like the original step (its
    `training` step, which makes the step at another batch, runs the call)."""

    batch_size: int | None
    budget: Budget
    device: DevicePreset
    evaluation: Evaluation
    baseline: Evaluation
    lower_bound_bytes: int
    study: Any
    outcomes: dict[str, Outcome]
    tuning_seconds: float
    trace_seconds: float
    #: the tuned step at any batch
    training: TrainingStep
    time_bound_seconds: float | None = None
    batches: dict[str, BatchSearch] | None = None
    #: > 0 when the size searched was a volumetric model's cube edge (`batches` count edges,
    #: multiples of this step), not the batch
    cube_step: int = 0
    steps: Any = None  # the StepFamily of a largest-batch search (for the batch curve)
    verification: Any = None
    #: the simulated peak of the tuned parameters without order edges and serial loops (None
    #: when it has neither)
    unordered_peak_bytes: int | None = None
    #: the graph the plan was derived on (the step's at the tuned batch)
    graph: Graph | None = None
    #: the backward pass's first op (None: the step has none), where the time view splits
    #: the waits into the forward and the backward pass
    backward_op: str | None = None
    #: the plan's peak simulated on the graph TensorFlow runs, where Grappler regroups what
    #: reads its swap-ins (`autotune.search.asrun`; None elsewhere)
    as_run_peak_bytes: int | None = None

    @property
    def size_name(self) -> str:
        """What the largest-size search varied: "batch", or "cube edge" (`cube_step`)."""
        return "cube edge" if self.cube_step else "batch"

    @property
    def fits_without_swapping(self) -> bool:
        return self.budget.admits(self.baseline)

    @property
    def fits(self) -> bool:
        """The plan fits the budget, as simulated and, where computed, as TensorFlow runs it."""
        as_run = self.as_run_peak_bytes
        return self.budget.admits(self.evaluation) and (
            as_run is None or as_run <= self.budget.bytes
        )

    def check_fits(self) -> TuningResult:
        """Self, or NoFitError in the form: target, achieved, original (GiB and bytes)."""
        if self.fits:
            return self
        host, as_run = self.budget.host_bytes, self.as_run_peak_bytes
        if self.budget.admits(self.evaluation) and as_run is not None:
            raise NoFitError(
                f"no plan found fits as TensorFlow runs it: the best peaks at {_sized(as_run)} "
                f"over the budget {_sized(self.budget.bytes)} once Grappler regroups what reads "
                "its swap-ins (simulated); the trials are kept: resume with more trials"
            )
        if self.evaluation.peak_bytes <= self.budget.bytes and host is not None:
            raise NoFitError(
                f"no plan found fits: the best that fits the device needs "
                f"{_sized(self.evaluation.host_peak_bytes)} of host memory, over the limit "
                f"{_sized(host)}: give more with --host-memory (host_memory=); the trials are kept"
            )
        raise NoFitError(
            f"no plan found fits: best peak {_sized(self.predicted_peak_bytes)} exceeds the "
            f"budget {_sized(self.budget.bytes)}, from {_sized(self.baseline.peak_bytes)} "
            "without swapping; the trials are kept: resume with more trials or a larger budget"
        )

    @property
    def params(self) -> PlanParams:
        return self.evaluation.params

    @property
    def plan(self) -> SwapPlan:
        return self.evaluation.plan

    @property
    def predicted_peak_bytes(self) -> int:
        return self.evaluation.peak_bytes

    @property
    def predicted_step_seconds(self) -> float | None:
        return self.evaluation.step_seconds

    @property
    def predicted_overhead(self) -> float | None:
        return self.evaluation.overhead

    @property
    def recompute_seconds(self) -> float | None:
        """Compute time the plan's recomputes add per step (None without the time model)."""
        return self.evaluation.recompute_seconds

    @property
    def captured(self) -> Captured | None:
        """The step as captured at the tuned batch (captured now if it was left for later;
        None without one)."""
        return self.training.capture()

    @property
    def step(self) -> Any:
        """The tuned step at the tuned batch (`TrainingStep.rewritten`)."""
        return self.training.rewritten

    def __call__(self, *args: Any) -> Any:
        """Run a training step at any batch size (`TrainingStep`)."""
        return self.training(*args)

    @property
    def graph_def(self) -> Any:
        """The rewritten GraphDef (the original one when nothing is swapped)."""
        return self.training.graph_def

    def to_dict(self) -> dict[str, Any]:
        """The fields of `autotune fit --json` and of summary.json."""
        out: dict[str, Any] = {
            "batch_size": self.batch_size,
            "device": self.device.name,
            "gpu_memory_bytes": self.budget.device_bytes,
            "safety_ratio": self.budget.ratio,
            "budget_bytes": self.budget.bytes,
            "fits_without_swapping": self.fits_without_swapping,
            "params": self.params.to_dict(),
            "swapped_tensors": len(self.plan.swaps),
            "swapped_bytes": self.plan.swapped_bytes,
            "recomputed_tensors": self.plan.recomputed_tensors,
            "recomputed_bytes": self.plan.recomputed_bytes,
            "recompute_seconds": self.recompute_seconds,
            "waits_seconds": self.evaluation.waits_seconds,
            "order_edges": [list(e) for e in self.plan.order_edges],
            "serial_loops": list(self.plan.serial_loops),
            "peak_without_order_edges_bytes": self.unordered_peak_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "as_run_peak_bytes": self.as_run_peak_bytes,
            "predicted_host_peak_bytes": self.evaluation.host_peak_bytes,
            "host_memory_bytes": self.budget.host_bytes,
            "predicted_step_seconds": self.predicted_step_seconds,
            "predicted_overhead": self.predicted_overhead,
            "time_bound_seconds": self.time_bound_seconds,
            "baseline_peak_bytes": self.baseline.peak_bytes,
            "baseline_step_seconds": self.baseline.step_seconds,
            "lower_bound_bytes": self.lower_bound_bytes,
            "trials": len(self.study.trials) if self.study is not None else 0,
            "tuning_seconds": self.tuning_seconds,
            "trace_seconds": self.trace_seconds,
            "methods": {k: o.summary() for k, o in self.outcomes.items()},
        }
        if self.study is not None and len(self.study.directions) == 2:
            out["pareto_front"] = pareto_front(self.study)
        if self.verification is not None:
            out["verification"] = self.verification.to_dict()
        if self.batches is not None:
            size = "max_cube" if self.cube_step else "max_batch"
            if self.cube_step:
                out["cube"] = self.batches["ours"].batch or self.batches["no swapping"].batch
            out[f"{size}_no_swap"] = self.batches["no swapping"].batch
            out[f"{size}_tuned"] = self.batches["ours"].batch
            out["max_batch_limited_by"] = self.batches["ours"].limit
            out["baselines"] = {k: b.summary() for k, b in self.batches.items() if k != "ours"}
        return out

    def verify(self, *, steps: int = 3) -> Any:
        """Run the tuned and the original step on the device (a GPU, or the emulated one) and
        keep the measured peaks next to the prediction for the report."""
        from autotune.run.verify import verify_captured

        if self.captured is None:
            raise UserError("this result holds no captured step to run")
        self.verification = verify_captured(
            self.captured, self.plan, steps=steps, memory_bytes=self.budget.device_bytes
        )
        return self.verification

    def save_plan(self, path: str | Path) -> Path:
        """Write the plan file (see autotune.planfile): apply it elsewhere with
        `autotune.rewrite(step, *args, plan=path)` or `SwapCallback(plan=path)`."""
        import json

        from autotune.planfile import save_plan

        made = self.training.captured  # a capture left for later is not made for this
        graph = made.graph if made is not None else self.graph
        if graph is None:
            path = Path(path)
            path.write_text(json.dumps(self.plan.to_dict(), indent=1) + "\n")
            return path
        return save_plan(path, self.plan, graph, self.batch_size)

    def report(self, directory: str | Path, *, progress: bool = False) -> Path:
        """Write summary.json, plan.json, trials.csv, the plots, report.md and report.html
        into `directory`; return the path of report.md. `progress`: a bar of its stages."""
        from autotune.progress import Progress
        from autotune.report.write import write_report

        return write_report(self, Path(directory), Progress(progress, "report"))


#: The name `TuningResult` had before 0.2; kept for a release.
TunedGraph = TuningResult


def pareto_front(study: Any) -> list[dict[str, Any]]:
    """The trials no other feasible trial beats in both peak and time (two objectives)."""
    return [
        {
            "trial": t.number,
            "params": t.user_attrs["plan_params"],
            "peak_bytes": t.user_attrs["peak_bytes"],
            "step_seconds": t.user_attrs["step_seconds"],
        }
        for t in sorted(study.best_trials, key=lambda t: t.user_attrs["peak_bytes"])
    ]


def with_tuned_ours(
    searches: dict[str, BatchSearch],
    tuned: Outcome | None,
    fallback: Callable[[], Outcome] | None = None,
) -> dict[str, BatchSearch]:
    """`searches` with ours' outcome at its size, that of a probe which stopped at its first
    plan that fits, replaced by the tuning's there (`tuned`; else `fallback()`'s, if given),
    so that a table of the methods shows the plan the user gets."""
    ours = searches["ours"]
    if ours.outcome is None:  # no size fits: nothing was tuned
        return searches
    full = tuned or (fallback() if fallback else None)
    return {**searches, "ours": replace(ours, outcome=full)} if full is not None else searches
