"""Command-line options shared by the subcommands: swap parameters and the device."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from autotune.calibration import resolve_device
from autotune.units import parse_size
from simulator import PRESETS, DevicePreset
from simulator.errors import UserError
from simulator.params import PARAMS, Param, PlanParams

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
    """The swap parameters (`simulator.params.PARAMS`); giving any turns swapping on."""
    g = p.add_argument_group(
        "swap plan (defaults: the original tool's n_tensors=-1, lb=1, ub=10000)"
    )
    defaults = PlanParams()
    for param in PARAMS:
        default = getattr(defaults, param.name)
        kind = _kind(param, default)
        if kind == "flag":  # a flag sets the value its default is not
            g.add_argument(
                param.option, dest=param.name, action="store_const", const=not default,
                help=param.help,
            )  # fmt: skip
        elif kind == "choice":
            g.add_argument(param.option, dest=param.name, choices=param.choices, help=param.help)
        else:
            g.add_argument(param.option, dest=param.name, type=_parser(param, kind),
                           help=_with_default(param, default))  # fmt: skip


def _kind(param: Param, default: Any) -> str:
    """How a parameter is given on the command line: a flag, a choice, a size, names, a share
    or an integer (from its row and its default's type)."""
    if isinstance(default, bool):
        return "flag"
    if param.choices:
        return "choice"
    if param.size:
        return "size"
    if isinstance(default, tuple):
        return "names"
    return "share" if isinstance(default, float) else "int"


def _parser(param: Param, kind: str) -> Callable[[str], Any]:
    """How the command line reads one parameter's value."""
    parsers: dict[str, Callable[[str], Any]] = {"size": size_arg, "names": _names, "share": _share}
    if kind in parsers:
        return parsers[kind]
    return _int_at_least(int(param.low if param.low is not None else -(2**63)))


def _with_default(param: Param, default: Any) -> str:
    """A parameter's help, with its default where the help does not say it."""
    if "(" in param.help or default in ((), 0) or param.size:
        return param.help
    return f"{param.help} (default {default})"


def plan_flags_table() -> str:
    """docs/cli.md's table of the swap plan flags, from `PARAMS`."""
    defaults = PlanParams()
    rows = ["| flag | default | searched by `fit` as | meaning |", "|---|---|---|---|"]
    for param in PARAMS:
        default = getattr(defaults, param.name)
        flag = f"{param.option} {_metavar(param, _kind(param, default))}".strip()
        shown = _shown_default(param, default)
        drawn = param.draw.describe() if param.draw else "not searched"
        rows.append(f"| `{flag}` | {shown} | {drawn} | {param.help} |")
    return "\n".join(rows) + "\n"


def _metavar(param: Param, kind: str) -> str:
    if kind == "choice":
        return "\\|".join(param.choices)
    return {"flag": "", "size": "SIZE", "names": "NAME,...", "share": "X"}.get(kind, "N")


def _shown_default(param: Param, default: Any) -> str:
    if isinstance(default, bool) or (param.size and not default):
        return "off"
    if isinstance(default, tuple):
        return "none"
    return f"`{default}`" if isinstance(default, str) else f"{default:g}"


def plan_params(args: argparse.Namespace) -> PlanParams | None:
    """The parameters given on the command line, or None when no swap flag was given."""
    names = (p.name for p in PARAMS)
    given = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
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
    """fit's options: the step and its size, the device and host, then the search."""
    from autotune.search.tuning import DEFAULT_DEVICE

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
    _add_search_args(p)


def _add_search_args(p: argparse.ArgumentParser) -> None:
    """fit's options of the search, its study and its output."""
    from autotune.search.core import DEFAULT_SAFETY_RATIO, RECOMPUTE_CHOICES
    from autotune.search.tuning import DEFAULT_TRIALS

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


if __name__ == "__main__":
    print(plan_flags_table(), end="")
