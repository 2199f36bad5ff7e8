"""The report's lines of text: its opening facts, the parameters as `name=value` pairs, and the
order edges, for report.md, report.html and `fit`'s printed summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.search.tuning import TuningResult

__all__ = ["edge_lines", "edge_saving", "facts", "params_line"]


def edge_lines(tuned: TuningResult) -> list[str]:
    """One bullet per order edge of the plan: which op waits for which."""
    return [f"- `{after}` waits for `{before}`" for before, after in tuned.plan.order_edges]


def facts(tuned: TuningResult) -> list[str]:
    """The report's opening bullets: device and budget, peaks, the plan, host memory, the
    parameters, the order edges and the time taken."""
    d = tuned.to_dict()
    recomputed = f", {d['recomputed_tensors']} recomputed" if d["recomputed_tensors"] else ""
    return [
        f"- {d['device']}, batch {d['batch_size']}"
        + (f", cube edge {d['cube']}" if "cube" in d else "")
        + f"; budget {format_bytes(d['budget_bytes'])} "
        f"({d['safety_ratio']:.2f} of {format_bytes(d['gpu_memory_bytes'])})",
        f"- peak: no swapping {format_bytes(d['baseline_peak_bytes'])}, tuned "
        f"{format_bytes(d['predicted_peak_bytes'])}, lower bound "
        f"{format_bytes(d['lower_bound_bytes'])} (resident + largest op)",
        f"- tuned: {d['swapped_tensors']} tensors swapped{recomputed}, overhead "
        f"{_x(d['predicted_overhead'])}",
        *_host_facts(d),
        f"- parameters: `{params_line(d['params'])}` (all in summary.json)",
        *_edge_facts(d),
        f"- tuning {d['tuning_seconds']:.1f} s, tracing {d['trace_seconds']:.1f} s, "
        f"{d['trials']} trials",
    ]


def _edge_facts(d: dict[str, Any]) -> list[str]:
    """How many order edges the plan has and what they save in its simulated peak."""
    edges, loops = d["order_edges"], d.get("serial_loops", [])
    if not edges and not loops:
        return []
    parts = [f"order edges: {len(edges)}"] * bool(edges)
    parts += [f"loops run one iteration at a time: {len(loops)}"] * bool(loops)
    parts += [edge_saving(d)] * bool(edge_saving(d))
    return [f"- {'; '.join(parts)}{' (listed at the end)' * bool(edges)}"]


def edge_saving(d: dict[str, Any]) -> str:
    """What the order edges save, from `peak_without_order_edges_bytes` ("" if unknown)."""
    unordered = d.get("peak_without_order_edges_bytes")
    if unordered is None:
        return ""
    more = unordered - d["predicted_peak_bytes"]
    higher = f"{format_bytes(more)} higher" if more > 0 else "no higher"
    return f"without them the same parameters peak {higher}"


def _host_facts(d: dict[str, Any]) -> list[str]:
    """The host peak against the host limit, and what limited the largest batch."""
    limit, by = d.get("host_memory_bytes"), d.get("max_batch_limited_by")
    allowed = format_bytes(limit) if limit else "no limit"
    facts = [f"- host peak: {format_bytes(d['predicted_host_peak_bytes'])} of {allowed} allowed"]
    return facts + ([f"- largest batch limited by {by}"] if by else [])


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def params_line(params: dict[str, Any]) -> str:
    """The plan's parameters as `name=value` pairs, sizes in units, those left at their
    defaults (off, none, zero) left out; the full set is in --json and summary.json."""
    from simulator.derive import PlanParams
    from simulator.params import PARAMS

    default = PlanParams().to_dict()
    sizes = {p.name for p in PARAMS if p.size}
    kept = {"n_tensors", "lb", "ub"} | (
        {"recompute_ops"} if params.get("recompute") != "none" else set()
    )
    shown = []
    for k, v in params.items():
        if v == [] or (v == default.get(k) and k not in kept):
            continue
        if k in sizes and isinstance(v, int) and v:
            v = format_bytes(v)
        shown.append(f"{k}={'all' if k == 'n_tensors' and v == -1 else v}")
    return " ".join(shown)
