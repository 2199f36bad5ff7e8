"""The report's plots: each a data function (plain numbers, tested) and a matplotlib renderer
that returns the figure and never saves it (smoke-tested with the Agg backend).

- memory timeline: device bytes over the schedule before and after the plan, with the budget,
  the lower bound and the swap marks; host bytes below;
- time view: in `autotune.report.timeview`;
- the search: Optuna's own optimization history, parameter importances and Pareto front;
- largest batch: predicted peak against batch size, without swapping and with the tuned plan,
  and the tuned plan's overhead against the time bound;
- overhead curves (results/recompute.md): each method's overhead against batch size;
- verification: measured against predicted peak.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.units import byte_unit
from simulator.trace import EventKind

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from simulator.engine import Evaluation

__all__ = [
    "MemoryTimeline",
    "OverheadCurve",
    "CurvePoint",
    "batch_curve",
    "curve_of",
    "curve_point",
    "memory_timeline",
    "render_batch_curve",
    "render_memory_timeline",
    "render_overhead_curves",
    "render_search",
    "render_verification",
]

GIB = float(1 << 30)


@dataclass(frozen=True)
class MemoryTimeline:
    """Device bytes per schedule step without and with the plan, host bytes with it."""

    before: np.ndarray
    after: np.ndarray
    host: np.ndarray
    swap_out_steps: np.ndarray
    swap_in_steps: np.ndarray
    budget_bytes: int
    lower_bound_bytes: int
    peak_before: int
    peak_after: int


def memory_timeline(
    tuned: Evaluation, baseline: Evaluation, budget_bytes: int, lower_bound_bytes: int
) -> MemoryTimeline:
    """The memory timeline of a plan against no swapping (live bytes from the event traces)."""
    mem, base = tuned.result.memory, baseline.result.memory
    n = len(mem.order.ops)
    kinds = np.asarray(mem.trace.kind)
    steps = np.asarray(mem.trace.step)
    return MemoryTimeline(
        base.trace.live_by_step(n, base.persistent_bytes),
        mem.trace.live_by_step(n, mem.persistent_bytes),
        mem.trace.host_by_step(n),
        np.unique(steps[kinds == EventKind.SWAP_OUT]),
        np.unique(steps[kinds == EventKind.SWAP_IN]),
        budget_bytes,
        lower_bound_bytes,
        base.peak_bytes,
        mem.peak_bytes,
    )


def render_memory_timeline(data: MemoryTimeline, title: str = "Device memory") -> Figure:
    """Device bytes (GiB) over the schedule, before and after; host bytes below."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    x = np.arange(len(data.after))
    unit, name = byte_unit(max(data.peak_before, data.peak_after, data.budget_bytes))
    top.plot(x, data.before / unit, color="0.6", lw=1, label="no swapping (live)")
    top.plot(x, data.after / unit, color="C0", lw=1.2, label="with the plan (live)")
    top.axhline(data.budget_bytes / unit, color="C3", ls="--", label="budget")
    top.axhline(data.lower_bound_bytes / unit, color="C2", ls=":", label="lower bound")
    top.axhline(data.peak_after / unit, color="C0", ls="-.", lw=0.8, label="peak, allocator")
    marks = top.get_ylim()[0]
    top.plot(data.swap_out_steps, np.full(len(data.swap_out_steps), marks), "v", ms=3,
             color="C1", label="swap-out")  # fmt: skip
    top.plot(data.swap_in_steps, np.full(len(data.swap_in_steps), marks), "^", ms=3,
             color="C4", label="swap-in")  # fmt: skip
    top.set_ylabel(f"device memory ({name})")
    top.set_title(
        f"{title}: peak {data.peak_before / unit:.2f} {name} without swapping, "
        f"{data.peak_after / unit:.2f} {name} with the plan"
    )
    top.legend(loc="upper left", fontsize="small", ncols=2)
    host_unit, host_name = byte_unit(float(np.max(data.host, initial=0)))
    bottom.fill_between(x, data.host / host_unit, color="C1", alpha=0.5, step="post")
    bottom.set_ylabel(f"host ({host_name})")
    bottom.set_xlabel("schedule step (op in execution order)")
    return fig


def render_search(study: Any) -> dict[str, Figure]:
    """Optuna's own plots of the study: history and importances (one objective) or the Pareto
    front (two); a plot that Optuna cannot draw for this study is left out."""
    from optuna.visualization import matplotlib as ovm

    two = len(study.directions) == 2
    makers: dict[str, Callable[[], Any]] = {}
    if two:
        makers["pareto_front"] = lambda: ovm.plot_pareto_front(
            study, target_names=["peak (bytes)", "step time (s)"]
        )
    else:
        makers["optimization_history"] = lambda: ovm.plot_optimization_history(
            study, target_name="predicted step time (s)"
        )
        makers["param_importances"] = lambda: ovm.plot_param_importances(study)
    out = {}
    for name, make in makers.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = make()
            except (ValueError, RuntimeError, ZeroDivisionError):
                continue
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        fig.set_size_inches(8, 4.5)
        fig.tight_layout()  # Optuna leaves long parameter names cut at the left edge
        out[name] = fig
    return out


@dataclass(frozen=True)
class BatchCurve:
    """Predicted peak per batch size, without swapping and with the tuned parameters."""

    batches: list[int]
    no_swap: list[int]
    tuned: list[int]
    budget_bytes: int
    max_no_swap: int
    max_tuned: int
    #: the tuned parameters' overhead where they fit the budget (None elsewhere), and the time
    #: bound (None where no plan fits or without the time model)
    overhead: list[float | None] = field(default_factory=list)
    bound: list[float | None] = field(default_factory=list)


def batch_grid(max_no_swap: int, max_tuned: int, points: int = 12) -> list[int]:
    """The batch sizes `batch_curve` simulates: `points` (or fewer, where sizes are small)
    from 2 to 15 % past the larger maximum."""
    top = max(max_tuned, max_no_swap, 2)
    return sorted({max(2, round(top * 1.15 * i / (points - 1))) for i in range(points)})


#: one size of the batch curve: the no-swap peak, the tuned parameters' peak, their overhead
#: where they fit (else None) and the time bound (None where none)
CurvePoint = tuple[int, int, float | None, float | None]


def batch_curve(
    engine_at: Callable[[int], Any],
    params: Any,
    budget_bytes: int,
    max_no_swap: int,
    max_tuned: int,
    points: int = 12,
    on_point: Callable[[int], None] | None = None,
) -> BatchCurve:
    """Simulate both settings on a grid of batch sizes up to past the tuned maximum
    (`curve_point` at each). `on_point(b)` is told each size first (a progress bar's stage)."""
    grid = batch_grid(max_no_swap, max_tuned, points)
    tuned_at = engine_at(max(max_tuned, 2))
    rows = {}
    for b in grid:
        if on_point is not None:
            on_point(b)
        rows[b] = curve_point(engine_at, tuned_at, params, budget_bytes, b)
    return curve_of(rows, budget_bytes, max_no_swap, max_tuned)


def curve_point(
    engine_at: Callable[[int], Any], tuned_at: Any, params: Any, budget_bytes: int, batch: int
) -> CurvePoint:
    """The curve at `batch`. The tuned parameters run with the order edges of the tuned size
    (`tuned_at`'s: a size's own edges would be searched for at each point, most of the curve's
    time), and the time bound is the lower of the plain order's and that order's."""
    from simulator.derive import PlanParams

    engine = engine_at(batch)
    ordered = engine.ordered_like(tuned_at) if params.serialize else engine
    bare = engine.evaluate(PlanParams(n_tensors=0))
    ev = ordered.evaluate(params)
    overhead = ev.overhead if ev.peak_bytes <= budget_bytes else None
    limit = engine.time_bound(budget_bytes, ordered=ordered is not engine, ordered_by=ordered)
    base = bare.step_seconds
    bound = limit / base if limit is not None and base else None
    return bare.peak_bytes, ev.peak_bytes, overhead, bound


def curve_of(
    rows: dict[int, CurvePoint], budget_bytes: int, max_no_swap: int, max_tuned: int
) -> BatchCurve:
    """The curve of its points, by size."""
    grid = sorted(rows)
    none, tuned, overhead, bound = (list(col) for col in zip(*(rows[b] for b in grid)))
    return BatchCurve(grid, none, tuned, budget_bytes, max_no_swap, max_tuned, overhead, bound)


def render_batch_curve(data: BatchCurve) -> Figure:
    from matplotlib.figure import Figure

    timed = any(x is not None for x in data.overhead)
    fig = Figure(figsize=(8, 7.5 if timed else 4.5), layout="constrained")
    ax, *below = fig.subplots(2 if timed else 1, 1, sharex=True, squeeze=False)[:, 0]
    unit, name = byte_unit(data.budget_bytes)
    ax.plot(data.batches, np.asarray(data.no_swap) / unit, "o-", color="0.5", label="no swapping")
    ax.plot(data.batches, np.asarray(data.tuned) / unit, "o-", color="C0", label="tuned plan")
    ax.axhline(data.budget_bytes / unit, color="C3", ls="--", label="budget")
    ax.axvline(data.max_no_swap, color="0.5", ls=":", label=f"largest, no swap: {data.max_no_swap}")
    ax.axvline(data.max_tuned, color="C0", ls=":", label=f"largest, tuned: {data.max_tuned}")
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"predicted peak ({name})")
    ax.set_title("Predicted peak against batch size")
    ax.legend(fontsize="small")
    if below:
        _overhead_axes(below[0], data.batches, {"tuned plan": data.overhead}, data.bound)
        below[0].set_xlabel("batch size")
    return fig


@dataclass(frozen=True)
class OverheadCurve:
    """Each method's predicted overhead per size (None where it fits no plan), the time bound
    per size, and each method's largest size."""

    title: str
    unit: str
    sizes: list[int]
    overheads: dict[str, list[float | None]]
    bound: list[float | None]
    largest: dict[str, int]


def _overhead_axes(
    ax: Any,
    sizes: list[int],
    overheads: dict[str, list[float | None]],
    bound: list[float | None],
) -> None:
    for i, (name, values) in enumerate(overheads.items()):
        ys = [np.nan if v is None else v for v in values]
        ax.plot(sizes, ys, "o-", color=f"C{i}", label=name)
    ax.plot(sizes, [np.nan if v is None else v for v in bound], "k--", label="time bound")
    ax.set_ylabel("predicted overhead (x no-swap step time)")
    ax.legend(fontsize="small")


def render_overhead_curves(curves: list[OverheadCurve]) -> Figure:
    """One panel per curve: overhead against size per method, the time bound dashed, each
    method's largest size dotted."""
    from matplotlib.figure import Figure

    cols = 2 if len(curves) > 1 else 1
    rows = (len(curves) + cols - 1) // cols
    fig = Figure(figsize=(6.5 * cols, 4.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, c in zip(axes, curves):
        _overhead_axes(ax, c.sizes, c.overheads, c.bound)
        for i, name in enumerate(c.overheads):
            if c.largest.get(name):
                ax.axvline(c.largest[name], color=f"C{i}", ls=":", lw=1)
        ax.set_title(c.title, fontsize="medium")
        ax.set_xlabel(c.unit)
    for ax in axes[len(curves) :]:
        ax.set_visible(False)
    return fig


def render_verification(verification: Any) -> Figure:
    """Measured against predicted peak, without swapping and with the plan."""
    from matplotlib.figure import Figure

    d = verification.to_dict()
    labels = ["no swapping", "with the plan"]
    measured = [d["baseline_measured_peak_bytes"] or 0, d["measured_peak_bytes"] or 0]
    predicted = [d["baseline_predicted_peak_bytes"], d["predicted_peak_bytes"]]
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(2)
    unit, name = byte_unit(max(*predicted, *measured))
    ax.bar(x - 0.2, np.asarray(predicted) / unit, 0.4, label="predicted", color="C0")
    ax.bar(x + 0.2, np.asarray(measured) / unit, 0.4, label="measured", color="C2")
    ax.set_xticks(x, labels)
    ax.set_ylabel(f"peak ({name})")
    err = d.get("error_percent")
    note = f" (error {err:+.1f} %)" if err is not None else ""
    ax.set_title(f"Peak on {d['device']}: measured vs predicted{note}")
    ax.legend()
    return fig
