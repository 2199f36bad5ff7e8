"""The tuning report: summary.json, the best plan, the trials, the plots (PNG) and report.md and
a self-contained report.html with the tables and the plots.

Every figure comes from the tuning result (simulated), the study (recorded per trial) or a
verification run (measured); the tables are pandas frames.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from autotune.search.tuning import TuningResult

__all__ = ["batches_table", "methods_table", "trials_table", "write_report"]

GIB = float(1 << 30)


def _gib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / GIB, 3)


def _mib(nbytes: int) -> float:
    return round(nbytes / (1 << 20), 2)


def methods_table(tuned: TuningResult) -> pd.DataFrame:
    """One row per method at the tuned batch: fits, predicted peak (GiB), overhead, cost."""
    import pandas as pd

    rows = []
    for method, o in tuned.outcomes.items():
        s = o.summary()
        rows.append(
            {
                "method": method,
                "fits": s["fits"],
                "peak (GiB)": _gib(s["peak_bytes"]),
                "overhead (x)": s["overhead"],
                "evaluations": s["evaluations"],
                "tuning (s)": round(s["seconds"], 2),
            }
        )
    if not rows:
        rows.append(
            {
                "method": "no swapping",
                "fits": True,
                "peak (GiB)": _gib(tuned.baseline.peak_bytes),
                "overhead (x)": 1.0,
                "evaluations": 1,
                "tuning (s)": round(tuned.tuning_seconds, 2),
            }
        )
    return pd.DataFrame(rows)


def batches_table(tuned: TuningResult) -> pd.DataFrame | None:
    """One row per method: the largest batch (or cube edge) it fits, as a multiple of the
    no-swap one."""
    import pandas as pd

    if tuned.batches is None:
        return None
    base = tuned.batches["no swapping"].batch or 1
    rows = [
        {
            "method": method,
            "max cube" if tuned.cube_step else "max batch": b.batch,
            "x no-swap": round(b.batch / base, 2),
            "overhead (x)": b.summary()["overhead"],
            "peak (GiB)": _gib(b.summary()["peak_bytes"]),
            "search (s)": round(b.seconds, 2),
        }
        for method, b in tuned.batches.items()
    ]
    return pd.DataFrame(rows)


def trials_table(study: Any) -> pd.DataFrame | None:
    """Optuna's trials frame (parameters, state, the recorded peak and time per trial)."""
    if study is None:
        return None
    return study.trials_dataframe(attrs=("number", "value", "params", "user_attrs", "state"))


def figures(tuned: TuningResult) -> dict[str, Figure]:
    """Every plot the result supports, by file stem."""
    from autotune.report import plots

    out: dict[str, Figure] = {}
    timeline = plots.memory_timeline(
        tuned.evaluation, tuned.baseline, tuned.budget.bytes, tuned.lower_bound_bytes
    )
    out["memory_timeline"] = plots.render_memory_timeline(timeline)
    view = plots.time_view(tuned.evaluation)
    if view is not None and not tuned.fits_without_swapping:
        out["time_view"] = plots.render_time_view(view)
    if tuned.study is not None:
        out.update(plots.render_search(tuned.study))
    if tuned.batches is not None and tuned.steps is not None:
        curve = plots.batch_curve(
            tuned.steps.engine,
            tuned.params,
            tuned.budget.bytes,
            tuned.batches["no swapping"].batch,
            tuned.batches["ours"].batch,
        )
        out["batch_curve"] = plots.render_batch_curve(curve)
    if tuned.verification is not None:
        out["verification"] = plots.render_verification(tuned.verification)
    return out


def write_report(tuned: TuningResult, directory: Path) -> Path:
    """Write the report files into `directory` and return the path of report.md."""
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(tuned.to_dict(), indent=1) + "\n")
    tuned.save_plan(directory / "plan.json")
    trials = trials_table(tuned.study)
    if trials is not None:
        trials.to_csv(directory / "trials.csv", index=False)
    images = {}
    for name, fig in figures(tuned).items():
        fig.savefig(directory / f"{name}.png", dpi=100)
        plt.close(fig)  # Optuna draws through pyplot, which would keep its figures alive
        images[name] = directory / f"{name}.png"
    path = directory / "report.md"
    path.write_text(_markdown(tuned, images))
    (directory / "report.html").write_text(_html(tuned, images))
    return path


TITLES = {
    "memory_timeline": "Memory over the step",
    "time_view": "Compute, copies and stalls",
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
        ("original", v.baseline, v.baseline_predicted_peak_bytes),
    ):
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


def _tables(tuned: TuningResult) -> list[tuple[str, pd.DataFrame]]:
    memory = tuned.evaluation.result.memory
    out = [
        ("Methods at this batch (same engine, same budget)", methods_table(tuned)),
        (f"Largest tensors live at the peak (op {memory.peak_op})", peak_table(tuned)),
    ]
    batches = batches_table(tuned)
    if batches is not None:
        out.append((f"Largest {tuned.size_name} per method", batches))
    verified = verification_table(tuned)
    if verified is not None:
        out.append((f"Measured on {tuned.verification.place} against predicted", verified))
    return out


def _html(tuned: TuningResult, images: dict[str, Path]) -> str:
    import base64
    import html

    parts = ["<!doctype html><meta charset='utf-8'><title>Swap tuning report</title>", _STYLE]
    parts.append("<h1>Swap tuning report</h1><ul>")
    parts += [f"<li>{_inline(line[2:])}</li>" for line in _facts(tuned)]
    parts.append("</ul>")
    for title, table in _tables(tuned):
        parts += [f"<h2>{html.escape(title)}</h2>", table.to_html(index=False)]
    for name, png in images.items():
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(f"<h2>{TITLES.get(name, name)}</h2><img src='data:image/png;base64,{data}'>")
        if name in CAPTIONS:
            parts.append(f"<p>{html.escape(CAPTIONS[name])}</p>")
    edges = _edges(tuned)
    if edges:
        parts.append(f"<h2>Order edges ({len(edges)})</h2><ul>")
        parts += [f"<li>{_inline(line[2:])}</li>" for line in edges]
        parts.append("</ul>")
    return "\n".join(parts) + "\n"


_STYLE = (
    "<style>body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;"
    "padding:0 1rem;line-height:1.4}table{border-collapse:collapse;margin:.5rem 0}"
    "th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:right}"
    "code{background:#f3f3f3;padding:0 .2rem}img{max-width:100%}</style>"
)


def _inline(text: str) -> str:
    """Markdown's inline code (`x`) as HTML, the rest escaped."""
    import html
    import re

    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def _markdown(tuned: TuningResult, images: dict[str, Path]) -> str:
    lines = ["# Swap tuning report", "", *_facts(tuned), ""]
    for title, table in _tables(tuned):
        lines += [f"## {title}", "", table.to_markdown(index=False), ""]
    for name, png in images.items():
        lines += [f"## {TITLES.get(name, name)}", "", f"![{name}]({png.name})", ""]
        lines += [CAPTIONS[name], ""] if name in CAPTIONS else []
    edges = _edges(tuned)
    if edges:
        lines += [f"## Order edges ({len(edges)})", "", *edges, ""]
    return "\n".join(lines)


def _edges(tuned: TuningResult) -> list[str]:
    """One bullet per order edge of the plan: which op waits for which."""
    return [f"- `{after}` waits for `{before}`" for before, after in tuned.plan.order_edges]


def _facts(tuned: TuningResult) -> list[str]:
    d = tuned.to_dict()
    return [
        f"- device preset: {d['device']}; budget {format_bytes(d['budget_bytes'])} "
        f"({d['safety_ratio']:.2f} of {format_bytes(d['gpu_memory_bytes'])})",
        f"- batch size: {d['batch_size']}" + (f", cube edge {d['cube']}" if "cube" in d else ""),
        f"- lower bound (resident + largest op): {format_bytes(d['lower_bound_bytes'])}",
        f"- no swapping: peak {format_bytes(d['baseline_peak_bytes'])}",
        f"- tuned: peak {format_bytes(d['predicted_peak_bytes'])}, "
        f"{d['swapped_tensors']} tensors swapped, overhead {_x(d['predicted_overhead'])}",
        *_host_facts(d),
        f"- parameters: `{json.dumps(_short(d['params']))}`",
        *(
            [f"- order edges: {len(d['order_edges'])} (listed at the end)"]
            if d["order_edges"]
            else []
        ),
        f"- tuning {d['tuning_seconds']:.1f} s, tracing {d['trace_seconds']:.1f} s, "
        f"{d['trials']} trials",
    ]


def _host_facts(d: dict[str, Any]) -> list[str]:
    """The host peak against the host limit, and what limited the largest batch."""
    limit, by = d.get("host_memory_bytes"), d.get("max_batch_limited_by")
    allowed = format_bytes(limit) if limit else "no limit"
    facts = [f"- host peak: {format_bytes(d['predicted_host_peak_bytes'])} of {allowed} allowed"]
    return facts + ([f"- largest batch limited by {by}"] if by else [])


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def _short(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters without empty include/exclude lists."""
    return {k: v for k, v in params.items() if v not in ([], ())}
