"""The tuning report: summary.json, the best plan, the trials and report.md with the tables.

Every figure comes from the tuning result (simulated) or the study (recorded per trial); the
tables are pandas frames so that the same data can feed plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from autotune.tuning import TunedGraph

__all__ = ["batches_table", "methods_table", "trials_table", "write_report"]

GIB = float(1 << 30)


def _gib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / GIB, 3)


def methods_table(tuned: TunedGraph) -> pd.DataFrame:
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


def batches_table(tuned: TunedGraph) -> pd.DataFrame | None:
    """One row per method: the largest batch it fits, as a multiple of the no-swap batch."""
    import pandas as pd

    if tuned.batches is None:
        return None
    base = tuned.batches["no swapping"].batch or 1
    rows = [
        {
            "method": method,
            "max batch": b.batch,
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


def write_report(tuned: TunedGraph, directory: Path) -> Path:
    """Write the report files into `directory` and return the path of report.md."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(tuned.to_dict(), indent=1) + "\n")
    (directory / "plan.json").write_text(json.dumps(tuned.plan.to_dict(), indent=1) + "\n")
    trials = trials_table(tuned.study)
    if trials is not None:
        trials.to_csv(directory / "trials.csv", index=False)
    path = directory / "report.md"
    path.write_text(_markdown(tuned))
    return path


def _markdown(tuned: TunedGraph) -> str:
    d = tuned.to_dict()
    lines = [
        "# Swap tuning report",
        "",
        f"- device preset: {d['device']}; budget {format_bytes(d['budget_bytes'])} "
        f"({d['safety_ratio']:.2f} of {format_bytes(d['gpu_memory_bytes'])})",
        f"- batch size: {d['batch_size']}",
        f"- lower bound (resident + largest op): {format_bytes(d['lower_bound_bytes'])}",
        f"- no swapping: peak {format_bytes(d['baseline_peak_bytes'])}",
        f"- tuned: peak {format_bytes(d['predicted_peak_bytes'])}, "
        f"{d['swapped_tensors']} tensors swapped, overhead {_x(d['predicted_overhead'])}",
        f"- parameters: `{json.dumps(_short(d['params']))}`",
        f"- tuning {d['tuning_seconds']:.1f} s, tracing {d['trace_seconds']:.1f} s, "
        f"{d['trials']} trials",
        "",
        "## Methods at this batch (same engine, same budget)",
        "",
        methods_table(tuned).to_markdown(index=False),
        "",
    ]
    batches = batches_table(tuned)
    if batches is not None:
        lines += ["## Largest batch per method", "", batches.to_markdown(index=False), ""]
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def _short(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters without empty include/exclude lists."""
    return {k: v for k, v in params.items() if v not in ([], ())}
