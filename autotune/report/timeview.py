"""The report's time view: compute, the ops a plan re-runs, the two copy streams and the waits
by what they wait for (swap-outs, swap-ins, re-runs waiting for swap-ins) and by phase
(forward, backward), before and after the plan. A data function (plain numbers, tested) and
a matplotlib renderer, as in `autotune.report.plots`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from simulator.engine import Evaluation

__all__ = ["WAIT_ROWS", "TimeView", "render_time_view", "time_view"]


#: what the step waits for (`TimeResult.waits`), as the time view names its rows
WAIT_ROWS = {
    "swap-out": "waiting for swap-outs",
    "swap-in": "waiting for swap-ins",
    "recompute input": "re-runs waiting for swap-ins",
}


@dataclass(frozen=True)
class TimeView:
    """Busy intervals (start, length in seconds) of each stream, before and after the plan:
    compute, the ops a plan re-runs, the waits by what they wait for (`WAIT_ROWS`), copies;
    and, where the backward pass's first op is known, when it starts and each kind of wait's
    seconds in the forward and in the backward pass."""

    compute_before: list[tuple[float, float]]
    compute_after: list[tuple[float, float]]
    rerun: list[tuple[float, float]]
    waits: dict[str, list[tuple[float, float]]]
    d2h: list[tuple[float, float]]
    h2d: list[tuple[float, float]]
    step_before: float
    step_after: float
    backward_at: float | None = None
    backward_before: float | None = None  # when it starts without the plan
    #: per kind of wait, (seconds in the forward pass, seconds in the backward pass)
    by_phase: dict[str, tuple[float, float]] | None = None


def time_view(tuned: Evaluation, backward_op: str | None = None) -> TimeView | None:
    """The streams of a plan's time model (None when the step was simulated without costs);
    `backward_op`: the backward pass's first op, which splits the waits by phase."""
    t = tuned.result.time
    if t is None:
        return None
    base, cost = t.timeline.base_end, t.timeline.cost
    # the moments the schedule stops: a stall before an op, a recompute after its trigger
    pauses = sorted(
        [(p, 0) for p in t.stalls] + [(p, 1) for p in t.recomputed if p + 1 < len(base)]
    )
    compute, rerun = [], []
    waits: dict[str, list[tuple[float, float]]] = {k: [] for k in WAIT_ROWS}
    first = t.timeline.order.position.get(backward_op, -1) if backward_op else -1
    phases = {k: [0.0, 0.0] for k in WAIT_ROWS}
    start = shift = 0.0
    for p, after in pauses:
        at = base[p] - (0.0 if after else cost[p]) + shift
        compute.append((start, at - start))
        if after:
            held, seconds = t.recompute_waits.get(p, 0.0), t.recomputed[p]
            kind = "recompute input"
            rerun.append((at + held, seconds))
        else:
            held, seconds = t.stalls[p], 0.0
            kind = t.stall_causes.get(p, "swap-in")
        waits[kind].append((at, held))
        phases[kind][int(0 <= first <= p)] += held
        shift += held + seconds
        start = at + held + seconds
    compute.append((start, t.step_seconds - start))
    d2h = [(tr.start, tr.end - tr.start) for tr in t.transfers if tr.direction == "d2h"]
    h2d = [(tr.start, tr.end - tr.start) for tr in t.transfers if tr.direction == "h2d"]
    before = [(0.0, t.baseline_seconds)]
    view = TimeView(before, compute, rerun, waits, d2h, h2d, t.baseline_seconds, t.step_seconds)
    if first < 0:
        return view
    return replace(
        view,
        backward_at=t.end()[first] - cost[first] - t.stalls.get(first, 0.0),
        backward_before=base[first] - cost[first],
        by_phase={k: (f, b) for k, (f, b) in phases.items()},
    )


def render_time_view(data: TimeView) -> Figure:
    """Streams as horizontal bars (ms): compute before, then compute, re-run ops, the waits
    by what they wait for (each with its total, by phase where known) and the copies after;
    a dashed line where the backward pass starts."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.subplots()
    phase = data.by_phase or {}
    rows: list[tuple[str, list[tuple[float, float]], str]] = [
        ("compute, no swapping", data.compute_before, "0.6"),
        ("compute, with the plan", data.compute_after, "C0"),
        (_total("re-run ops (recompute)", data.rerun), data.rerun, "C2"),
        *(
            (_total(WAIT_ROWS[k], bars, phase.get(k)), bars, color)
            for (k, bars), color in zip(data.waits.items(), ("#b2182b", "#f4a582", "#4d4d4d"))
        ),
        ("swap-out (device to host)", data.d2h, "C1"),
        ("swap-in (host to device)", data.h2d, "C4"),
    ]
    for i, (_, bars, color) in enumerate(rows):
        ms = [(s * 1e3, w * 1e3) for s, w in bars]
        ax.broken_barh(ms, (i - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    if data.backward_at is not None and data.backward_before is not None:
        _phase_marks(ax, data.backward_before * 1e3, data.backward_at * 1e3, len(rows))
    ax.set_xlabel("time in the step (ms)")
    ratio = f" ({data.step_after / data.step_before:.2f}x)" if data.step_before else ""
    ax.set_title(
        f"Step time {data.step_before * 1e3:.1f} ms without swapping, "
        f"{data.step_after * 1e3:.1f} ms with the plan{ratio}"
    )
    return fig


def _phase_marks(ax: Any, before: float, after: float, rows: int) -> None:
    """Dashed lines where the backward pass starts (ms): without the plan across its row,
    with the plan across the others."""
    style = {"color": "0.3", "linestyle": "--", "linewidth": 1}
    ax.plot([before, before], [-0.5, 0.5], **style)
    ax.plot([after, after], [0.5, rows - 0.5], **style)
    ax.annotate(" backward pass", (after, 0.5), ha="left", va="bottom", fontsize=8, color="0.3")


def _total(
    label: str, bars: list[tuple[float, float]], phases: tuple[float, float] | None = None
) -> str:
    total = f"{label}: {sum(w for _, w in bars) * 1e3:.1f} ms"
    if phases is None or not bars:
        return total
    return f"{total} ({phases[0] * 1e3:.1f} forward, {phases[1] * 1e3:.1f} backward)"
