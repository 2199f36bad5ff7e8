"""Benchmark: the limits in code, swept on the corpus (are they right beyond one model?).

Run `python -m autotune.benchmarks.constants [--models a,b] [--corpus results/corpus.json]
[--out results]` after `autotune.benchmarks.corpus`, whose sizes and tuned parameters it reads.
Per model, each in a fresh process, on `v100-16gb-nvlink2`, each constant set in turn to each
of its values (the others at theirs), everything simulated:

- `candidates.BACKWARD_GAP` (levels): at the no-swap largest size, the least-memory plan's peak
  over the lower bound;
- `recompute_chains.HOLD_STEPS` (steps) and `refine.GUARD_RELEASES`: at the tuned largest size
  with the tuned parameters, the peak, the predicted overhead and the seconds one evaluation
  took (its order edges found before);
- `engine.EDGE_REUSE`: at the tuned largest size, the least-memory peak over the bound and the
  tuned parameters' overhead with the order edges found at that size, against those found at
  the size whose lower bound is `EDGE_REUSE` times smaller (the farthest the search reuses).

Writes `constants.md` and `constants.json` (`{"models": [...]}`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autotune.benchmarks.common import write_result

SWEEP: dict[str, tuple[str, tuple[float, ...]]] = {
    "BACKWARD_GAP": ("simulator.candidates", (2, 4, 8)),
    "HOLD_STEPS": ("simulator.recompute_chains", (0, 4, 8)),
    "GUARD_RELEASES": ("simulator.refine", (0, 8, 32, 128)),
}


@contextmanager
def _set(name: str, value: float) -> Iterator[None]:
    """Module constant `name` (of `SWEEP`, or EDGE_REUSE) set to `value` for the block."""
    import importlib

    module = importlib.import_module(SWEEP[name][0] if name in SWEEP else "simulator.engine")
    kept = getattr(module, name)
    setattr(module, name, type(kept)(value))
    try:
        yield
    finally:
        setattr(module, name, kept)


def sweep_member(row: dict[str, Any]) -> dict[str, Any]:
    """The figures of the module's docstring for the corpus row `row`."""
    from autotune.benchmarks.corpus import DEVICE, _steps, member
    from autotune.search.core import LEAST_MEMORY_ORDERED
    from simulator import get_preset
    from simulator.derive import PlanParams

    m = member(row["name"])
    scale = m.cube_step or 1
    steps = _steps(m, get_preset(DEVICE))
    small, large = row["size"] // scale, row["max_batch_tuned"] // scale
    tuned = PlanParams.from_dict(row["params"])
    out: dict[str, Any] = {"name": m.name, "size": row["size"]}
    out["tuned_size"] = row["max_batch_tuned"]

    def fresh(n: int, edges: bool = True) -> Any:
        """A new engine at size `n`; with `edges`, its order edges found anew too."""
        steps._engines.pop(n, None)
        if edges:
            steps._shared.clear()
        return steps.engine(n)

    for value in SWEEP["BACKWARD_GAP"][1]:
        with _set("BACKWARD_GAP", value):
            engine = fresh(small)
            least = engine.evaluate(LEAST_MEMORY_ORDERED).peak_bytes
            out[f"BACKWARD_GAP={value}"] = {"least_over_bound": least / engine.lower_bound}
    fresh(large).serialized()  # the order edges, which neither constant changes: found once
    for name in ("HOLD_STEPS", "GUARD_RELEASES"):
        for value in SWEEP[name][1]:
            with _set(name, value):
                out[f"{name}={value}"] = _tuned(fresh(large, edges=False), tuned)
    out.update(_edge_reuse(steps, fresh, large, tuned, scale))
    return out


def _tuned(engine: Any, params: Any) -> dict[str, Any]:
    start = time.perf_counter()
    ev = engine.evaluate(params)
    return {
        "peak_bytes": ev.peak_bytes,
        "overhead": ev.overhead,
        "seconds": time.perf_counter() - start,
    }


def _edge_reuse(steps: Any, fresh: Any, large: int, tuned: Any, scale: int) -> dict[str, Any]:
    """The tuned size with its own order edges, and with those of the smallest size whose
    lower bound is within EDGE_REUSE of its own (found there first, then reused)."""
    from autotune.search.core import LEAST_MEMORY_ORDERED
    from simulator.engine import EDGE_REUSE

    out: dict[str, Any] = {}
    bound = steps.lower_bound(large)
    low, near = 2, large  # the lower bound grows with the size: bisect
    while low < near:
        mid = (low + near) // 2
        if EDGE_REUSE * steps.lower_bound(mid) >= bound:
            near = mid
        else:
            low = mid + 1
    for label, first in (("own", None), ("reused", near)):
        engine = fresh(large)
        if first is not None:
            steps._engines.pop(first, None)
            steps.engine(first).serialized()  # finds its edges, shared with `large`
            engine = steps.engine(large)
        least = engine.evaluate(LEAST_MEMORY_ORDERED).peak_bytes
        out[f"edges_{label}"] = {
            "found_at": (first or large) * scale,
            "least_over_bound": least / engine.lower_bound,
            **_tuned(engine, tuned),
        }
    return out


def _run_fresh(row: dict[str, Any]) -> dict[str, Any]:
    """`sweep_member` in a fresh process."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-m", "autotune.benchmarks.constants", "--one", json.dumps(row)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"name": row["name"], "error": tail[0][:300]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def markdown(models: list[dict[str, Any]], header: str) -> list[str]:
    keys = [f"{n}={v}" for n, (_, values) in SWEEP.items() for v in values]
    lines = [header, ""]
    lines += ["| model | " + " | ".join(keys) + " | edges own | edges reused |"]
    lines += ["|---" * (len(keys) + 3) + "|"]
    for r in models:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} |")
            continue
        cells = [_cell(r[k]) for k in keys] + [_cell(r["edges_own"]), _cell(r["edges_reused"])]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return lines


def _cell(fig: dict[str, Any]) -> str:
    """least / bound; or overhead and seconds of one evaluation; edges also where found."""
    parts = []
    if "least_over_bound" in fig:
        parts.append(f"{fig['least_over_bound']:.2f}")
    if "peak_bytes" in fig:
        over = fig["overhead"]
        parts.append(f"{over:.3f}x" if over is not None and math.isfinite(over) else "-")
        parts.append(f"{fig['peak_bytes'] / 2**30:.2f} GiB")
        parts.append(f"{fig['seconds']:.1f} s")
    if "found_at" in fig:
        parts.append(f"@{fig['found_at']}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="results/corpus.json")
    p.add_argument("--models", help="comma-separated corpus names (default: all of --corpus)")
    p.add_argument("--out", default="results")
    p.add_argument("--one", help=argparse.SUPPRESS)  # one corpus row, in this process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(sweep_member(json.loads(args.one))))
        return 0
    rows = [r for r in json.loads(Path(args.corpus).read_text())["models"] if "error" not in r]
    if args.models:
        rows = [r for r in rows if r["name"] in args.models.split(",")]
    start = time.perf_counter()
    models = []
    for row in rows:
        models.append(_run_fresh(row))
        print(markdown(models[-1:], "")[-1], flush=True)
    took = time.perf_counter() - start
    header = (
        "# The constants in code, swept on the corpus\n\n"
        f"Generated by `python -m autotune.benchmarks.constants` in {took:.0f} s, from "
        f"{args.corpus}. Cells: the least-memory peak over the lower bound (BACKWARD_GAP, "
        "at the no-swap largest size); the tuned plan's overhead, peak and seconds of one "
        "evaluation at the tuned largest size (HOLD_STEPS, GUARD_RELEASES); both for the "
        "order edges found at that size and for those reused from where the search would "
        "reuse them at the farthest (@ the size they were found at)."
    )
    write_result(Path(args.out), "constants", markdown(models, header), {"models": models})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
