"""Benchmark: the tool on a corpus of models nobody wrote for it (`autotune.corpus`, the zoo).

Run `python -m autotune.benchmarks.corpus [--trials 30] [--out results] [--models a,b]`. Per
model, each in a fresh process, on `v100-16gb-nvlink2` (16 GiB, default budget):

- the largest size (batch; cube edge for volumetric models) without swapping, with the tuned
  plan (ours, `trials` trials a probe) and the lower bound's (no plan fits more);
- at the no-swap largest size: the no-swap peak, the lower bound, and the least peak the tuner
  reaches (a study of `trials` trials aiming below the bound: its nearest plan);
- the predicted overhead at the tuned largest size;
- `exact`: a small variant tuned by `autotune.fit` for a budget 30 % of the way from its
  least-memory plan's peak to the least peak it reaches without swapping (order edges alone,
  so that the plan must swap or recompute; where order edges alone reach lower, as on
  MobileNetV2's, the tuned plan swaps nothing and the least-memory plan is compared
  instead), one training step of the tuned step against
  the original twin's, every weight and optimizer variable compared bitwise (on the CPU, with
  one inter-op thread, as the tool measures: with two, InceptionV3's own step is not
  reproducible); n/a where the original step run on a third twin already differs (nothing
  can be compared).

Writes `corpus.md` and `corpus.json` (`{"models": [...]}`). Everything but `exact` is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.benchmarks.common import write_result
from autotune.units import format_bytes

DEVICE = "v100-16gb-nvlink2"
#: where between its least-memory plan's peak (0) and its least peak without swapping (1)
#: the exactness check tunes the small variant for: low, so that the plan swaps and
#: recomputes much
EXACT_SHARE = 0.3


@dataclass(frozen=True)
class Member:
    """A corpus model: its zoo name, how its size is searched, and its small variant."""

    name: str
    capture_batches: tuple[int, int] = (4, 8)
    small: dict[str, Any] = field(default_factory=dict)
    small_size: int = 2  # the small variant's batch (or cube edge)

    @property
    def cube_step(self) -> int:
        """The zoo entry's cube step for a volumetric model (searched on its cube edge in
        these steps), else 0."""
        from autotune.zoo import get_entry

        entry = get_entry(self.name)
        return entry.cube_step if entry.default_cube else 0

    @property
    def unit(self) -> str:
        return "cube edge" if self.cube_step else "batch"

    def small_variant(self, seed: int = 3) -> tuple[Any, int]:
        """The small variant built (weights from `seed`) and the batch to capture it at."""
        from autotune.zoo import get_entry

        cube = {"cube": self.small_size} if self.cube_step else {}
        built = get_entry(self.name).build(seed=seed, **cube, **self.small)
        return built, 1 if self.cube_step else self.small_size


_SMALL_IMAGE = {"side": 64, "classes": 10}
_SMALL_TEXT = {"layers_": 2, "width": 64, "heads": 2}
_TEXT = (2, 4)  # the batches a language model is captured at (its tensors are large)

CORPUS = (
    Member("resnet50v2", small=_SMALL_IMAGE),
    Member("mobilenetv2", small=_SMALL_IMAGE),
    Member("efficientnetb0", small=_SMALL_IMAGE),
    Member("densenet121", small=_SMALL_IMAGE),
    Member("convnext-tiny", small=_SMALL_IMAGE),
    Member("inceptionv3", small={"side": 75, "classes": 10}),
    Member("vit-b16", small={"side": 32, "patch": 8, "classes": 10, **_SMALL_TEXT}),
    Member("bert-base", capture_batches=_TEXT, small={"seq": 32, "vocab": 100, **_SMALL_TEXT}),
    Member("gpt2-small", capture_batches=_TEXT, small={"context": 32, "vocab": 100, **_SMALL_TEXT}),
    Member("transformer-base", capture_batches=_TEXT, small={"source": 16, "target": 16,
                                                             "vocab": 100, **_SMALL_TEXT}),
    Member("unet2d", small={"side": 32, "filters": 8, "depth": 3}),
    Member("lstm-classifier", small={"seq": 8, "vocab": 100, "embed": 16, "units": 32}),
    Member("gru-seq2seq", small={"source": 6, "target": 6, "vocab": 50, "embed": 16,
                                 "units": 32}),
    Member("lstm-classifier-loop", small={"seq": 8, "vocab": 100, "embed": 16, "units": 32}),
    Member("gru-seq2seq-loop", small={"source": 6, "target": 6, "vocab": 50, "embed": 16,
                                      "units": 32}),
    Member("unet3d", small={"filters": (4, 8, 16, 32)}, small_size=16),
    Member("unet3d-isensee2017", small={"base_filters": 4}, small_size=16),
)  # fmt: skip


def member(name: str) -> Member:
    found = [m for m in CORPUS if m.name == name]
    if not found:
        raise SystemExit(f"unknown corpus model {name!r}; the corpus: {', '.join(_names())}")
    return found[0]


def _names() -> list[str]:
    return [m.name for m in CORPUS]


def measure_member(m: Member, trials: int, seed: int) -> dict[str, Any]:
    """The simulated figures of `m` (see the module's docstring)."""
    from autotune.search.batching import largest_batch, largest_possible, method_at
    from autotune.search.core import Budget
    from simulator import get_preset
    from simulator.derive import PlanParams

    preset = get_preset(DEVICE)
    budget = Budget(preset.memory_bytes)
    start = time.perf_counter()
    steps = _steps(m, preset)
    bound = largest_possible(steps, budget)
    plain = largest_batch(steps, "no swapping", budget, trials=1, seed=seed, low=2, high=bound)
    size = max(2, plain.batch)
    tuned = largest_batch(steps, "ours", budget, trials=trials, seed=seed, low=size, high=bound)
    engine = steps.engine(size)
    no_swap = engine.evaluate(PlanParams(n_tensors=0)).peak_bytes
    below = Budget(engine.lower_bound, ratio=1.0)
    least = method_at(steps, "ours", size, below, trials, seed).shown
    scale = m.cube_step or 1
    best = tuned.outcome.best if tuned.outcome is not None else None
    return {
        "name": m.name,
        "unit": m.unit,
        "size": size * scale,
        "no_swap_peak_bytes": no_swap,
        "lower_bound_bytes": engine.lower_bound,
        "least_peak_bytes": least.peak_bytes if least is not None else None,
        "max_batch_no_swap": plain.batch * scale,
        "max_batch_tuned": tuned.batch * scale,
        "max_batch_bound": bound * scale,
        "overhead": best.overhead if best is not None else None,
        "params": best.params.to_dict() if best is not None else None,
        "seconds": time.perf_counter() - start,
    }


def _steps(m: Member, preset: Any) -> Any:
    from autotune.api import capture
    from autotune.search.batching import CapturedSteps, StepFamily
    from autotune.search.cubes import cube_capturer
    from autotune.zoo import get_entry

    entry = get_entry(m.name)
    if m.cube_step:
        return CapturedSteps(cube_capturer(lambda e: entry.build(cube=e), m.cube_step, 1), preset)
    zm = entry.build()

    def at(b: int) -> Any:
        return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=b)

    return StepFamily.or_captures(at, preset, m.capture_batches)


def exact_member(m: Member, trials: int, seed: int) -> dict[str, Any]:
    """Tune the small variant of `m` with `autotune.fit` at EXACT_SHARE (see there)
    and compare one training step with the original twin's, bitwise."""
    import numpy as np

    from autotune.api import build_engine, capture
    from autotune.run.measure import example_tensors
    from autotune.search.core import LEAST_MEMORY_ORDERED
    from simulator import get_preset
    from simulator.derive import PlanParams

    (a, batch), (b, _), (c, _) = m.small_variant(), m.small_variant(), m.small_variant()
    original = capture(a.model, loss=a.loss, optimizer=a.optimizer, batch_size=batch)
    again = capture(c.model, loss=c.loss, optimizer=c.optimizer, batch_size=batch)
    engine = build_engine(original, get_preset(DEVICE))
    # the top is the least peak without swapping (order edges alone): below it a plan that
    # fits must swap or recompute, so that the comparison tests a rewrite
    peak = engine.evaluate(PlanParams(n_tensors=0, serialize=True)).peak_bytes
    least = engine.evaluate(LEAST_MEMORY_ORDERED).peak_bytes
    tuned, share = _tuned_small(b, batch, least, peak, trials, seed)
    plan, step, fallback = _rewriting(tuned, b, batch)
    inputs = example_tensors(original.specs, seed=7)
    original.concrete_function(*inputs)
    again.concrete_function(*inputs)
    step(*inputs)
    state_a, state_b, state_c = ([*x.model.weights, *x.optimizer.variables] for x in (a, b, c))
    same = [np.array_equal(np.asarray(va), np.asarray(vb)) for va, vb in zip(state_a, state_b)]
    repeat = [np.array_equal(np.asarray(va), np.asarray(vc)) for va, vc in zip(state_a, state_c)]
    return {
        # None: the original step itself is not reproducible, so no comparison can say
        "exact": all(same) if all(repeat) else None,
        "exact_differing": same.count(False),
        "exact_original_differing": repeat.count(False),
        "exact_variables": len(state_a),
        "exact_plan": f"{len(plan.swaps)} swaps, {len(plan.recomputes)} recomputes",
        "exact_rewrites": len(plan.swaps) + len(plan.recomputes),
        "exact_least_memory": fallback,
        "exact_fits": tuned is not None and tuned.fits,
        "exact_share": share,
    }


def _tuned_small(
    b: Any, batch: int, least: int, peak: int, trials: int, seed: int
) -> tuple[Any, float]:
    """`autotune.fit` of the small variant `b` at EXACT_SHARE of the way from `least` to
    `peak`, or halfway from there up if no plan fits; None if none fits there either."""
    import contextlib
    import tempfile

    import autotune
    from autotune.search.result import NoFitError

    for share in (EXACT_SHARE, (1 + EXACT_SHARE) / 2):
        with tempfile.TemporaryDirectory() as out, contextlib.suppress(NoFitError):
            tuned = autotune.fit(
                b.model, loss=b.loss, optimizer=b.optimizer, batch_size=batch, device=DEVICE,
                gpu_memory=int(least + share * (peak - least)), safety_ratio=1.0,
                trials=trials, seed=seed, out=out,
            )  # fmt: skip
            return tuned, share
    return None, share


def _rewriting(tuned: Any, b: Any, batch: int) -> tuple[Any, Any, str]:
    """The plan and step the exactness check runs, and why it is not `tuned`'s if it is
    not: `tuned`'s; where it swaps and recomputes nothing (order edges alone reach lower on
    the small variant), or no plan fit as TensorFlow runs it (`tuned` None), the least-memory
    plan's, which swaps every candidate, on the step of the small variant `b`."""
    from autotune.api import build_engine, capture
    from autotune.search.core import LEAST_MEMORY_ORDERED
    from rewriter.apply import apply_plan
    from simulator import get_preset

    if tuned is not None and (tuned.plan.swaps or tuned.plan.recomputes):
        return tuned.plan, tuned, ""
    if tuned is None:
        captured = capture(b.model, loss=b.loss, optimizer=b.optimizer, batch_size=batch)
        why = "no tuned plan fits as run"
    else:
        captured, why = tuned.captured, "the tuned one swaps nothing"
    plan = build_engine(captured, get_preset(DEVICE)).evaluate(LEAST_MEMORY_ORDERED).plan
    return plan, apply_plan(captured, plan), why


def _exact_cell(r: dict[str, Any]) -> str:
    n = r["exact_variables"]
    if r["exact"] is None:
        return f"n/a (the original run twice differs in {r['exact_original_differing']}/{n})"
    if r.get("exact_rewrites") == 0:
        return "untested (the plan swaps and recomputes nothing)"
    cell = "yes" if r["exact"] else f"no ({r['exact_differing']}/{n})"
    why = r.get("exact_least_memory")
    if why is True:  # a file written before the reason was recorded
        why = "the tuned one swaps nothing"
    if why:
        return f"{cell} (the least-memory plan: {why})"
    share = r.get("exact_share", EXACT_SHARE)
    return cell if share == EXACT_SHARE else f"{cell} (tuned {share:.0%} of the way up)"


def _one(name: str, trials: int, seed: int, exact_trials: int) -> dict[str, Any]:
    m = member(name)
    out = measure_member(m, trials, seed)
    out.update(exact_member(m, exact_trials, seed))
    return out


def _run_fresh(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """`_one` in a fresh process (captures and TensorFlow's memory do not pile up), with one
    inter-op thread: a step whose ops race for their inputs' buffers (an AddN of three or more
    terms sums them from the one whose buffer it can take over) is not reproducible with
    more, and then no comparison can say whether a plan changed it."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTEROP_THREADS": "1"}
    cmd = [sys.executable, "-m", "autotune.benchmarks.corpus", "--one", name,
           "--trials", str(args.trials), "--seed", str(args.seed),
           "--exact-trials", str(args.exact_trials)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"name": name, "error": tail[0][:300]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _gib(n: int | None) -> str:
    return "n/a" if n is None else format_bytes(n)


def _ratio(a: int | None, b: int | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def markdown(models: list[dict[str, Any]], header: str) -> list[str]:
    lines = [
        "# The corpus: models nobody wrote for the tool",
        "",
        header,
        "",
        "At the largest size without swapping: the no-swap peak, the lower bound (no plan",
        "peaks lower) and the least peak the tuner reached, with that peak over the bound.",
        "Largest sizes on v100-16gb-nvlink2 (16 GiB, budget 0.91 x); overhead is the tuned",
        "plan's predicted step time over the no-swap step's at its largest size; exact: one",
        "step of a small variant tuned 30 % of the way from its least peak to the least it",
        "reaches without swapping (order edges alone), bitwise on the CPU.",
        "",
        "| model | unit | at | no swap | bound | least | least / bound | largest: no swap | "
        "tuned | bound | tuned / bound | overhead | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in models:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * 11)
            continue
        overhead = "n/a" if r["overhead"] is None else f"{r['overhead']:.2f}x"
        exact = _exact_cell(r)
        lines.append(
            f"| {r['name']} | {r['unit']} | {r['size']} | {_gib(r['no_swap_peak_bytes'])} | "
            f"{_gib(r['lower_bound_bytes'])} | {_gib(r['least_peak_bytes'])} | "
            f"{_ratio(r['least_peak_bytes'], r['lower_bound_bytes'])} | "
            f"{r['max_batch_no_swap']} | {r['max_batch_tuned']} | {r['max_batch_bound']} | "
            f"{_ratio(r['max_batch_tuned'], r['max_batch_bound'])} | {overhead} | {exact} |"
        )
    return lines


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30, help="trials a probe of the size search")
    p.add_argument("--exact-trials", type=int, default=20, help="trials of the exactness fit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results")
    p.add_argument("--models", default=",".join(_names()), help="comma-separated zoo names")
    p.add_argument("--one", help=argparse.SUPPRESS)  # one model, in this process
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.one:
        print(json.dumps(_one(args.one, args.trials, args.seed, args.exact_trials)))
        return 0
    start = time.perf_counter()
    models = []
    for name in args.models.split(","):
        member(name)
        models.append(_run_fresh(name, args))
        print(markdown(models[-1:], "")[-1], flush=True)
    header = (
        f"Generated by `python -m autotune.benchmarks.corpus --trials {args.trials}` in "
        f"{time.perf_counter() - start:.0f} s."
    )
    write_result(Path(args.out), "corpus", markdown(models, header), {"models": models})
    return 0


if __name__ == "__main__":
    sys.exit(main())
