"""Command-line options shared by the subcommands: swap parameters and the device."""

from __future__ import annotations

import argparse

from autotune.calibration import resolve_device
from autotune.units import parse_size
from simulator import PRESETS, DevicePreset
from simulator.derive import RECOMPUTE_MODES, TRIGGER_STRATEGIES, PlanParams
from simulator.errors import UserError

__all__ = [
    "UsageError",
    "add_device_args",
    "add_fit_args",
    "add_model_args",
    "add_plan_args",
    "device_arg",
    "device_preset",
    "plan_params",
    "positive_int",
    "ratio_arg",
    "size_arg",
]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


_PLAN_FLAGS = (
    "n_tensors",
    "lb",
    "ub",
    "threshold",
    "groupby",
    "trigger",
    "sync_out",
    "sync_lag",
    "serialize",
    "backward_swaps",
    "backward_limit",
    "include_types",
    "exclude_types",
    "include_scopes",
    "exclude_scopes",
    "recompute",
    "recompute_ops",
    "recompute_limit",
    "recompute_heavy",
    "prefetch_bytes",
    "postpone_waits",
)


def size_arg(text: str) -> int:
    """A size such as 16GiB, 512MiB or a plain number of bytes, for argparse."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _int_at_least(low: int):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _share(text: str) -> float:
    """A share of at least 0, for argparse."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """The paper's swap parameters; giving any of them turns swapping on."""
    g = p.add_argument_group(
        "swap plan (defaults: the original tool's n_tensors=-1, lb=1, ub=10000)"
    )
    g.add_argument("--n-tensors", type=_int_at_least(-1), help="tensors to swap: -1 all, 0 none")
    g.add_argument("--lb", type=_int_at_least(1), help="swap in at least this many levels early")
    g.add_argument("--ub", type=_int_at_least(1), help="swap in at most this many levels early")
    g.add_argument(
        "--threshold",
        type=_int_at_least(1),
        help="swap only tensors read at least this many levels after they are made",
    )
    g.add_argument(
        "--groupby",
        type=_int_at_least(0),
        help="fuse swap-ins of one tensor whose readers lie within this many levels",
    )
    g.add_argument("--trigger", choices=TRIGGER_STRATEGIES, help="how to find swap-in triggers")
    g.add_argument(
        "--sync-out",
        action="store_const",
        const=True,
        help="forward readers of a swapped tensor wait for its swap-out (original sync_mode 1)",
    )
    g.add_argument(
        "--sync-lag",
        type=_int_at_least(0),
        help="with --sync-out, the first op this many levels after a swapped tensor's producer "
        "waits for its swap-out instead of its readers (0: the readers wait)",
    )
    g.add_argument(
        "--serialize",
        action="store_const",
        const=True,
        help="add order edges that keep the backward pass from holding large tensors at once",
    )
    g.add_argument(
        "--backward-swaps",
        action="store_const",
        const=True,
        help="with --n-tensors -1, also swap tensors the backward pass makes and first reads "
        "at least --threshold levels later (weight gradients held for the optimizer)",
    )
    g.add_argument(
        "--backward-limit",
        type=size_arg,
        help="with --backward-swaps, swap only the backward tensors live where the plan "
        "without them passes this size, e.g. 14GiB (fit sets it to the budget)",
    )
    g.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        help="none: swap only; cheap: make every tensor a short chain of cheap element-wise "
        "ops can make from tensors held anyway again in the backward pass, swap the rest",
    )
    g.add_argument(
        "--recompute-ops", type=_int_at_least(1), help="ops a recompute may re-run (default 5)"
    )
    g.add_argument(
        "--recompute-limit",
        type=size_arg,
        help="while the plan's simulated peak passes this size, swap instead the recomputes "
        "whose chains hold bytes at the peak (fit sets it to the budget)",
    )
    g.add_argument(
        "--recompute-heavy",
        type=_share,
        help="with --recompute cheap and --device: chains may also re-run convolutions and "
        "matrix products where they cost at most this share of the transfer time they save, "
        "e.g. 1 (default 0: never)",
    )
    g.add_argument(
        "--prefetch",
        dest="prefetch_bytes",
        type=size_arg,
        help="with --device: move swap-ins earlier, and with --sync-out the waits for "
        "swap-outs later, while the live bytes stay within this size, e.g. 14GiB (default: off)",
    )
    g.add_argument(
        "--no-postpone-waits",
        dest="postpone_waits",
        action="store_const",
        const=False,
        help="with --prefetch and --sync-out: leave the waits for swap-outs where they are",
    )
    for what in ("include", "exclude"):
        g.add_argument(f"--{what}-types", type=_names, help=f"{what} producers of these op types")
        g.add_argument(
            f"--{what}-scopes",
            type=_names,
            help=f"{what} producers under these name scopes (comma separated)",
        )


def plan_params(args: argparse.Namespace) -> PlanParams | None:
    """The parameters given on the command line, or None when no swap flag was given."""
    given = {k: getattr(args, k) for k in _PLAN_FLAGS if getattr(args, k, None) is not None}
    return PlanParams(**given) if given else None


def add_device_args(p: argparse.ArgumentParser) -> None:
    """A device preset, optionally with memory and link bandwidth given by hand."""
    g = p.add_argument_group("device")
    g.add_argument("--device", type=device_arg, help=f"time model: {DEVICE_HELP}")
    g.add_argument("--gpu-memory", type=size_arg, help="device memory, e.g. 16GiB (overrides)")
    g.add_argument(
        "--link-bandwidth",
        type=size_arg,
        help="host link bytes per second each way, e.g. 12GB (overrides)",
    )


def device_preset(args: argparse.Namespace) -> DevicePreset | None:
    """The preset named on the command line with any overrides; None when none was named."""
    if args.device is None:
        if args.gpu_memory is not None or args.link_bandwidth is not None:
            raise UserError("--gpu-memory and --link-bandwidth refine a --device preset; name one")
        return None
    return resolve_device(args.device).with_overrides(
        memory_bytes=args.gpu_memory, link_bytes_per_s=args.link_bandwidth
    )


DEVICE_HELP = (
    f"a preset ({', '.join(sorted(PRESETS))}) or a profile that `autotune calibrate` wrote (*.json)"
)


def device_arg(text: str) -> str:
    """A device preset's name, or the path of a calibration profile, for argparse."""
    if text in PRESETS or text.endswith(".json"):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown device {text!r}; choose a preset ({', '.join(sorted(PRESETS))}) or a "
        "calibration profile (*.json)"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def ratio_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def add_fit_args(p: argparse.ArgumentParser) -> None:
    from autotune.search.core import DEFAULT_SAFETY_RATIO, RECOMPUTE_CHOICES
    from autotune.search.tuning import DEFAULT_DEVICE, DEFAULT_TRIALS

    p.add_argument(
        "--model", required=True, help="zoo model name, or path/to/file.py:build_function"
    )
    p.add_argument("--batch-size", type=positive_int, help="images per step")
    p.add_argument("--max-batch", action="store_true", help="find the largest batch that fits")
    p.add_argument("--cube", type=positive_int, default=None, help="edge length for 3D models")
    p.add_argument(
        "--max-cube",
        action="store_true",
        help="3D zoo models: find the largest cube edge that fits at --batch-size (default 1)",
    )
    p.add_argument(
        "--gpu-memory", type=size_arg, help="device memory, e.g. 16GiB (default: the preset)"
    )
    p.add_argument(
        "--host-memory",
        type=size_arg,
        help="host memory swapped tensors may take, e.g. 64GiB (default: on a GPU machine the "
        "smaller of free RAM and TensorFlow's pinned host cap; without one, no limit)",
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="GPUs of one machine training together (tf.distribute.MirroredStrategy): each "
        "tunes its share of --batch-size, and they share --host-memory (default 1)",
    )
    p.add_argument(
        "--shared-link",
        action="store_true",
        help="the replicas' GPUs share one host link (one PCIe switch): each swaps at a "
        "--replicas-th of its bandwidth",
    )
    p.add_argument(
        "--device", type=device_arg, default=DEFAULT_DEVICE, help=f"the GPU: {DEVICE_HELP}"
    )
    p.add_argument("--trials", type=positive_int, default=DEFAULT_TRIALS, help="Optuna trials")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (reproducible search)")
    p.add_argument(
        "--safety-ratio",
        type=ratio_arg,
        default=DEFAULT_SAFETY_RATIO,
        help="share of the memory a predicted peak may use (default from measured error)",
    )
    p.add_argument("--objectives", type=int, choices=(1, 2), default=1, help="2: peak and time")
    p.add_argument(
        "--recompute",
        choices=RECOMPUTE_CHOICES,
        default="search",
        help="search (default): the search chooses whether to recompute cheap element-wise "
        "tensors instead of swapping them; none: swap only; cheap: always recompute them",
    )
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


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="zoo model name, or path/to/file.py:build_function"
    )
    p.add_argument("--batch-size", type=positive_int, required=True, help="images per step")
    p.add_argument("--cube", type=positive_int, default=None, help="edge length for 3D models")
    p.add_argument("--json", action="store_true", help="print one JSON object")
