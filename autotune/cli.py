"""The `autotune` command line: one function per subcommand, `main() -> int`.

Bad input (a `UserError` or a usage error) is one line and exit code 2; any other exception is
a bug in the tool: one line that says so and where, exit code 1 (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from autotune.api import COSTS, SCHEDULES
from autotune.cli_options import (
    add_device_args,
    add_plan_args,
    device_preset,
    plan_params,
    size_arg,
)
from autotune.search import INTERRUPTED
from autotune.units import format_bytes
from autotune.units import format_sized as _sized
from simulator.errors import UserError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERNAL = 1


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def cmd_models(args: argparse.Namespace) -> int:
    """List the model zoo."""
    from autotune.zoo import ZOO

    if args.json:
        print(json.dumps({name: e.description for name, e in ZOO.items()}))
        return 0
    width = max(len(n) for n in ZOO)
    for name, entry in ZOO.items():
        print(f"{name:<{width}}  {entry.description}")
    return 0


def _capture_zoo(args: argparse.Namespace) -> Any:
    from autotune.api import capture
    from autotune.zoo import get_entry

    entry = get_entry(args.model)
    zm = entry.build(cube=args.cube)
    return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=args.batch_size)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Capture a zoo model's training step and predict its peak device memory."""
    from autotune.api import simulate_captured

    params, preset = plan_params(args), device_preset(args)
    captured = _capture_zoo(args)
    sim = simulate_captured(
        captured, schedule=args.schedule, device=preset, params=params, costs=args.costs
    )
    out = {"model": args.model, "batch_size": args.batch_size, **sim.to_dict()}
    if args.json:
        print(json.dumps(out))
        return 0
    _print_simulation(args, sim, preset)
    return 0


def _print_order_edges(edges: tuple[tuple[str, ...], ...], shown: int = 3) -> None:
    """The plan's order edges (`--serialize`), the first few by name."""
    if not edges:
        return
    keep = "edge reorders" if len(edges) == 1 else "edges reorder"
    print(f"  ordered    {len(edges)} order {keep} the backward pass:")
    for before, after in edges[:shown]:
        print(f"             {after} waits for {before}")
    if len(edges) > shown:
        print(f"             ... and {len(edges) - shown} more (see --json)")


def _print_cpu_kernels(k: dict[str, Any], schedule: str) -> None:
    """Which CPU kernels the prediction models: their temporary buffers depend on it."""
    if k["onednn"]:
        as_run = schedule != "categorized"
        what = ": its graph pass merged filter and bias gradients, pooling workspaces"
        print(f"kernels      this CPU's, oneDNN on{what if as_run else ''}")
        return
    print(
        "kernels      this CPU's, oneDNN off: TensorFlow's convolution gradients with their "
        f"im2col buffers ({k['threads']} threads)"
    )


def _print_simulation(args: argparse.Namespace, sim: Any, preset: Any) -> None:
    r = sim.result
    where = preset.name if preset else "CPU allocator model"
    print(f"model        {args.model}, batch {args.batch_size}, on {where}")
    print(f"ops          {len(sim.graph.ops)} in {r.order.n_levels} levels")
    print(f"persistent   {_sized(r.persistent_bytes)}  (weights, optimizer slots, input batch)")
    print(f"peak         {_sized(r.peak_bytes)}  (BFC allocator model)")
    if sim.order_peaks:
        low, high = format_bytes(sim.order_peaks[0]), format_bytes(sim.order_peaks[-1])
        print(f"  orders     median of {len(sim.order_peaks)} executor orders: {low} to {high}")
    if sim.swapped_tensors or sim.evaluation.params.n_tensors != 0:
        print(f"  no swap    {_sized(sim.baseline.peak_bytes)}")
        print(f"  swapped    {sim.swapped_tensors} tensors, {_sized(sim.plan.swapped_bytes)}")
        print(f"peak host    {_sized(r.host_peak_bytes)}")
    _print_order_edges(sim.plan.order_edges)
    print(f"lower bound  {_sized(sim.lower_bound_bytes)}  (resident + largest op working set)")
    print(f"live peak    {_sized(r.live_peak_bytes)}  (sum of live tensors)")
    print(f"peak at      level {r.peak_level}, op {r.peak_op}  ({sim.schedule} order)")
    for i, (tensor, nbytes) in enumerate(r.largest_at_peak(5)):
        print(f"{'at the peak' if i == 0 else '':<12} {_sized(nbytes)}  {tensor}")
    if sim.step_seconds is not None:
        print(
            f"step time    {sim.step_seconds * 1e3:.2f} ms  (no swap "
            f"{sim.baseline_step_seconds * 1e3:.2f} ms, overhead {sim.overhead:.3f}x)"
        )
    if preset is not None:
        fits = "fits" if r.peak_bytes <= preset.memory_bytes else "does NOT fit"
        print(f"device       {fits} in {_sized(preset.memory_bytes)}")
    if sim.cpu_kernels is not None:
        _print_cpu_kernels(sim.cpu_kernels, sim.schedule)
    print(f"simulation   {sim.simulate_seconds * 1e3:.1f} ms (tracing {sim.trace_seconds:.1f} s)")
    if sim.profiled_peak_bytes:
        print(f"profiled     {_sized(sim.profiled_peak_bytes)}  (measured in the recorded step)")


def cmd_measure(args: argparse.Namespace) -> int:
    """Run a zoo model's training step on the device and measure its real peak memory."""
    from autotune.measure import measure

    m = measure(_capture_zoo(args), repeats=args.repeats, warmup=args.warmup_steps)
    out = {"model": args.model, "batch_size": args.batch_size, **m.to_dict()}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model        {args.model}, batch {args.batch_size}, on {m.device}")
    print(f"resident     {_sized(m.resident_bytes)}  (held before the step)")
    after = f"after {m.warmup_steps} warm-up step{'s' * (m.warmup_steps > 1)}"
    print(f"peak         {_sized(m.peak_bytes)}  (median of {len(m.peaks)} steps, {after})")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Rewrite a zoo model's step with a plan, run it and the original, compare to prediction."""
    from autotune.verify import limit_gpu_memory, use_two_cpus, verify_captured
    from simulator.derive import PlanParams

    params = plan_params(args) or PlanParams()
    limited = args.gpu_memory is not None and limit_gpu_memory(args.gpu_memory)
    dry_run = args.dry_run and not limited and _no_gpu()
    if dry_run:
        use_two_cpus()
    if args.gpu_memory is not None and not limited:
        print(
            "autotune: note: no GPU visible, so --gpu-memory does not apply; "
            "running on the emulated device",
            file=sys.stderr,
        )
    v = verify_captured(_capture_zoo(args), params, steps=args.steps, dry_run=dry_run)
    out = {
        "model": args.model,
        "batch_size": args.batch_size,
        **v.to_dict(),
        "gpu_memory_limit_bytes": args.gpu_memory if limited else None,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model        {args.model}, batch {args.batch_size}, on {v.device}")
    _print_verification(v)
    return 0


def _no_gpu() -> bool:
    import tensorflow as tf

    return not tf.config.list_physical_devices("GPU")


def _print_verification(v: Any) -> None:
    """The measured peaks and step times of a verification next to the prediction."""
    print(
        f"swapped      {len(v.plan.swaps)} tensors; {len(v.executed)} of {v.swap_ops} swap ops "
        "ran (read from the executed graphs)"
    )
    if v.gating is not None:
        print(f"gating       {v.gating.summary()}")
        print(f"             (checked on {v.gating_place}, from the executed graphs and a profile)")
        for gate in [g for g in v.gating.gates if not g.gated][:3]:
            print(f"             NOT gated: {gate.swap_in}: {gate.reason}")
    _print_order_edges(v.plan.order_edges)
    for label, run, pred in (
        ("tuned", v.tuned, v.predicted_peak_bytes),
        ("original", v.baseline, v.baseline_predicted_peak_bytes),
    ):
        measured = _sized(run.peak_bytes) if run.peak_bytes else run.error
        print(f"{label:<12} measured {measured}, predicted {_sized(pred)}")
        if run.step_seconds is not None:
            print(f"{'':<12} step {run.step_seconds * 1e3:.1f} ms (median of {v.steps})")
    if v.error_percent is not None:
        print(f"error        {v.error_percent:+.1f} % (predicted against measured, tuned)")


def cmd_fit(args: argparse.Namespace) -> int:
    """Find the fastest swap plan that fits the GPU memory (or the largest batch), by simulation."""
    from autotune.search import Budget
    from autotune.studies import study_name
    from autotune.tuning import fit, resolve_host_memory
    from autotune.zoo import resolve_model
    from simulator import get_preset

    if (args.batch_size is None) == (not args.max_batch):
        raise UsageError("give either --batch-size B or --max-batch")
    preset = get_preset(args.device)
    host = resolve_host_memory(args.host_memory)
    budget = Budget(args.gpu_memory or preset.memory_bytes, args.safety_ratio, host)
    batch = args.batch_size or "max"
    name = args.study or study_name(args.model, batch, preset.name, budget.bytes, host)
    zm = resolve_model(args.model, cube=args.cube)
    tuned = fit(
        zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=args.batch_size,
        gpu_memory=budget.device_bytes, device=preset, trials=args.trials, seed=args.seed,
        storage=args.storage, study=name, out=args.out, safety_ratio=args.safety_ratio,
        host_memory=host,
        objectives=args.objectives, max_batch=args.max_batch, progress=not args.quiet,
    )  # fmt: skip
    if args.verify:
        tuned.verify()
    report = tuned.report(args.out)
    out = {"model": args.model, "study": name, "report": str(report), **tuned.to_dict()}
    if args.json:
        print(json.dumps(out))
        return 0
    _print_fit(args, tuned, name, report)
    return 0


def _print_fit(args: argparse.Namespace, tuned: Any, name: str, report: Any) -> None:
    from autotune.report import batches_table, methods_table

    d = tuned.to_dict()
    print(
        f"model        {args.model}, batch {d['batch_size']}, on {d['device']}; budget "
        f"{_sized(d['budget_bytes'])} = {d['safety_ratio']:.2f} x {_sized(d['gpu_memory_bytes'])}"
    )
    print(f"lower bound  {_sized(d['lower_bound_bytes'])}  (resident + largest op working set)")
    if tuned.fits_without_swapping:
        print(
            f"no swap      fits without swapping: predicted peak {_sized(d['baseline_peak_bytes'])}"
            " is within the budget; the step is returned untouched"
        )
    else:
        print(f"tuned        {json.dumps(_nonempty(d['params']))}")
        print(
            f"             peak {_sized(d['predicted_peak_bytes'])} (no swap "
            f"{_sized(d['baseline_peak_bytes'])}), overhead {_times(d['predicted_overhead'])}, "
            f"{d['swapped_tensors']} tensors swapped"
        )
        _print_order_edges(tuple(map(tuple, d["order_edges"])))
    _print_host(d)
    batches = batches_table(tuned)
    if batches is not None:
        print("\nlargest batch that fits, per method:")
        print(batches.to_string(index=False))
        print(f"limited by   {d['max_batch_limited_by']} (at the next batch up, tuned)")
    print(f"\nmethods at batch {d['batch_size']}:")
    print(methods_table(tuned).to_string(index=False))
    if tuned.verification is not None:
        print(f"\nverified: the tuned and the original step run on {tuned.verification.place}")
        _print_verification(tuned.verification)
    print(f"\ntuning {d['tuning_seconds']:.1f} s, tracing {d['trace_seconds']:.1f} s")
    print(f"report       {report}  (study {name!r}: resume by running the same command)")


def _print_host(d: dict[str, Any]) -> None:
    """The plan's host peak against the host limit, and the variable to raise if needed."""
    from autotune.host import pinned_hint

    peak, limit = d["predicted_host_peak_bytes"], d["host_memory_bytes"]
    against = f"of {_sized(limit)} allowed" if limit else "(no host limit: --host-memory)"
    print(f"host peak    {_sized(peak)} {against}")
    hint = pinned_hint(peak)
    if hint:
        print(f"             {hint}")


def _times(value: float | None) -> str:
    """An overhead such as 1.154x, or a note when no time model ran (no per-op costs)."""
    return "n/a (no op costs)" if value is None else f"{value:.3f}x"


def _nonempty(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v != []}


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def _fit_args(p: argparse.ArgumentParser) -> None:
    from autotune.search import DEFAULT_SAFETY_RATIO
    from autotune.tuning import DEFAULT_DEVICE, DEFAULT_TRIALS
    from simulator import PRESETS

    p.add_argument(
        "--model", required=True, help="zoo model name, or path/to/file.py:build_function"
    )
    p.add_argument("--batch-size", type=_positive_int, help="images per step")
    p.add_argument("--max-batch", action="store_true", help="find the largest batch that fits")
    p.add_argument("--cube", type=_positive_int, default=None, help="edge length for 3D models")
    p.add_argument(
        "--gpu-memory", type=size_arg, help="device memory, e.g. 16GiB (default: the preset)"
    )
    p.add_argument(
        "--host-memory",
        type=size_arg,
        help="host memory swapped tensors may take, e.g. 64GiB (default: on a GPU machine the "
        "smaller of free RAM and TensorFlow's pinned host cap; without one, no limit)",
    )
    p.add_argument("--device", choices=sorted(PRESETS), default=DEFAULT_DEVICE, help="GPU preset")
    p.add_argument("--trials", type=_positive_int, default=DEFAULT_TRIALS, help="Optuna trials")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (reproducible search)")
    p.add_argument(
        "--safety-ratio",
        type=_ratio,
        default=DEFAULT_SAFETY_RATIO,
        help="share of the memory a predicted peak may use (default from measured error)",
    )
    p.add_argument("--objectives", type=int, choices=(1, 2), default=1, help="2: peak and time")
    p.add_argument("--out", default="autotune-out", help="folder for the report and the study")
    p.add_argument("--storage", help="Optuna database URL (default: SQLite in --out)")
    p.add_argument("--study", help="study name (default: from model, batch, device, budget)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also run the tuned step here (GPU, or the emulated device) and report measured peaks",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_bench(args: argparse.Namespace) -> int:
    """Regenerate results/ (accuracy, swap plans, largest batch per method, a tuning report)."""
    from pathlib import Path

    from autotune.benchmarks.bench import run_bench

    out = Path(args.out or ("results/quick" if args.quick else "results"))
    path = run_bench(out, quick=args.quick, log=lambda line: print(line, flush=True))
    print(f"wrote {path.parent}/ (see {path})")
    return 0


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="zoo model name (see `autotune models`)")
    p.add_argument("--batch-size", type=_positive_int, required=True, help="images per step")
    p.add_argument("--cube", type=_positive_int, default=None, help="edge length for 3D models")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand per `cmd_*` function."""
    parser = _Parser(prog="autotune", description=__doc__)
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an internal error"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "models": cmd_models,
        "simulate": cmd_simulate,
        "measure": cmd_measure,
        "verify": cmd_verify,
        "fit": cmd_fit,
        "bench": cmd_bench,
    }
    for name, fn in commands.items():
        p = sub.add_parser(name, help=(fn.__doc__ or "").strip(), description=fn.__doc__)
        p.set_defaults(func=fn)
        if name == "models":
            p.add_argument("--json", action="store_true", help="print one JSON object")
        elif name == "fit":
            _fit_args(p)
        elif name == "bench":
            p.add_argument("--quick", action="store_true", help="tiny models only (CI-sized)")
            p.add_argument("--out", help="folder (default results/, or results/quick with --quick)")
        else:
            _model_args(p)
        if name == "measure":
            p.add_argument("--repeats", type=_positive_int, default=3, help="measured steps")
            p.add_argument(
                "--warmup-steps",
                type=_positive_int,
                default=1,
                help="steps run before measuring (default 1: a run's first steps; on the CPU, "
                "about 120 measure a longer run, once cheap kernels run inline)",
            )
        if name == "verify":
            add_plan_args(p)
            p.add_argument("--steps", type=_positive_int, default=3, help="measured steps")
            p.add_argument(
                "--dry-run",
                action="store_true",
                help="without a GPU: also run the GPU form of the tuned step on two logical "
                "CPUs and check that every swap-in waits for its trigger",
            )
            p.add_argument(
                "--gpu-memory",
                type=size_arg,
                default=None,
                help="run the GPU under this logical memory limit, e.g. 16GiB",
            )
        if name == "simulate":
            add_plan_args(p)
            add_device_args(p)
            p.add_argument(
                "--costs",
                choices=COSTS,
                default="analytical",
                help="per-op times: Grappler's estimate for the preset, or measured here",
            )
            p.add_argument(
                "--schedule",
                choices=SCHEDULES,
                default="auto",
                help="op order to simulate: the paper's categorized order (no device needed); "
                "or the graph TensorFlow runs (after Grappler) in its executor's order, "
                "emulated (executor) or recorded from one profiled step on this device; "
                "auto (default): executor for the step as it is on this machine, categorized "
                "with a plan or a device preset",
            )
    return parser


def _prepare_environment() -> None:
    """Quiet TensorFlow and set up CPU memory measurement before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from autotune.measure import prepare_measurement

    prepare_measurement()


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up lines kept off stderr: they are printed before
    its logging is set up, so TF_CPP_MIN_LOG_LEVEL cannot silence them. If the import fails,
    they are written out after all, before the error."""
    import tempfile

    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException as err:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            if isinstance(err, ImportError):
                raise UserError(
                    f"TensorFlow cannot be imported ({err}); install it with "
                    "pip install -e '.[cpu]' (or '.[gpu]' on a CUDA machine)"
                ) from None
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    _prepare_environment()
    signal.signal(signal.SIGINT, _on_ctrl_c)
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command != "models":
            _import_tensorflow_quietly()
        return int(args.func(args))
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as err:
        if INTERRUPTED.is_set() or _caused_by_interrupt(err):
            # a Ctrl-C can land inside a database transaction: the driver's and Optuna's
            # errors that follow need not carry the KeyboardInterrupt in their chain
            return _interrupted()
        if isinstance(err, (UsageError, UserError)):
            print(f"autotune: error: {str(err).splitlines()[0]}", file=sys.stderr)
            return EXIT_USAGE
        if debug:
            raise
        return _internal_error(err)


def _internal_error(err: BaseException) -> int:
    """A bug in the tool, not the user's input: say so, where it happened, and how to see it."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    first = str(err).splitlines()[0] if str(err) else ""
    print(
        f"autotune: internal error: {type(err).__name__}: {first}{where}\n"
        "autotune: this is a bug in the tool, please report it; run again with --debug for "
        "the full traceback",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def _on_ctrl_c(_signum: int, _frame: Any) -> None:
    """Ctrl-C: raise KeyboardInterrupt, and remember it for the study (see INTERRUPTED)."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


def _caused_by_interrupt(err: BaseException) -> bool:
    """True when `err` was raised while a Ctrl-C was being handled (a database driver, say,
    failing as the interrupted trial is recorded)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _interrupted() -> int:
    print(
        "autotune: interrupted; finished trials are kept in the study: "
        "run the same command to resume",
        file=sys.stderr,
    )
    return 130


if __name__ == "__main__":
    sys.exit(main())
