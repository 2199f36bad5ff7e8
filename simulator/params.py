"""The swap parameters of a plan (the papers' `n_tensors`, `lb`, `ub` and ours), validated, and
the price a heavy recompute is weighed with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from simulator.errors import UserError
from simulator.timing import Link

__all__ = [
    "LEAST_MEMORY",
    "PARAMS",
    "Param",
    "PlanParams",
    "RECOMPUTE_MAX_OPS",
    "RECOMPUTE_MODES",
    "RecomputePrice",
    "TRIGGER_STRATEGIES",
]

#: the longest chain the search (and the time bound) lets a recompute re-run
RECOMPUTE_MAX_OPS = 8


@dataclass(frozen=True)
class Param:
    """One plan parameter's row of `PARAMS`: what validation, the command line and the docs
    know of it (its type and default are `PlanParams`' field's).

    `low` is its least value (numbers), `choices` its values (strings), `size` says that it
    counts bytes (given as 14GiB on the command line), `flag` is its command-line option
    when that is not `--name` (a flag that turns the default off), `search` how the tuner
    draws it (`autotune.search.space`)."""

    name: str
    help: str
    low: float | None = None
    choices: tuple[str, ...] = ()
    size: bool = False
    flag: str = ""
    search: str = ""

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


_LEVELS = "1 to the step's levels, log"

#: Every plan parameter, the papers' first. What each means, in one line each.
PARAMS: tuple[Param, ...] = (
    Param(
        "n_tensors",
        "tensors to swap: -1 all, 0 none",
        low=-1,
        search="1 to all forward candidates (0 too where recomputes are searched)",
    ),
    Param(
        "lb", "swap in at least this many levels early", low=1, search=_LEVELS + ", with ub sorted"
    ),
    Param(
        "ub", "swap in at most this many levels early", low=1, search=_LEVELS + ", with lb sorted"
    ),
    Param(
        "threshold",
        "swap only tensors read at least this many levels after they are made",
        low=1,
        search=_LEVELS,
    ),
    Param(
        "groupby",
        "fuse swap-ins of one tensor whose readers lie within this many levels",
        low=0,
        search="0 to the step's levels",
    ),
    Param(
        "trigger",
        "how to find swap-in triggers",
        choices=("direct_order", "chain_rule"),
        search="either",
    ),
    Param(
        "sync_out",
        "forward readers of a swapped tensor wait for its swap-out (original sync_mode 1)",
        search="either",
    ),
    Param(
        "sync_lag",
        "with --sync-out, the first op this many levels after a swapped tensor's producer "
        "waits for its swap-out instead of its readers (0: the readers wait)",
        low=0,
        search="with --sync-out: " + _LEVELS + " (1 stands for 0)",
    ),
    Param(
        "serialize",
        "add order edges that keep the backward pass from holding large tensors at once",
        search="either",
    ),
    Param(
        "backward_swaps",
        "with --n-tensors -1, also swap tensors the backward pass makes and first reads "
        "at least --threshold levels later (weight gradients held for the optimizer)",
        search="either, with every forward candidate",
    ),
    Param(
        "backward_limit",
        "with --backward-swaps, swap only the backward tensors live where the plan "
        "without them passes this size, e.g. 14GiB (fit sets it to the budget)",
        low=0,
        size=True,
        search="the budget, with --backward-swaps",
    ),
    Param(
        "recompute",
        "none: swap only; cheap: make every tensor a short chain of cheap element-wise "
        "ops can make from tensors held anyway again in the backward pass, swap the rest",
        choices=("none", "cheap"),
        search="either (`fit --recompute search`, the default)",
    ),
    Param(
        "recompute_ops",
        "ops a recompute may re-run",
        low=1,
        search=f"with recomputes: 1 to {RECOMPUTE_MAX_OPS}",
    ),
    Param(
        "recompute_limit",
        "while the plan's simulated peak passes this size, swap instead the recomputes "
        "whose chains hold bytes at the peak (fit sets it to the budget)",
        low=0,
        size=True,
        search="the budget, with --recompute cheap",
    ),
    Param(
        "recompute_heavy",
        "with --recompute cheap and --device: chains may also re-run convolutions and "
        "matrix products where they cost at most this share of the transfer time they save, "
        "e.g. 1 (0: never)",
        low=0,
        search="with --recompute cheap and a device: one of a few shares",
    ),
    Param(
        "prefetch_bytes",
        "with --device: move swap-ins earlier, and with --sync-out the waits for "
        "swap-outs later, while the live bytes stay within this size, e.g. 14GiB (0: off)",
        low=0,
        size=True,
        flag="--prefetch",
        search="with a device: off, or a share of the budget",
    ),
    Param(
        "postpone_waits",
        "with --prefetch and --sync-out: leave the waits for swap-outs where they are",
        flag="--no-postpone-waits",
        search="either, with --prefetch and --sync-out",
    ),
    *(
        Param(f"{what}_{kind}", f"{what} producers of these {noun} (comma separated)")
        for what in ("include", "exclude")
        for kind, noun in (("types", "op types"), ("scopes", "name scopes"))
    ),
)


@dataclass(frozen=True)
class PlanParams:
    """The swap parameters; the defaults are the original tool's (n_tensors=-1, lb=1, ub=10000).
    What each means: `PARAMS`; the mechanisms behind ours: docs/method.md.

    `serialize` (ours, not the original tool's) adds the order edges that lower the step's
    least-memory peak (`simulator.order_edges`); the engine that evaluates the plan finds them.
    """

    n_tensors: int = -1
    lb: int = 1
    ub: int = 10000
    threshold: int = 1
    groupby: int = 0
    trigger: str = "direct_order"
    sync_out: bool = False
    serialize: bool = False
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    include_scopes: tuple[str, ...] = ()
    exclude_scopes: tuple[str, ...] = ()
    recompute: str = "none"
    recompute_ops: int = 5  # a batch norm's application and its activation
    #: with a time model, move swap-ins earlier while the live bytes stay within this many
    #: bytes (`simulator.prefetch`; 0: never)
    prefetch_bytes: int = 0
    #: with `prefetch_bytes` and `sync_out`, first move the waits for forward swap-outs later,
    #: to where their copies should end (`simulator.prefetch.postpone_waits`)
    postpone_waits: bool = True
    #: with recomputes, while the plan's simulated peak passes this many
    #: bytes, the recomputes whose chains hold bytes at the peak are swapped instead, as long
    #: as that lowers the peak (`simulator.refine`; 0: never)
    recompute_limit: int = 0
    #: with `sync_out`, the first op at least this many levels after a swapped tensor's
    #: producer waits for its swap-out instead of its readers (0: the readers wait); the
    #: forward pass may then run ahead of the link by that many levels
    sync_lag: int = 0
    #: also swap tensors the backward pass makes and first reads at least `threshold` levels
    #: later (weight gradients held for the optimizer, a branch's input gradient held for the
    #: sum with the other branch's): they come after the forward candidates, so `n_tensors`
    #: reaches them last (ours; the original tool swapped forward tensors only)
    backward_swaps: bool = False
    #: with `backward_swaps`, swap only the backward tensors live at a step where the plan
    #: without them passes this many live bytes (`simulator.refine`; 0: all of them)
    backward_limit: int = 0
    #: with recomputes, also re-run convolutions and matrix products where the chain costs at
    #: most this many times the transfer time of its tensor, out and back (`RecomputePrice`;
    #: 0: never; on a link-bound step 1 trades them even, below 1 leaves room for overlap)
    recompute_heavy: float = 0.0

    def __post_init__(self) -> None:
        for param in PARAMS:
            _check(param, getattr(self, param.name))
        if self.lb > self.ub:
            raise UserError(f"need lb <= ub, got lb={self.lb}, ub={self.ub}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanParams:
        """The parameters `to_dict` wrote (lists back to tuples)."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


def _check(param: Param, value: Any) -> None:
    """One parameter's value against its row: its least value, or its choices."""
    if param.choices and value not in param.choices:
        raise UserError(f"{param.name} must be one of {', '.join(param.choices)}, got {value!r}")
    if param.low is not None and not value >= param.low:
        raise UserError(f"{param.name} must be at least {param.low:g}, got {value}")


TRIGGER_STRATEGIES = next(p.choices for p in PARAMS if p.name == "trigger")
RECOMPUTE_MODES = next(p.choices for p in PARAMS if p.name == "recompute")

#: The corner that saves the most memory: every candidate, synchronized swap-outs, swap-ins
#: just before their readers.
LEAST_MEMORY = PlanParams(ub=1, sync_out=True)


@dataclass(frozen=True)
class RecomputePrice:
    """What a recompute through heavy ops is weighed with: per-op seconds and the host link."""

    cost: Mapping[str, float]
    link: Link

    def worth(self, ops: tuple[str, ...], nbytes: int, ratio: float) -> bool:
        """Whether re-running `ops` costs at most `ratio` times moving `nbytes` out and back."""
        seconds = sum(self.cost.get(o, 0.0) for o in ops)
        return seconds <= ratio * (nbytes / self.link.d2h + nbytes / self.link.h2d)
