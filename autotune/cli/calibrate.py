"""`autotune calibrate`: measure a model's op times and the host link on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from autotune.cli.options import DEVICE_HELP, device_arg, positive_int
from autotune.units import format_bytes, format_sized
from simulator.errors import UserError

__all__ = ["add_calibrate_args", "cmd_calibrate"]


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", default="profile.json", help="the profile to write (default profile.json)"
    )
    p.add_argument(
        "--steps", type=positive_int, default=5, help="profiled steps at each size (default 5)"
    )
    p.add_argument(
        "--base",
        type=device_arg,
        help="the preset whose GPU this is, for its memory and for estimating ops the profile "
        f"lacks (default: the one the GPU's name names). {DEVICE_HELP}",
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Profile a model's training step here at a batch and at half of it, and the host link:
    a profile for --device of simulate, fit and verify."""
    from autotune.api import capture
    from autotune.calibration import resolve_device
    from autotune.progress import Progress
    from autotune.run.calibrate import ROUNDS, calibrate
    from autotune.zoo import resolve_model

    def at(batch: int) -> Any:
        zm = resolve_model(args.model, cube=args.cube)
        return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=batch)

    if args.batch_size < 2:
        raise UserError("calibrate needs --batch-size 2 or more: it profiles it and half of it")
    bars = Progress(not args.json)
    bars.expect(2 * ROUNDS + 1)
    base = resolve_device(args.base) if args.base else None
    cal = calibrate(
        at, args.batch_size, model=args.model, steps=args.steps, base=base, on_stage=bars.stage
    )
    bars.done()
    path = cal.save(args.out)
    if args.json:
        print(json.dumps({"profile": str(path), **_summary(cal)}))
        return 0
    _print(cal, str(path))
    return 0


def _summary(cal: Any) -> dict[str, Any]:
    timed = sum(1 for p in cal.ops.values() if any(p.seconds))
    return {
        "device": cal.device,
        "device_name": cal.device_name,
        "tensorflow": cal.tensorflow,
        "sizes": list(cal.sizes),
        "step_seconds": list(cal.step_seconds),
        "ops": len(cal.ops),
        "ops_timed": timed,
        "d2h_bytes_per_s": cal.d2h_bytes_per_s,
        "h2d_bytes_per_s": cal.h2d_bytes_per_s,
        "duplex_bytes_per_s": cal.duplex_bytes_per_s,
        "memory_bytes": cal.memory_bytes,
    }


def _print(cal: Any, path: str) -> None:
    s = _summary(cal)
    host = "the emulated host" if cal.device.startswith("CPU") else "the host"
    print(f"device       {cal.device_name} ({cal.device}), TensorFlow {cal.tensorflow}")
    sizes = " and ".join(
        f"{n}: {t * 1e3:.1f} ms" for n, t in zip(cal.sizes, cal.step_seconds, strict=True)
    )
    print(f"step         {cal.model} at {sizes} (median wall time)")
    print(
        f"ops          {s['ops_timed']} of {s['ops']} ran as kernels of their own (the others "
        "were fused into them, folded, or too cheap to trace)"
    )
    print(
        f"link         to {host} {_rate(cal.d2h_bytes_per_s)}, back "
        f"{_rate(cal.h2d_bytes_per_s)}, each way at once {_rate(cal.duplex_bytes_per_s)}"
    )
    memory = (
        format_sized(cal.memory_bytes) if cal.memory_bytes else "not recorded: give --gpu-memory"
    )
    print(f"memory       {memory}")
    print(f"wrote        {path}  (use it as --device {path})")


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f} GB/s ({format_bytes(int(bytes_per_s))}/s)"
