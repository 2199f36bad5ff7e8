"""`autotune fit`: the search for the fastest plan that fits, or the largest batch or cube."""

from __future__ import annotations

import argparse
import json
from typing import Any

from autotune.cli.options import UsageError
from autotune.cli.output import machine_figures, print_fit

__all__ = ["cmd_fit"]


def cmd_fit(args: argparse.Namespace) -> int:
    """Find the fastest swap plan that fits the GPU memory (or the largest batch), by simulation."""
    from autotune.calibration import resolve_device
    from autotune.search.core import Budget
    from autotune.search.studies import study_name
    from autotune.search.tuning import fit, resolve_host_memory
    from autotune.zoo import resolve_model

    _check_sizes(args)
    preset = resolve_device(args.device)
    if not (args.gpu_memory or preset.memory_bytes):
        raise UsageError(f"{args.device} does not say the device's memory: give --gpu-memory")
    if args.shared_link:
        preset = preset.sharing_link(args.replicas)
    machine = resolve_host_memory(args.host_memory)
    host = machine // args.replicas if machine else None  # each replica's share of the host
    args.batch_size = _per_replica(args.batch_size, args.replicas)
    budget = Budget(args.gpu_memory or preset.memory_bytes, args.safety_ratio, host)
    batch = args.batch_size or "max"
    size = f"maxcube{args.batch_size or 1}" if args.max_cube else batch
    name = args.study or study_name(
        args.model, size, preset.name, budget.bytes, host, args.recompute
    )
    opts = {"trials": args.trials, "seed": args.seed, "storage": args.storage, "study": name,
            "out": args.out, "objectives": args.objectives, "progress": not args.quiet,
            "recompute": args.recompute}  # fmt: skip
    if args.max_cube:
        tuned = _fit_max_cube(args, preset, budget, opts)
    else:
        zm = resolve_model(args.model, cube=args.cube)
        tuned = fit(
            zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=args.batch_size,
            gpu_memory=budget.device_bytes, device=preset, safety_ratio=args.safety_ratio,
            host_memory=host, max_batch=args.max_batch, **opts,
        )  # fmt: skip
    if args.verify:
        tuned.verify()
    report = tuned.report(args.out, progress=not args.quiet)
    out = {"model": args.model, "study": name, "report": str(report), **tuned.to_dict()}
    out |= machine_figures(out, args.replicas, machine)
    if args.json:
        print(json.dumps(out))
        return 0
    print_fit(args, tuned, name, report, out)
    return 0


def _per_replica(batch: int | None, replicas: int) -> int | None:
    """Each replica's share of the global `batch` (which they must share evenly)."""
    if batch is None or replicas == 1:
        return batch
    if batch % replicas:
        raise UsageError(f"--batch-size {batch} does not split evenly over {replicas} replicas")
    return batch // replicas


def _check_sizes(args: argparse.Namespace) -> None:
    if args.max_cube:
        if args.max_batch or args.cube:
            raise UsageError(
                "--max-cube searches the cube edge: give neither --max-batch nor --cube"
            )
    elif (args.batch_size is None) == (not args.max_batch):
        raise UsageError("give either --batch-size B or --max-batch (or --max-cube)")


def _fit_max_cube(args: argparse.Namespace, preset: Any, budget: Any, opts: dict[str, Any]) -> Any:
    """`fit --max-cube`: the zoo model's largest cube edge at the batch given (default 1)."""
    from autotune.search.cubes import fit_max_cube
    from autotune.zoo import ZOO

    entry = ZOO.get(args.model)
    if entry is None or entry.default_cube is None:
        cubes = ", ".join(e.name for e in ZOO.values() if e.default_cube)
        raise UsageError(f"--max-cube needs a volumetric zoo model ({cubes}), not {args.model!r}")

    return fit_max_cube(
        lambda edge: entry.build(cube=edge), entry.cube_step, preset, budget,
        batch_size=args.batch_size or 1, **opts,
    )  # fmt: skip
