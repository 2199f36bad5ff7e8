"""Benchmark: what recomputing beside swapping buys in step time, against the time bound.

Run `python -m autotune.benchmarks.recompute [--trials 50] [--out results]`. For ResNet-50 (batch
size) and the zoo's 3D U-Net (cube edge, batch 1) on both V100 presets (16 GiB) it finds the
largest size of three methods: swap only (ours with `recompute="none"`), recompute only (no
swapping, every chain of up to `RECOMPUTE_MAX_OPS` pure ops recomputed, convolutions
included whatever they cost: the baseline in the manner of `tf.recompute_grad`) and swap +
recompute (ours, recomputes searched).
At the swap-only largest size, at each method's own largest size and on a grid up to the
largest, it gives each method's predicted overhead (step time over the no-swap step's; n/a where
the method fits no plan) and the time bound (`simulator.bounds`: the least overhead any plan
could reach there). Everything here is simulated, with Grappler's per-op costs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks.max_batch import (
    DEVICES,
    Case,
    case_steps,
    search_args,
    table_head,
    time_bound_overhead,
)
from autotune.search.batching import Steps, largest_batch, largest_possible, method_at
from autotune.search.core import Budget
from autotune.units import format_bytes

#: each compared method: the search method and what it may do with recomputes
MODES = {
    "swap only": ("ours", "none"),
    "recompute only": ("recompute only", "none"),
    "swap + recompute": ("ours", "search"),
}
FULL = (Case("resnet50", "unet3d", 8, 16 << 30, DEVICES),)
QUICK = (Case("tiny-cnn", "tiny-unet3d", 4, 80 << 20, DEVICES[:1], (4, 8)),)
#: sizes on the overhead curve besides the methods' largest
GRID = 8


def _largest(steps: Steps, budget: Budget, trials: int, seed: int) -> dict[str, int]:
    """The largest size of no swapping and of each compared method."""
    ceiling = largest_possible(steps, budget)
    found = {"no swapping": 0, **dict.fromkeys(MODES, 0)}
    found["no swapping"] = largest_batch(
        steps, "no swapping", budget, trials=trials, seed=seed, low=2, high=ceiling
    ).batch
    low = max(2, found["no swapping"])
    for name, (method, recompute) in MODES.items():
        found[name] = largest_batch(
            steps, method, budget, trials=trials, seed=seed, low=low, high=ceiling,
            full_outcome=False, recompute=recompute,
        ).batch  # fmt: skip
    return found


def _at(steps: Steps, size: int, budget: Budget, trials: int, seed: int) -> dict[str, Any]:
    """Each method's overhead at `size` (None where it fits no plan) and the time bound."""
    row: dict[str, Any] = {"size": size}
    for name, (method, recompute) in MODES.items():
        best = method_at(steps, method, size, budget, trials, seed, recompute=recompute).best
        row[name] = best.overhead if best is not None else None
        if best is not None and name == "swap + recompute":
            row["recomputed"] = best.plan.recomputed_tensors
            row["swapped"] = len(best.plan.swaps)
    row["time bound"] = time_bound_overhead(steps, size, budget)
    return row


def _grid(low: int, high: int, extra: list[int]) -> list[int]:
    step = max(1, (high - low) // (GRID - 1))
    return sorted({*range(low, high + 1, step), *extra, high})


def table(
    model: str, device: str, steps: Steps, budget: Budget, trials: int, seed: int, scale: int
) -> dict[str, Any]:
    start = time.perf_counter()
    found = _largest(steps, budget, trials, seed)
    own = [found[m] for m in MODES if found[m]]
    top = max(own, default=0)
    sizes = _grid(max(2, found["no swapping"]), top, own) if top else []
    rows = [_at(steps, n, budget, trials, seed) for n in sizes]
    for r in rows:
        r["largest of"] = [m for m in MODES if found[m] == r["size"]]
        r["size"] *= scale
    return {
        **table_head(model, device, budget, scale),
        "largest": {m: n * scale for m, n in found.items()},
        "lower_bound": largest_possible(steps, budget) * scale,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def run(trials: int, seed: int, cases: tuple[Case, ...] = FULL) -> list[dict[str, Any]]:
    tables = []
    for case in cases:
        for device, budget, family, cubes, _ in case_steps(case):
            for model, steps, scale in (
                (case.batch_model, family, 1),
                (case.cube_model, cubes, case.cube_step),
            ):
                tables.append(table(model, device, steps, budget, trials, seed, scale))
                print(markdown(tables[-1]), flush=True)
    return tables


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(t: dict[str, Any]) -> str:
    unit, largest = t["unit"], t["largest"]
    sizes = ", ".join(f"{m} {n}" for m, n in largest.items())
    lines = [
        f"### {t['model']} on {t['device']} ({format_bytes(t['memory_bytes'])}, budget "
        f"{t['ratio']:.2f} x)",
        "",
        f"Largest {unit}: {sizes}; no plan fits more than {t['lower_bound']} (lower bound). "
        f"Search wall time {t['seconds']:.0f} s.",
        "",
        f"| {unit} | largest of | " + " | ".join(MODES) + " | time bound | swap + recompute: "
        "swapped, recomputed |",
        "|---|---|" + "---|" * (len(MODES) + 2),
    ]
    for r in t["rows"]:
        cells = " | ".join(_x(r[m]) for m in MODES)
        made = f"{r['swapped']}, {r['recomputed']}" if "recomputed" in r else "n/a"
        lines.append(
            f"| {r['size']} | {', '.join(r['largest of']) or '-'} | {cells} | "
            f"{_x(r['time bound'])} | {made} |"
        )
    return "\n".join(lines) + "\n"


def curves(tables: list[dict[str, Any]]) -> list[Any]:
    """The overhead curves of `tables` for `autotune.report.plots.render_overhead_curves`."""
    from autotune.report.plots import OverheadCurve

    return [
        OverheadCurve(
            f"{t['model']} on {t['device']}",
            t["unit"],
            [r["size"] for r in t["rows"]],
            {m: [r[m] for r in t["rows"]] for m in MODES},
            [r["time bound"] for r in t["rows"]],
            {m: t["largest"][m] for m in MODES},
        )
        for t in tables
    ]


def main(argv: list[str] | None = None) -> int:
    args = search_args(__doc__, argv)
    start = time.perf_counter()
    tables = run(args.trials, args.seed, QUICK if args.quick else FULL)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from autotune.report.plots import render_overhead_curves

    render_overhead_curves(curves(tables)).savefig(out / "recompute.png", dpi=100)
    head = (
        "# Recompute beside swapping: overhead against size\n\nGenerated by `python -m "
        f"autotune.benchmarks.recompute --trials {args.trials}{' --quick' * args.quick}` in "
        f"{time.perf_counter() - start:.0f} s. All figures are simulated (Grappler's per-op "
        "costs). Overhead: predicted step time over the no-swap step's; n/a: the method fits "
        "no plan there. Time bound: the least overhead any plan could reach there "
        "(`simulator/bounds.py`).\n\n![overhead against size](recompute.png)\n\n"
    )
    (out / "recompute.md").write_text(head + "\n".join(markdown(t) for t in tables))
    (out / "recompute.json").write_text(json.dumps(tables, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
