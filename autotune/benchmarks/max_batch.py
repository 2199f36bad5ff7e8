"""Benchmark: the largest batch (ResNet-50, GPT-2) and 3D U-Net cube each method fits in 16 GiB.

Run `python -m autotune.benchmarks.max_batch [--trials 50] [--out results]`. For each device preset
(the papers' V100 with NVLink 2.0, and a V100 on PCIe Gen3 with a five times slower link) and each
method (no swapping, recompute only, the original tool's defaults, its auto-tuner, random search,
ours) it prints the largest batch (ResNet-50, GPT-2 small) or cube edge (the zoo's 3D U-Net and
the papers' Isensee 2017 U-Net, batch 1) whose predicted peak fits the default budget (safety
ratio x 16 GiB), the predicted overhead there, the time bound there (the least overhead any
plan could reach, `simulator.bounds`), the overhead at a size every swapping method fits, and
the search's wall time. Batch models' graphs come from two captures (affine family); 3D U-Net
graphs are captured per cube edge (sizes grow with its cube). Everything here is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.search.batching import (
    METHODS,
    SWAPPING,
    BatchSearch,
    CapturedSteps,
    StepFamily,
    Steps,
    largest_batches,
    largest_possible,
    method_at,
)
from autotune.search.core import Budget
from autotune.units import format_bytes

PAPER = {
    "resnet50": "4.9x batch (ISMM 2019)",
    "unet3d-isensee2017": "5.6x resolution (ISMM 2019)",
    "gpt2-small": "none (the papers ran no transformer)",
}
DEVICES = ("v100-16gb-nvlink2", "v100-16gb-pcie3")


@dataclass(frozen=True)
class Case:
    """A batch model (searched on batch size) and a volumetric one (searched on cube edge)."""

    batch_model: str
    cube_model: str
    cube_step: int  # the U-Net pools k times: its cube edge is a multiple of 2**k
    memory: int
    devices: tuple[str, ...]
    capture_batches: tuple[int, int] = (16, 32)


FULL = (
    Case("resnet50", "unet3d", 8, 16 << 30, DEVICES),
    Case("gpt2-small", "unet3d-isensee2017", 16, 16 << 30, DEVICES, (2, 4)),
)
QUICK = (Case("tiny-cnn", "tiny-unet3d", 4, 80 << 20, DEVICES[:1], (4, 8)),)


def _family(case: Case, device: Any) -> tuple[StepFamily, float]:
    from autotune.api import capture
    from autotune.zoo import get_entry

    zm = get_entry(case.batch_model).build()
    start = time.perf_counter()
    steps = StepFamily.capture(
        lambda b: capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=b),
        device,
        case.capture_batches,
    )
    return steps, time.perf_counter() - start


def _cubes(case: Case, device: Any) -> CapturedSteps:
    from autotune.api import capture
    from autotune.zoo import get_entry

    def at(k: int) -> Any:
        zm = get_entry(case.cube_model).build(cube=case.cube_step * k)
        return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=1)

    return CapturedSteps(at, device)


def _common_overheads(
    steps: Steps, found: dict[str, BatchSearch], budget: Budget, trials: int, seed: int
) -> tuple[int, dict[str, float | None]]:
    """Each method's overhead at the largest size all swapping methods fit."""
    sizes = [found[m].batch for m in SWAPPING if found[m].batch]
    common = min(sizes) if sizes else 0
    out: dict[str, float | None] = {}
    for m in METHODS[1:]:
        o = method_at(steps, m, common, budget, trials, seed) if common else None
        out[m] = o.best.overhead if o is not None and o.best is not None else None
    return common, out


def time_bound_overhead(steps: Steps, size: int, budget: Budget) -> float | None:
    """The time bound at `size` as an overhead (None where no plan fits, or at size 0)."""
    if not size:
        return None
    engine = steps.engine(size)
    bound = engine.time_bound(budget.bytes)
    base = engine.timeline.baseline_seconds if engine.timeline else None
    return bound / base if bound is not None and base else None


def _rows(
    model: str, device: str, steps: Steps, budget: Budget, trials: int, seed: int, scale: int
) -> dict[str, Any]:
    start = time.perf_counter()
    found = largest_batches(steps, budget, trials=trials, seed=seed)
    seconds = time.perf_counter() - start
    common, at_common = _common_overheads(steps, found, budget, trials, seed)
    base = found["no swapping"].batch or 1
    rows = []
    for m, b in found.items():
        rows.append(
            {
                "method": m,
                "max": b.batch * scale,
                "ratio": b.batch / base,
                "overhead": b.summary()["overhead"],
                "overhead_at_common": at_common.get(m, 1.0),
                "time_bound": time_bound_overhead(steps, b.batch, budget),
                "params": b.summary()["params"],
                "seconds": b.seconds,
            }
        )
    ceiling = largest_possible(steps, budget)
    rows.append(
        {
            "method": "lower bound (no plan fits more)",
            "max": ceiling * scale,
            "ratio": ceiling / base,
            "overhead": None,
            "overhead_at_common": None,
            "time_bound": None,
            "params": None,
            "seconds": 0.0,
        }
    )
    return {**table_head(model, device, budget, scale), "common": common * scale,
            "seconds": seconds, "rows": rows}  # fmt: skip


def table_head(model: str, device: str, budget: Budget, scale: int) -> dict[str, Any]:
    """What a results table is about: model, device, the unit of size, the budget."""
    return {
        "model": model,
        "device": device,
        "unit": "cube edge" if scale > 1 else "batch",
        "memory_bytes": budget.device_bytes,
        "ratio": budget.ratio,
    }


def run(trials: int, seed: int, cases: tuple[Case, ...] = FULL) -> list[dict[str, Any]]:
    tables = []
    for case in cases:
        tables += _run_case(trials, seed, case)
    return tables


def case_steps(case: Case) -> Iterator[tuple[str, Budget, StepFamily, CapturedSteps, float]]:
    """Per device of `case`: the budget, the batch model's steps (captured once: the presets
    share the V100's compute, so its costs, and differ in their link), the cube model's steps,
    and the batch model's capture seconds."""
    from simulator import get_preset

    family, trace = None, 0.0
    for device in case.devices:
        preset = get_preset(device).with_overrides(memory_bytes=case.memory)
        if family is None:
            family, trace = _family(case, preset)
        else:
            family = StepFamily(family.family, family.costs, preset, family.trace_seconds)
        yield device, Budget(preset.memory_bytes), family, _cubes(case, preset), trace


def _run_case(trials: int, seed: int, case: Case) -> list[dict[str, Any]]:
    tables = []
    for device, budget, family, cubes, trace in case_steps(case):
        table = _rows(case.batch_model, device, family, budget, trials, seed, 1)
        table["capture_seconds"] = trace
        tables.append(table)
        print(_markdown(table), flush=True)
        table = _rows(case.cube_model, device, cubes, budget, trials, seed, case.cube_step)
        table["capture_seconds"] = cubes.trace_seconds
        tables.append(table)
        print(_markdown(table), flush=True)
    return tables


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _markdown(t: dict[str, Any]) -> str:
    unit = t["unit"]
    memory = format_bytes(t["memory_bytes"])
    lines = [
        f"### {t['model']} on {t['device']} ({memory}, budget {t['ratio']:.2f} x): largest {unit}",
        "",
        f"Paper: {PAPER.get(t['model'], 'n/a')}. Search wall time {t['seconds']:.1f} s "
        f"(captures {t['capture_seconds']:.1f} s).",
        "",
        f"| method | largest {unit} | x no swap | overhead there | time bound there | "
        f"overhead at {unit} {t['common']} | search (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in t["rows"]:
        lines.append(
            f"| {r['method']} | {r['max']} | {r['ratio']:.2f} | {_fmt(r['overhead'], '.3f')} | "
            f"{_fmt(r.get('time_bound'), '.3f')} | {_fmt(r['overhead_at_common'], '.3f')} | "
            f"{r['seconds']:.1f} |"
        )
    if t["unit"] == "cube edge":
        base = t["rows"][0]["max"] or 1
        best = max(r["max"] for r in t["rows"] if r["params"] is not None)
        lines += [
            "",
            f"Largest cube: {best}^3 = {best / base:.2f}x the no-swap edge, "
            f"{(best / base) ** 3:.2f}x its voxels.",
        ]
    return "\n".join(lines) + "\n"


def search_args(description: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The options of a benchmark that searches: --trials, --seed, --out, --quick."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results")
    p.add_argument("--quick", action="store_true", help="tiny models, one device (CI-sized)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = search_args(__doc__, argv)
    start = time.perf_counter()
    tables = run(args.trials, args.seed, QUICK if args.quick else FULL)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = (
        "# Largest batch and cube per method\n\nGenerated by `python -m "
        f"autotune.benchmarks.max_batch --trials {args.trials}{' --quick' * args.quick}` in "
        f"{time.perf_counter() - start:.0f} s. All figures are simulated.\n\n"
    )
    (out / "max_batch.md").write_text(head + "\n".join(_markdown(t) for t in tables))
    (out / "max_batch.json").write_text(json.dumps(tables, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
