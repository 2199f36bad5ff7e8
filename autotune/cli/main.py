"""The `autotune` command line: one function per subcommand, `main() -> int`.

Bad input (a `UserError` or a usage error) is one line and exit code 2; any other exception is
a bug in the tool: one line that says so and where, exit code 1 (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from autotune.api import COSTS, SCHEDULES
from autotune.cli.calibrate import add_calibrate_args, cmd_calibrate
from autotune.cli.fit import cmd_fit
from autotune.cli.options import (
    DEVICE_HELP,
    UsageError,
    add_device_args,
    add_fit_args,
    add_model_args,
    add_plan_args,
    device_arg,
    device_preset,
    plan_params,
    positive_int,
    size_arg,
)
from autotune.cli.output import print_simulation, print_verification
from autotune.progress import close_bars
from autotune.search.core import INTERRUPTED, STUDY_RUNNING
from autotune.units import format_sized as _sized
from simulator.errors import UserError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERNAL = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


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
    """The step of `--model`: a zoo model, or the user's `file.py:function`."""
    from autotune.api import capture
    from autotune.zoo import resolve_model

    zm = resolve_model(args.model, cube=args.cube)
    return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=args.batch_size)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Capture a model's training step and predict its peak device memory."""
    from autotune.api import simulate_captured

    params, preset = plan_params(args), device_preset(args)
    _check_prefetch(params, preset)
    captured = _capture_zoo(args)
    sim = simulate_captured(
        captured, schedule=args.schedule, device=preset, params=params, costs=args.costs
    )
    out = {"model": args.model, "batch_size": args.batch_size, **sim.to_dict()}
    if preset is not None and preset.calibration is not None:
        out["op_times"] = preset.calibration.costs(sim.graph).note
    if args.json:
        print(json.dumps(out))
        return 0
    print_simulation(args, sim, preset, out.get("op_times"))
    return 0


def _check_prefetch(params: Any, preset: Any) -> None:
    if params is not None and params.prefetch_bytes and preset is None:
        raise UsageError("--prefetch needs --device: it moves swap-ins by the time model")
    if params is not None and params.recompute_heavy and preset is None:
        raise UsageError("--recompute-heavy needs --device: it weighs ops by the time model")


def cmd_measure(args: argparse.Namespace) -> int:
    """Run a model's training step on the device and measure its real peak memory."""
    from autotune.run.measure import measure

    m = measure(_capture_zoo(args), repeats=args.repeats, warmup=args.warmup_steps)
    out = {"model": args.model, "batch_size": args.batch_size, **m.to_dict()}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model        {args.model}, batch {args.batch_size}, on {m.device}")
    print(f"resident     {_sized(m.resident_bytes)}  (held before the step)")
    after = f"after {m.warmup_steps} warm-up step{'s' * (m.warmup_steps > 1)}"
    print(f"peak         {_sized(m.peak_bytes)}  (median of {len(m.peaks)} steps, {after})")
    ms = (m.step_seconds or 0.0) * 1e3
    print(f"step time    {ms:.1f} ms  (median of {len(m.steps_seconds)} steps)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Rewrite a model's step with a plan, run it and the original, compare to prediction."""
    from autotune.run.verify import limit_gpu_memory, use_two_cpus, verify_captured
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
    captured = _capture_zoo(args)
    v = verify_captured(
        captured, params, steps=args.steps, dry_run=dry_run, memory_bytes=args.gpu_memory,
        preset=args.device,
    )  # fmt: skip
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
    print_verification(v)
    return 0


def _no_gpu() -> bool:
    import tensorflow as tf

    return not tf.config.list_physical_devices("GPU")


def cmd_bench(args: argparse.Namespace) -> int:
    """Regenerate results/ (accuracy, swap plans, largest batch per method, a tuning report)."""
    from pathlib import Path

    from autotune.benchmarks.bench import run_bench

    out = Path(args.out or ("results/quick" if args.quick else "results"))
    path = run_bench(out, quick=args.quick, log=lambda line: print(line, flush=True))
    print(f"wrote {path.parent}/ (see {path})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand per `cmd_*` function."""
    parser = _Parser(prog="autotune", description=__doc__)
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an internal error"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands: dict[str, tuple[Callable[[argparse.Namespace], int], _Adder]] = {
        "models": (cmd_models, _models_args),
        "simulate": (cmd_simulate, _simulate_args),
        "measure": (cmd_measure, _measure_args),
        "verify": (cmd_verify, _verify_args),
        "fit": (cmd_fit, add_fit_args),
        "bench": (cmd_bench, _bench_args),
        "calibrate": (cmd_calibrate, _calibrate_args),
    }
    for name, (fn, add_args) in commands.items():
        p = sub.add_parser(name, help=(fn.__doc__ or "").strip(), description=fn.__doc__)
        p.set_defaults(func=fn)
        add_args(p)
    return parser


_Adder = Callable[[argparse.ArgumentParser], None]


def _models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny models only (CI-sized)")
    p.add_argument("--out", help="folder (default results/, or results/quick with --quick)")


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_calibrate_args(p)


def _measure_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--repeats", type=positive_int, default=3, help="measured steps")
    p.add_argument(
        "--warmup-steps",
        type=positive_int,
        default=1,
        help="steps run before measuring (default 1: a run's first steps; on the CPU, "
        "about 120 measure a longer run, once cheap kernels run inline)",
    )


def _verify_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_plan_args(p)
    p.add_argument("--steps", type=positive_int, default=3, help="measured steps")
    p.add_argument(
        "--device",
        type=device_arg,
        help=f"derive the plan with this time model (needed by --prefetch): {DEVICE_HELP}",
    )
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


def _simulate_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
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


def _prepare_environment() -> None:
    """Quiet TensorFlow and set up CPU memory measurement before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from autotune.run.measure import prepare_measurement

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
    sys.unraisablehook = _drop_interrupt_reports
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command != "models":
            _import_tensorflow_quietly()
            # TensorFlow's millions of objects live as long as the process: kept out of the
            # collector's full passes, which the search's many small tuples trigger
            gc.freeze()
        return int(args.func(args))
    except KeyboardInterrupt:
        close_bars()
        return _interrupted()
    except Exception as err:
        close_bars()  # the message goes on a line of its own, not after a progress bar
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
    """Ctrl-C: raise KeyboardInterrupt, and remember it for the study (see INTERRUPTED); while
    a study runs its trials, only remember it: the next trial stops the study (STUDY_RUNNING),
    unless it is the second Ctrl-C.
    Libraries' logging is silenced from here on: what they log as the interrupt unwinds (seen:
    SQLAlchemy's "Error closing cursor" with its traceback, when the Ctrl-C lands while the
    study's trials are read) is a consequence of it, and the tool says what happened itself."""
    again = INTERRUPTED.is_set()
    INTERRUPTED.set()
    logging.disable(logging.CRITICAL)
    if STUDY_RUNNING.is_set() and not again:
        print("autotune: stopping after this trial (Ctrl-C again to stop now)", file=sys.stderr)
        return
    raise KeyboardInterrupt


def _drop_interrupt_reports(unraisable: Any) -> None:
    """A Ctrl-C that lands in a garbage-collector callback (SQLAlchemy registers some) cannot
    unwind the program: Python would print it as "Exception ignored" with a traceback. The
    study stops at its next trial (INTERRUPTED) and the tool says so itself; any other such
    error is reported as Python does."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


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
