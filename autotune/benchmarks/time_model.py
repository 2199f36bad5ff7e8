"""Benchmark: the time model against measured step times, before and after `autotune calibrate`.

Run `python -m autotune.benchmarks.time_model [--quick]`. On this machine (the CPU without a
GPU), each model is calibrated at one batch (profiled there and at half of it) and then, at
larger batches, its measured step time (`autotune measure`, median of the measured steps, one
inter-op thread) is printed beside two predictions: before calibration, Grappler's analytical
estimate for this CPU (its cores at its clock, which is all Grappler knows of a CPU), and
after, the calibrated one (`autotune simulate --device profile.json`). Every command runs in
a fresh process. The presets' predicted ResNet-50 throughput is then set beside NVIDIA's
published TensorFlow figures for the same GPUs (sources in docs/accuracy.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from autotune.benchmarks.common import cli_json, write_result

#: (model, calibrated at, predicted at): the tiny models at 16 for 128 and 256, ResNet-50 at
#: 4 for 16, and the 3-D U-Net once more from a batch on the far side of its CPU kernels'
#: switch of algorithm (see docs/accuracy.md)
CASES = (
    ("tiny-cnn", 16, (16, 128, 256)),
    ("tiny-transformer", 16, (16, 128, 256)),
    ("tiny-unet3d", 16, (16, 128, 256)),
    ("tiny-unet3d", 128, (256,)),
    ("resnet50", 4, (4, 16)),
)
QUICK: tuple[tuple[str, int, tuple[int, ...]], ...] = (("tiny-cnn", 8, (32,)),)

#: NVIDIA's published single-GPU ResNet-50 v1.5 training throughput in TensorFlow (images/s):
#: DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md (NGC
#: TensorFlow 20.06-tf1-py3, XLA on), "Training performance results", 1 GPU rows
PUBLISHED = {
    ("v100-16gb-nvlink2", "float32", 128): 412.0,  # DGX-1, V100 SXM2 16 GB, FP32 + XLA
    ("v100-16gb-nvlink2", "mixed_float16", 256): 1270.0,  # AMP + XLA
    ("a100-40gb-pcie4", "float32", 256): 909.0,  # DGX A100, A100 SXM4 40 GB, TF32 + XLA
    ("a100-40gb-pcie4", "mixed_float16", 256): 2375.0,  # AMP + XLA
}

_MIXED = textwrap.dedent(
    """
    def resnet50_mixed():
        import keras

        keras.mixed_precision.set_global_policy("mixed_float16")
        from autotune.zoo import get_entry

        zm = get_entry("resnet50").build()
        return zm.model, zm.loss, zm.optimizer
    """
)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--quick", action="store_true", help="tiny-cnn only, no presets")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cases = QUICK if args.quick else CASES
        rows = [row for model, at, sizes in cases for row in _case(model, at, sizes, tmp)]
        presets = [] if args.quick else _presets(Path(tmp))
    report = {"rows": rows, "presets": presets}
    write_result(args.out, "time_model", _lines(report), report)
    return 0


def _case(model: str, at: int, targets: tuple[int, ...], tmp: str) -> list[dict[str, Any]]:
    profile = f"{tmp}/{model}-{at}.json"
    cal = cli_json("calibrate", "--model", model, "--batch-size", str(at), "--out", profile)
    rows = []
    for batch in targets:
        measured = cli_json("measure", "--model", model, "--batch-size", str(batch),
                            "--repeats", "5")  # fmt: skip
        after = cli_json("simulate", "--model", model, "--batch-size", str(batch),
                         "--device", profile, "--gpu-memory", "1TiB")  # fmt: skip
        rows.append(
            {
                "model": model,
                "calibrated_at": list(cal["sizes"]),
                "batch": batch,
                "measured_seconds": measured["step_seconds"],
                "before_seconds": _grappler_here(model, batch, profile),
                "after_seconds": after["baseline_step_seconds"],
                "op_times": after["op_times"],
                "device_name": cal["device_name"],
            }
        )
    return rows


def _grappler_here(model: str, batch: int, profile: str) -> float:
    """Grappler's estimate of the step on the calibrated CPU (its cores and clock)."""
    from autotune.api import capture
    from autotune.calibration import resolve_device
    from autotune.zoo import resolve_model
    from rewriter.costs import grappler_costs

    zm = resolve_model(model)
    cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=batch)
    return sum(grappler_costs(cap.concrete_function, resolve_device(profile))[0].values())


def _presets(tmp: Path) -> list[dict[str, Any]]:
    mixed = tmp / "mixed.py"
    mixed.write_text(_MIXED)
    rows = []
    for (preset, policy, batch), published in PUBLISHED.items():
        model = "resnet50" if policy == "float32" else f"{mixed}:resnet50_mixed"
        sim = cli_json("simulate", "--model", model, "--batch-size", str(batch),
                       "--device", preset, "--gpu-memory", "1TiB")  # fmt: skip
        predicted = batch / sim["baseline_step_seconds"]
        rows.append(
            {
                "preset": preset,
                "policy": policy,
                "batch": batch,
                "predicted_images_per_s": predicted,
                "published_images_per_s": published,
            }
        )
    return rows


def readme_section(d: Any) -> list[str]:
    """The section of results/README.md: the largest error after calibration, and the gap
    of each preset to its published throughput."""
    if not d:
        return []
    rows = d["rows"]
    after = ", ".join(
        f"{x['model']} {x['calibrated_at'][1]}->{x['batch']} "
        f"{_pct(x['after_seconds'], x['measured_seconds'])}"
        for x in rows
        if x["batch"] != x["calibrated_at"][1]
    )
    gaps = ", ".join(
        f"{p['preset']} {p['policy']} "
        + _pct(p["predicted_images_per_s"], p["published_images_per_s"])
        for p in d["presets"]
    )
    lines = [
        "## The time model, measured: `time_model.md`",
        "",
        f"Predicted step time after `autotune calibrate`, against measured: {after}.",
    ]
    if gaps:
        lines.append(f"The presets' ResNet-50 throughput against NVIDIA's published: {gaps}.")
    return [*lines, ""]


def _pct(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.0f} %"


def _lines(r: dict[str, Any]) -> list[str]:
    rows = r["rows"]
    where = rows[0]["device_name"] if rows else "this CPU"
    lines = [
        "# The time model against measured step times",
        "",
        "Generated by `python -m autotune.benchmarks.time_model`, every command in a fresh "
        f"process on {where} (TensorFlow's CPU kernels, one inter-op thread). *Measured*: "
        "`autotune measure`, median wall time of 5 steps. *Before*: Grappler's analytical "
        "estimate for this CPU (cores x clock). *After*: `autotune simulate --device "
        "profile.json` from `autotune calibrate` at the batch shown (it profiles that batch "
        "and half of it).",
        "",
        "| model | calibrated at | batch | measured | before | error | after | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        m, b, a = x["measured_seconds"], x["before_seconds"], x["after_seconds"]
        lines.append(
            f"| {x['model']} | {x['calibrated_at'][1]} | {x['batch']} | {m * 1e3:.1f} ms | "
            f"{b * 1e3:.1f} ms | {_pct(b, m)} | {a * 1e3:.1f} ms | {_pct(a, m)} |"
        )
    notes = [
        f"- {x['model']} at {x['batch']} (calibrated at {x['calibrated_at'][1]}): {x['op_times']}"
        for x in rows
        if "another kernel" in x["op_times"]
    ]
    lines += ["", *notes] if notes else []
    if r["presets"]:
        lines += [
            "",
            "## The presets against published throughput",
            "",
            "Predicted: the preset's time model (Grappler's per-op costs for its GPU), "
            "ResNet-50 (Keras, v1) without swapping. Published: NVIDIA's ResNet-50 v1.5 in "
            "TensorFlow, one GPU, XLA on (see docs/accuracy.md for the source).",
            "",
            "| preset | precision | batch | predicted | published | gap |",
            "|---|---|---|---|---|---|",
        ]
        for p in r["presets"]:
            pr, pu = p["predicted_images_per_s"], p["published_images_per_s"]
            lines.append(
                f"| {p['preset']} | {p['policy']} | {p['batch']} | {pr:.0f} images/s | "
                f"{pu:.0f} images/s | {_pct(pr, pu)} |"
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
