"""Benchmark: predicted against measured peak, Grappler's static estimate beside, simulation speed.

Run `python -m autotune.benchmarks.simulator_accuracy [--quick] [--out results]`. Every measured
figure is the median over fresh processes (variables of an earlier model would inflate it), with
TF_CPU_ALLOCATOR_USE_BFC=true and one inter-op thread, as `autotune measure` does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.benchmarks.common import cli_json
from autotune.units import format_bytes

FULL = [
    ("resnet50", 8, None),
    ("resnet50", 16, None),
    ("unet3d", 1, 32),
    ("unet3d-isensee2017", 1, 64),
    ("unet3d-isensee2017", 1, 96),
    ("gpt2-small", 1, None),
    ("tiny-cnn", 48, None),
    ("tiny-cnn", 128, None),
    ("tiny-unet3d", 2, 16),
    ("tiny-unet3d", 8, 16),
    ("tiny-transformer", 16, None),
    ("tiny-transformer", 64, None),
]
QUICK = [("tiny-cnn", 48, None), ("tiny-unet3d", 8, 16), ("tiny-transformer", 16, None)]
#: cases run again with the CPU kernels this machine does not use by default (oneDNN on or off)
OTHER_KERNELS = [("resnet50", 8, None), *(case for case in FULL if case[0].startswith("tiny"))]


class _Errors:
    """Errors of the two predictions against the measured median."""

    predicted: int
    categorized: int
    measured: int

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def categorized_error(self) -> float:
        return self.categorized / self.measured - 1


@dataclass
class Row(_Errors):
    model: str
    batch: int
    cube: int | None
    predicted: int
    categorized: int
    live: int
    measured: int
    measured_all: list[int]
    grappler: int
    grappler_seconds: float
    simulate_seconds: float
    recorded: int
    recorded_measured: int
    orders: tuple[int, int] = (0, 0)  # the smallest and largest peak of the drawn orders

    @property
    def recorded_error(self) -> float:
        return self.recorded / self.recorded_measured - 1

    @property
    def grappler_error(self) -> float:
        return self.grappler / self.measured - 1


@dataclass
class OtherRow(_Errors):
    """A case simulated and measured in processes forced to the other CPU kernels."""

    model: str
    batch: int
    cube: int | None
    onednn: bool
    predicted: int
    categorized: int
    measured: int
    measured_all: list[int]


def _model_args(model: str, batch: int, cube: int | None) -> list[str]:
    return ["--model", model, "--batch-size", str(batch)] + (["--cube", str(cube)] if cube else [])


def _case(model: str, batch: int, cube: int | None, processes: int) -> Row:
    """Simulate and estimate in this process; measure in `processes` fresh ones."""
    from autotune.api import capture, simulate_captured
    from autotune.zoo import get_entry
    from rewriter.grappler import grappler_peak

    zm = get_entry(model).build(cube=cube)
    cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=batch)
    sim = simulate_captured(cap, schedule="executor")
    categorized = simulate_captured(cap, schedule="categorized")
    g_peak, g_seconds = grappler_peak(cap.concrete_function)
    args = _model_args(model, batch, cube)
    peaks = [int(cli_json("measure", *args)["peak_bytes"]) for _ in range(processes)]
    rec = cli_json("simulate", *args, "--schedule", "recorded")
    return Row(
        model,
        batch,
        cube,
        sim.peak_bytes,
        categorized.peak_bytes,
        sim.result.live_peak_bytes,
        int(statistics.median(peaks)),
        peaks,
        g_peak,
        g_seconds,
        sim.simulate_seconds,
        int(rec["peak_bytes"]),
        int(rec["profiled_peak_bytes"]),
        (sim.order_peaks[0], sim.order_peaks[-1]) if sim.order_peaks else (0, 0),
    )


def _other_case(model: str, batch: int, cube: int | None, processes: int) -> OtherRow:
    """`_case` in fresh processes whose CPU kernels are the other ones (TF_ENABLE_ONEDNN_OPTS
    flipped): predicted (executor order), categorized order, measured."""
    from rewriter.cpukernels import cpu_kernels

    onednn = not cpu_kernels().onednn
    env = {"TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0"}
    args = _model_args(model, batch, cube)
    sim = cli_json("simulate", *args, env=env)
    if sim["cpu_kernels"]["onednn"] != onednn:
        raise RuntimeError(f"TF_ENABLE_ONEDNN_OPTS={env['TF_ENABLE_ONEDNN_OPTS']} had no effect")
    cat = cli_json("simulate", *args, "--schedule", "categorized", env=env)
    peaks = [int(cli_json("measure", *args, env=env)["peak_bytes"]) for _ in range(processes)]
    predicted, categorized = int(sim["peak_bytes"]), int(cat["peak_bytes"])
    median = int(statistics.median(peaks))
    return OtherRow(model, batch, cube, onednn, predicted, categorized, median, peaks)


def _other_lines(rows: list[OtherRow]) -> list[str]:
    if not rows:
        return []
    flag = "1" if rows[0].onednn else "0"
    lines = [
        f"## The other CPU kernels (oneDNN {'on' if rows[0].onednn else 'off'})",
        "",
        f"The same cases in processes started with `TF_ENABLE_ONEDNN_OPTS={flag}`, which flips "
        "the kernels TensorFlow uses on this CPU (with oneDNN, `simulate` emulates its graph "
        "pass: merged filter and bias gradients, pooling workspaces).",
        "",
        "| model | batch | measured (median; each process) | predicted, executor order | error "
        "| predicted, categorized order | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"{r.model} (cube {r.cube})" if r.cube else r.model
        lines.append(
            f"| {name} | {r.batch} | {_measured_cell(r.measured, r.measured_all)} | "
            f"{format_bytes(r.predicted)} | **{r.error:+.1%}** | {format_bytes(r.categorized)} | "
            f"{r.categorized_error:+.1%} |"
        )
    return lines


def _speed(repeats: int) -> dict[str, float]:
    """Median seconds of one ResNet-50 (batch 32) simulation, its parts, and Grappler's."""
    from autotune.api import capture
    from autotune.zoo import get_entry
    from rewriter.grappler import grappler_peak
    from simulator import BFCModel, compile_program, replay_peak, simulate_memory

    zm = get_entry("resnet50").build()
    cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=32)
    times: dict[str, list[float]] = {
        "compile": [],
        "walk": [],
        "allocator": [],
        "allocator_gpu": [],
        "grappler": [],
    }
    for _ in range(repeats):
        t0 = time.perf_counter()
        program = compile_program(cap.graph)
        t1 = time.perf_counter()
        result = simulate_memory(program)
        t2 = time.perf_counter()
        resident = list(result.resident_sizes)
        replay_peak(result.trace, resident, moves=result.moves)
        t3 = time.perf_counter()
        gpu = BFCModel(16 << 30, allow_growth=False)  # one region, as on a GPU preset
        replay_peak(result.trace, resident, gpu, moves=result.moves)
        times["compile"].append(t1 - t0)
        times["walk"].append(t2 - t1)
        times["allocator"].append(t3 - t2)
        times["allocator_gpu"].append(time.perf_counter() - t3)
    for _ in range(3):
        times["grappler"].append(grappler_peak(cap.concrete_function)[1])
    med = {k: statistics.median(v) for k, v in times.items()}
    med["ops"] = float(len(cap.graph.ops))
    med["trace"] = cap.trace_seconds
    return med


def _measured_cell(median: int, each: list[int]) -> str:
    """The measured median and, in brackets, each process's figure."""
    return f"{format_bytes(median)} ({', '.join(format_bytes(p) for p in each)})"


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| model | batch | measured (median; each process) | predicted, executor orders "
        "(range of the drawn orders) | error | predicted, categorized order | error "
        "| recorded order: predicted / measured in that step | error "
        "| Grappler estimate | Grappler error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"{r.model} (cube {r.cube})" if r.cube else r.model
        low, high = (format_bytes(b) for b in r.orders)
        drawn = f" ({low} to {high})" if r.orders[1] else ""
        lines.append(
            f"| {name} | {r.batch} | {_measured_cell(r.measured, r.measured_all)} | "
            f"{format_bytes(r.predicted)}{drawn} | "
            f"**{r.error:+.1%}** | {format_bytes(r.categorized)} | {r.categorized_error:+.1%} | "
            f"{format_bytes(r.recorded)} / {format_bytes(r.recorded_measured)} | "
            f"{r.recorded_error:+.1%} | {format_bytes(r.grappler)} | {r.grappler_error:+.1%} |"
        )
    return lines


def _kernels_line() -> str:
    """The facts that select and size this CPU's kernels, which the figures depend on."""
    from rewriter.cpukernels import cpu_kernels

    k = cpu_kernels()
    l3 = format_bytes(k.l3_bytes) if k.l3_bytes else "unknown"
    dnn = "on" if k.onednn else "off (TensorFlow's own convolution gradients, im2col buffers)"
    return f"CPU kernels: oneDNN {dnn}; {k.threads} intra-op threads; L3 cache {l3}."


def _speed_lines(s: dict[str, float]) -> list[str]:
    sim = s["walk"] + s["allocator"]
    return [
        f"ResNet-50, batch 32: {int(s['ops'])} ops, traced in {s['trace']:.1f} s.",
        "",
        "| stage | median time |",
        "|---|---|",
        f"| lower the graph (once per graph) | {s['compile'] * 1e3:.1f} ms |",
        f"| memory walk (liveness, trace) | {s['walk'] * 1e3:.1f} ms |",
        f"| BFC allocator replay | {s['allocator'] * 1e3:.1f} ms |",
        f"| (BFC replay with one 16 GiB region, as for a GPU preset: "
        f"{s['allocator_gpu'] * 1e3:.1f} ms) | |",
        f"| **one simulation (walk + allocator)** | **{sim * 1e3:.1f} ms** |",
        f"| Grappler `DeterminePeakMemoryUsage` | {s['grappler'] * 1e3:.1f} ms |",
        "",
        f"One simulation (walk and allocator replay) is {s['grappler'] / sim:.1f}x faster than "
        f"Grappler's estimator on the same graph; the walk alone, {s['walk'] * 1e3:.1f} ms, "
        f"is {s['grappler'] / s['walk']:.0f}x faster. Lowering is done once per graph, and so "
        "is the placement of the variables in the allocator. The allocator replays a warm-up "
        "step and the measured step: the step's variable writes move variables between "
        "buffers as TensorFlow's do (an assignment adopts its value's buffer; a write while "
        "the variable is still read goes to a new one), so the measured step starts from the "
        "layout the warm-up left.",
    ]


def write_report(
    rows: list[Row], speed: dict[str, float] | None, out: Path, other: list[OtherRow] | None = None
) -> Path:
    """Write `simulator_accuracy.md` and the raw figures as JSON beside it."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Simulator accuracy",
        "",
        "Generated by `python -m autotune.benchmarks.simulator_accuracy` on "
        f"{platform.machine()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}.",
        "",
        _kernels_line(),
        "",
        "*Predicted, executor orders*: `autotune simulate` — the memory walk of the graph "
        "TensorFlow runs (after Grappler's rewrites and fusions) in the order its executor "
        "takes with one inter-op thread, emulated without running the step, replayed through a "
        "model of TensorFlow's BFC allocator (after a warm-up step), with the temporary buffers "
        "of this CPU's kernels. That order differs between processes (with oneDNN, its graph "
        "pass re-creates ops in an order drawn from pointer hashes), so `simulate` draws "
        "orders as TensorFlow does and predicts the median of their peaks; their range is in "
        "brackets. *Categorized order*: the same walk of the captured graph in the "
        "paper's order (`--schedule categorized`, the order plans are simulated and pinned in). "
        "*Measured*: `autotune measure` "
        "— the CPU BFC allocator's peak over one training step after a warm-up, one inter-op "
        "thread, median over fresh processes (each process's figure is in the JSON). "
        "*Recorded order*: `autotune simulate --schedule recorded` — the same simulation of the "
        "graph TensorFlow runs (after Grappler's rewrites and fusions) in the order it executed "
        "one profiled step, against the peak measured in that very "
        "step (TensorFlow's executor order varies between processes, and with it the real "
        "peak). *Grappler*: TensorFlow's static estimate, `Cluster.DeterminePeakMemoryUsage` "
        "on a virtual CPU.",
        "",
        *_table(rows),
        "",
        *_other_lines(other or []),
        "",
    ]
    if speed:
        lines += ["## Speed", "", *_speed_lines(speed), ""]
    path = out / "simulator_accuracy.md"
    path.write_text("\n".join(lines))
    raw = {"rows": [r.__dict__ for r in rows], "speed": speed}
    raw["other_kernels"] = [r.__dict__ for r in other or []]
    (out / "simulator_accuracy.json").write_text(json.dumps(raw, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny models only, no speed run")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per measure")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rows = []
    for model, batch, cube in QUICK if args.quick else FULL:
        row = _case(model, batch, cube, args.processes)
        print(
            f"{model:>16} batch {batch:>3}: predicted {format_bytes(row.predicted):>11}, "
            f"measured {format_bytes(row.measured):>11} ({row.error:+.1%}); categorized order "
            f"{row.categorized_error:+.1%}; recorded order {row.recorded_error:+.1%}; "
            f"Grappler {format_bytes(row.grappler):>11} "
            f"({row.grappler_error:+.1%})",
            flush=True,
        )
        rows.append(row)
    other = []
    for model, batch, cube in [] if args.quick else OTHER_KERNELS:
        o = _other_case(model, batch, cube, args.processes)
        print(
            f"{model:>16} batch {batch:>3}, oneDNN {'on' if o.onednn else 'off'}: predicted "
            f"{format_bytes(o.predicted):>11}, measured {format_bytes(o.measured):>11} "
            f"({o.error:+.1%}); categorized order {o.categorized_error:+.1%}",
            flush=True,
        )
        other.append(o)
    speed = None if args.quick else _speed(repeats=11)
    if speed:
        print("\n".join(_speed_lines(speed)))
    print(f"wrote {write_report(rows, speed, args.out, other)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
