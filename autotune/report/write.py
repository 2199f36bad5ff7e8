"""The tuning report: summary.json, the best plan, the trials, the plots (PNG) and report.md and
a self-contained report.html with the tables and the plots.

Every figure comes from the tuning result (simulated), the study (recorded per trial) or a
verification run (measured); the tables are pandas frames.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.progress import Progress
from autotune.report.beside import CurveBeside
from autotune.report.facts import edge_lines, facts
from autotune.units import byte_unit
from simulator.memory import fewer_collections

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from autotune.report.plots import BatchCurve
    from autotune.search.tuning import TuningResult

__all__ = [
    "batches_table",
    "methods_table",
    "trials_table",
    "write_report",
]


def _mib(nbytes: int) -> float:
    return round(nbytes / (1 << 20), 2)


def _peak_column(peaks: list[int | None]) -> tuple[str, list[float | None]]:
    """A column of peaks in the unit that suits its largest value (`byte_unit`)."""
    scale, unit = byte_unit(max((p or 0 for p in peaks), default=0))
    return f"peak ({unit})", [None if p is None else round(p / scale, 3) for p in peaks]


def _overhead(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def methods_table(tuned: TuningResult) -> pd.DataFrame:
    """One row per method at the tuned batch: fits, predicted peak, overhead, cost."""
    import pandas as pd

    summaries = {method: o.summary() for method, o in tuned.outcomes.items()}
    if not summaries:
        summaries["no swapping"] = {
            "fits": True,
            "peak_bytes": tuned.baseline.peak_bytes,
            "overhead": 1.0,
            "evaluations": 1,
            "seconds": tuned.tuning_seconds,
        }
    peak, peaks = _peak_column([s["peak_bytes"] for s in summaries.values()])
    rows = [
        {
            "method": method,
            "fits": s["fits"],
            peak: value,
            "overhead (x)": _overhead(s["overhead"]),
            "evaluations": s["evaluations"],
            "tuning (s)": round(s["seconds"], 2),
        }
        for (method, s), value in zip(summaries.items(), peaks)
    ]
    return pd.DataFrame(rows)


def batches_table(tuned: TuningResult) -> pd.DataFrame | None:
    """One row per method: the largest batch (or cube edge) it fits, as a multiple of the
    no-swap one."""
    import pandas as pd

    if tuned.batches is None:
        return None
    base = tuned.batches["no swapping"].batch or 1
    summaries = {method: b.summary() for method, b in tuned.batches.items()}
    peak, peaks = _peak_column([s["peak_bytes"] for s in summaries.values()])
    rows = [
        {
            "method": method,
            "max cube" if tuned.cube_step else "max batch": b.batch,
            "x no-swap": round(b.batch / base, 2),
            "overhead (x)": _overhead(s["overhead"]),
            peak: value,
            "search (s)": round(b.seconds, 2),
        }
        for (method, b), s, value in zip(tuned.batches.items(), summaries.values(), peaks)
    ]
    return pd.DataFrame(rows)


def trials_table(study: Any) -> pd.DataFrame | None:
    """Optuna's trials frame (parameters, state, the recorded peak and time per trial)."""
    if study is None:
        return None
    return study.trials_dataframe(attrs=("number", "value", "params", "user_attrs", "state"))


def figures(tuned: TuningResult, progress: Progress | None = None) -> dict[str, Figure]:
    """Every plot the result supports, by file stem (`progress` is told the batch curve's
    sizes, then that the plots are being saved)."""
    from autotune.report import plots

    bars = progress or Progress(False)
    maxima = _curve_maxima(tuned)
    beside = None
    if maxima is not None:  # its sizes begin in a worker while the other plots are drawn
        beside = CurveBeside.start(tuned.steps, tuned.params, tuned.budget.bytes, *maxima)
    try:
        out = _other_figures(tuned)
        if maxima is not None:
            out["batch_curve"] = plots.render_batch_curve(_curve(tuned, maxima, beside, bars))
    finally:
        if beside is not None:
            beside.stop()
    bars.stage("saving the plots")
    if tuned.verification is not None:
        out["verification"] = plots.render_verification(tuned.verification)
    return out


def _curve(
    tuned: TuningResult, maxima: tuple[int, int], beside: CurveBeside | None, bars: Progress
) -> BatchCurve:
    """The batch curve: shared with the worker `beside`, or all computed here without one."""
    from autotune.report import plots

    def told(b: int) -> None:
        bars.stage(f"peak against size: {b}")

    if beside is not None:
        return beside.curve(on_point=told)
    return plots.batch_curve(
        tuned.steps.engine, tuned.params, tuned.budget.bytes, *maxima, on_point=told
    )


def _other_figures(tuned: TuningResult) -> dict[str, Figure]:
    """The memory timeline, the time view and the search's plots, where the result has them."""
    from autotune.report import plots, timeview

    out: dict[str, Figure] = {}
    timeline = plots.memory_timeline(
        tuned.evaluation, tuned.baseline, tuned.budget.bytes, tuned.lower_bound_bytes
    )
    out["memory_timeline"] = plots.render_memory_timeline(timeline)
    view = timeview.time_view(tuned.evaluation, tuned.backward_op)
    if view is not None and not tuned.fits_without_swapping:
        out["time_view"] = timeview.render_time_view(view)
    if tuned.study is not None:
        out.update(plots.render_search(tuned.study))
    return out


@fewer_collections()
def write_report(tuned: TuningResult, directory: Path, progress: Progress | None = None) -> Path:
    """Write the report files into `directory` and return the path of report.md; `progress`
    shows its stages (the batch curve's sizes, the plots, the files)."""
    import matplotlib.pyplot as plt

    from autotune.report import plots

    bars = progress or Progress(False)
    maxima = _curve_maxima(tuned)
    bars.expect((len(plots.batch_grid(*maxima)) if maxima else 0) + 2)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(tuned.to_dict(), indent=1) + "\n")
    tuned.save_plan(directory / "plan.json")
    trials = trials_table(tuned.study)
    if trials is not None:
        trials.to_csv(directory / "trials.csv", index=False)
    images = {}
    for name, fig in figures(tuned, bars).items():
        fig.savefig(directory / f"{name}.png", dpi=100)
        plt.close(fig)  # Optuna draws through pyplot, which would keep its figures alive
        images[name] = directory / f"{name}.png"
    bars.stage("report.md and report.html")
    path = directory / "report.md"
    path.write_text(_markdown(tuned, images))
    (directory / "report.html").write_text(_html(tuned, images))
    bars.done()
    return path


def _curve_maxima(tuned: TuningResult) -> tuple[int, int] | None:
    """The largest sizes without swapping and tuned, between which the report's batch curve
    runs (None without a largest-batch search)."""
    if tuned.batches is None or tuned.steps is None:
        return None
    return tuned.batches["no swapping"].batch, tuned.batches["ours"].batch


TITLES = {
    "memory_timeline": "Memory over the step",
    "time_view": "Compute, re-runs, copies and what the step waits for, by phase",
    "optimization_history": "Search: optimization history",
    "param_importances": "Search: parameter importances",
    "pareto_front": "Search: Pareto front of peak and time",
    "batch_curve": "Predicted peak against batch size",
    "verification": "Measured against predicted",
}

#: What a plot's marks mean, where the plot itself does not say
CAPTIONS = {
    "optimization_history": "Each point is one trial's predicted step time; grey points are "
    "trials whose plan did not fit the budget (device or host memory), the red line the best "
    "plan that fits so far.",
    "time_view": "The dashed line is where the backward pass starts; each wait's total is split "
    "into the seconds the forward and the backward pass wait.",
}


def verification_table(tuned: TuningResult) -> pd.DataFrame | None:
    """Measured against predicted peak (MiB) and measured step time, tuned and original; None
    without a verification run."""
    import pandas as pd

    v = tuned.verification
    if v is None:
        return None
    rows = []
    for label, run, predicted in (
        ("tuned", v.tuned, v.predicted_peak_bytes),
        ("tuned, as TensorFlow runs it (after Grappler)", v.tuned, v.as_run_peak_bytes),
        ("original", v.baseline, v.baseline_predicted_peak_bytes),
    ):
        if predicted is None:
            continue
        measured = run.peak_bytes
        rows.append(
            {
                "step": label,
                "measured peak (MiB)": _mib(measured) if measured else run.error,
                "predicted peak (MiB)": _mib(predicted),
                "error (%)": round(100 * (predicted / measured - 1), 1) if measured else None,
                "step (ms)": round(run.step_seconds * 1e3, 1) if run.step_seconds else None,
            }
        )
    return pd.DataFrame(rows)


def peak_table(tuned: TuningResult, n: int = 10) -> pd.DataFrame:
    """The largest buffers live at the tuned plan's peak: what a bigger batch runs into."""
    import pandas as pd

    memory = tuned.evaluation.result.memory
    rows = []
    for name, nbytes in memory.largest_at_peak(n):
        tensor, _, copy = name.partition("@in")
        held = f"swap-in {copy}" if copy else "original"
        rows.append({"tensor": tensor, "MiB": _mib(nbytes), "buffer": held})
    return pd.DataFrame(rows, columns=["tensor", "MiB", "buffer"])


_METHODS = "Methods at this batch (same engine, same budget)"


def _headline(tuned: TuningResult) -> tuple[str, pd.DataFrame]:
    """The table the first screen shows beside the facts: the largest size per method when
    that was searched, else the methods at the tuned size."""
    batches = batches_table(tuned)
    if batches is not None:
        return f"Largest {tuned.size_name} per method", batches
    return _METHODS, methods_table(tuned)


def _details(tuned: TuningResult) -> list[tuple[str, pd.DataFrame]]:
    """The tables below the first plot: the methods at the tuned size (when not the headline),
    what is live at the peak, and the measured run."""
    memory = tuned.evaluation.result.memory
    out = [] if tuned.batches is None else [(_METHODS, methods_table(tuned))]
    out.append((f"Largest tensors live at the peak (op {memory.peak_op})", peak_table(tuned)))
    verified = verification_table(tuned)
    if verified is not None:
        out.append((f"Measured on {tuned.verification.place} against predicted", verified))
    return out


def _html(tuned: TuningResult, images: dict[str, Path]) -> str:
    import base64
    import html

    def section(title: str, body: str) -> str:
        return f"<h2>{html.escape(title)}</h2>{body}"

    def image(name: str, png: Path) -> str:
        data = base64.b64encode(png.read_bytes()).decode()
        caption = f"<p>{html.escape(CAPTIONS[name])}</p>" if name in CAPTIONS else ""
        return section(TITLES.get(name, name), f"<img src='data:image/png;base64,{data}'>{caption}")

    bullets = "".join(f"<li>{_inline(line[2:])}</li>" for line in facts(tuned))
    title, table = _headline(tuned)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>Swap tuning report</title>",
        _STYLE,
        "<h1>Swap tuning report</h1>",
        f"<div class='top'><ul>{bullets}</ul><div>{section(title, table.to_html(index=False))}"
        "</div></div>",
    ]
    (first, png), *rest = images.items()
    parts.append(image(first, png))
    parts += [section(t, df.to_html(index=False)) for t, df in _details(tuned)]
    parts += [image(name, png) for name, png in rest]
    edges = edge_lines(tuned)
    if edges:
        items = "".join(f"<li>{_inline(line[2:])}</li>" for line in edges)
        parts.append(section(f"Order edges ({len(edges)})", f"<ul>{items}</ul>"))
    return "\n".join(parts) + "\n"


#: A small stylesheet: the facts beside the headline table, so that they and the first plot
#: fit a laptop's first screen (checked in tests/autotune/test_report.py)
_STYLE = (
    "<style>body{font:14px/1.35 system-ui,sans-serif;max-width:75rem;margin:1rem auto;"
    "padding:0 1rem}h1{font-size:1.4rem;margin:0 0 .5rem}h2{font-size:1.05rem;"
    "margin:.8rem 0 .3rem}.top{display:flex;flex-wrap:wrap;gap:0 2rem;align-items:flex-start}"
    ".top ul{flex:1 1 24rem;margin:0;padding-left:1.2rem}.top h2{margin-top:0}"
    "table{border-collapse:collapse;margin:.2rem 0;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:.1rem .4rem;text-align:right}"
    "code{background:#f3f3f3;padding:0 .2rem}img{max-width:100%;max-height:28rem}</style>"
)


def _inline(text: str) -> str:
    """Markdown's inline code (`x`) as HTML, the rest escaped."""
    import html
    import re

    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def _markdown(tuned: TuningResult, images: dict[str, Path]) -> str:
    """report.md, in report.html's order: facts, headline tables, the first plot, the rest."""

    def image(name: str, png: Path) -> list[str]:
        caption = [CAPTIONS[name], ""] if name in CAPTIONS else []
        return [f"## {TITLES.get(name, name)}", "", f"![{name}]({png.name})", "", *caption]

    title, table = _headline(tuned)
    lines = ["# Swap tuning report", "", *facts(tuned), ""]
    lines += [f"## {title}", "", table.to_markdown(index=False), ""]
    (first, png), *rest = images.items()
    lines += image(first, png)
    for title, table in _details(tuned):
        lines += [f"## {title}", "", table.to_markdown(index=False), ""]
    for name, png in rest:
        lines += image(name, png)
    edges = edge_lines(tuned)
    if edges:
        lines += [f"## Order edges ({len(edges)})", "", *edges, ""]
    return "\n".join(lines)
