"""The swap parameters of a plan (the papers' `n_tensors`, `lb`, `ub` and ours), validated, and
the price a heavy recompute is weighed with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from simulator.errors import UserError
from simulator.timing import Link

__all__ = [
    "Draw",
    "LEAST_MEMORY",
    "PARAMS",
    "PREFETCH_SHARES",
    "Param",
    "PlanParams",
    "RECOMPUTE_HEAVY",
    "RECOMPUTE_MAX_OPS",
    "RECOMPUTE_MODES",
    "RecomputePrice",
    "TRIGGER_STRATEGIES",
]

#: the longest chain the search (and the time bound) lets a recompute re-run
RECOMPUTE_MAX_OPS = 8


#: the shares of the transfer time a recompute chain through convolutions or matrix products
#: may cost that the tuner tries (`PlanParams.recompute_heavy`)
RECOMPUTE_HEAVY = (0.0, 0.25, 1.0)
#: the range of the share of the budget prefetched swap-ins may fill that the tuner draws from
#: (of the live bytes: the allocator's peak is higher by its fragmentation)
PREFETCH_SHARES = (0.7, 1.0)

#: What the ranges and conditions of `Draw` are called in docs/cli.md.
RANGES = {
    "levels": "the step's levels",
    "candidates": "the forward candidates",
    "fewest": "0 (1 if recomputes are off)",
}
CONDITIONS = {
    "timed": "a device",
    "searched": "`fit --recompute search` (the default)",
    "recomputes": "recomputes not off",
    "every": "every forward candidate",
    "cheap": "--recompute cheap",
    "aims": "--recompute cheap or --backward-swaps",
}


@dataclass(frozen=True)
class Draw:
    """How the tuner draws one parameter (`autotune.search.space.Space` reads it).

    `kind` is "int", "float" or "choice" (of `values`); "share" draws a share of the budget
    (from `low` to `high`) and sets that many bytes; "budget" draws nothing and sets the
    budget. `low` and `high` are numbers or a range of the graph (`RANGES`); `log` samples on
    a log scale. `top` is the value drawing `high` stands for, `bottom` the value drawing `low`
    stands for. `below` names a parameter drawn alike before this one: the two are sorted.
    `when` lists what must hold for it to be drawn: a fact of the run (`CONDITIONS`) or a
    parameter drawn true before it; `gate` is a yes/no the trial draws first, under that name.
    `move` is how the pattern search steps it: "scale" (a few per cent), "double" (doubled,
    then halved), "halve" (halved, then doubled), "one" (one up or down), "nudge" (0.05 up or
    down), "flip" (the other of two) or "next" (the neighbouring value)."""

    kind: str
    low: float | str = 0
    high: float | str = 0
    log: bool = False
    values: tuple[Any, ...] = (False, True)
    top: int | None = None
    bottom: int | None = None
    below: str = ""
    when: tuple[str, ...] = ()
    gate: str = ""
    move: str = ""

    def describe(self) -> str:
        """What docs/cli.md says of the draw."""
        if self.kind == "budget":
            what = "the budget"
        elif self.kind == "choice":
            shown = ", ".join(map(str, self.values))
            what = "either" if len(self.values) == 2 else f"one of {shown}"
        else:
            low, high = (RANGES.get(str(x), f"{x:g}" if isinstance(x, float) else str(x))
                         for x in (self.low, self.high))  # fmt: skip
            what = f"{low} to {high}" + (", log" if self.log else "")
            if self.kind == "share":
                what = f"off, or {what} of the budget"
        stand = (("highest", self.top), ("lowest", self.bottom))
        ends = [f"the {r} stands for {v}" for r, v in stand if v is not None]
        if self.below:
            ends.append(f"sorted with {self.below}")
        conds = [CONDITIONS.get(c, "--" + c.replace("_", "-")) for c in self.when]
        return (
            what
            + (f" ({'; '.join(ends)})" if ends else "")
            + (f", with {' and '.join(conds)}" if conds else "")
        )


@dataclass(frozen=True)
class Param:
    """One plan parameter's row of `PARAMS`: what validation, the command line, the docs and
    the tuner know of it (its type and default are `PlanParams`' field's).

    `low` is its least value (numbers), `choices` its values (strings), `size` says that it
    counts bytes (given as 14GiB on the command line), `flag` is its command-line option
    when that is not `--name` (a flag that turns the default off), `draw` how the tuner
    draws it (None: it does not)."""

    name: str
    help: str
    low: float | None = None
    choices: tuple[str, ...] = ()
    size: bool = False
    flag: str = ""
    draw: Draw | None = None

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


_BOOL = Draw("choice")
_TRIGGERS = ("direct_order", "chain_rule")
_RECOMPUTE_MODES = ("none", "cheap")

#: Every plan parameter, the papers' first, in the order the tuner draws them. What each
#: means, in one line each.
PARAMS: tuple[Param, ...] = (
    Param(
        "n_tensors",
        "tensors to swap: -1 all, 0 none",
        low=-1,
        draw=Draw("int", "fewest", "candidates", top=-1, move="scale"),
    ),
    Param(
        "lb",
        "swap in at least this many levels early",
        low=1,
        draw=Draw("int", 1, "levels", log=True),
    ),
    Param(
        "ub",
        "swap in at most this many levels early",
        low=1,
        draw=Draw("int", 1, "levels", log=True, below="lb", move="double"),
    ),
    Param(
        "threshold",
        "swap only tensors read at least this many levels after they are made",
        low=1,
        draw=Draw("int", 1, "levels", log=True, move="double"),
    ),
    Param(
        "groupby",
        "fuse swap-ins of one tensor whose readers lie within this many levels",
        low=0,
        draw=Draw("int", 0, "levels", move="halve"),
    ),
    # not drawn: the tuner never chose chain_rule on the corpus (docs/method.md, "Search")
    Param("trigger", "how to find swap-in triggers", choices=_TRIGGERS),
    Param(
        "sync_out",
        "forward readers of a swapped tensor wait for its swap-out (original sync_mode 1)",
        draw=_BOOL,
    ),
    Param(
        "sync_lag",
        "with --sync-out, the first op this many levels after a swapped tensor's producer "
        "waits for its swap-out instead of its readers (0: the readers wait)",
        low=0,
        draw=Draw("int", 1, "levels", log=True, bottom=0, when=("sync_out",), move="double"),
    ),
    Param(
        "serialize",
        "add order edges that keep the backward pass from holding large tensors at once, and "
        "run loops one iteration at a time",
        draw=_BOOL,
    ),
    Param(
        "prefetch_bytes",
        "with --device: move swap-ins earlier, and with --sync-out the waits for "
        "swap-outs later, while the live bytes stay within this size, e.g. 14GiB (0: off)",
        low=0,
        size=True,
        flag="--prefetch",
        draw=Draw("share", *PREFETCH_SHARES, when=("timed",), gate="prefetch", move="nudge"),
    ),
    Param(
        "postpone_waits",
        "with --prefetch and --sync-out: leave the waits for swap-outs where they are",
        flag="--no-postpone-waits",
        draw=Draw("choice", when=("prefetch", "sync_out"), move="flip"),
    ),
    Param(
        "recompute",
        "none: swap only; cheap: make every tensor a short chain of cheap element-wise "
        "ops can make from tensors held anyway again in the backward pass, swap the rest",
        choices=_RECOMPUTE_MODES,
        draw=Draw("choice", values=_RECOMPUTE_MODES, when=("searched",)),
    ),
    Param(
        "recompute_ops",
        "ops a recompute may re-run",
        low=1,
        draw=Draw("int", 1, RECOMPUTE_MAX_OPS, when=("recomputes",), move="one"),
    ),
    Param(
        "recompute_heavy",
        "with --recompute cheap and --device: chains may also re-run convolutions and "
        "matrix products where they cost at most this share of the transfer time they save, "
        "e.g. 1 (0: never)",
        low=0,
        draw=Draw("choice", values=RECOMPUTE_HEAVY, when=("cheap", "timed"), move="next"),
    ),
    Param(
        "backward_swaps",
        "with --n-tensors -1, also swap tensors the backward pass makes and first reads "
        "at least --threshold levels later (weight gradients held for the optimizer)",
        draw=Draw("choice", when=("every",), move="flip"),
    ),
    Param(
        "limit",
        "the size the plan aims under, e.g. 14GiB (fit sets it to the budget; 0: none): "
        "while the plan's simulated peak passes it, the recomputes whose chains hold bytes "
        "at the peak are swapped instead; with --backward-swaps only the backward tensors "
        "live where the plan without them passes it are swapped",
        low=0,
        size=True,
        draw=Draw("budget", when=("aims",)),
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
    least-memory peak (`simulator.order_edges`), and runs the step's loops one iteration at a
    time (`Op.ahead`); the engine that evaluates the plan finds them.
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
    #: with `sync_out`, the first op at least this many levels after a swapped tensor's
    #: producer waits for its swap-out instead of its readers (0: the readers wait); the
    #: forward pass may then run ahead of the link by that many levels
    sync_lag: int = 0
    #: also swap tensors the backward pass makes and first reads at least `threshold` levels
    #: later (weight gradients held for the optimizer, a branch's input gradient held for the
    #: sum with the other branch's): they come after the forward candidates, so `n_tensors`
    #: reaches them last (ours; the original tool swapped forward tensors only)
    backward_swaps: bool = False
    #: the bytes the plan aims under (`simulator.refine`; 0: none): with recomputes, while the
    #: plan's simulated peak passes it, the recomputes whose chains hold bytes at the peak are
    #: swapped instead, as long as that lowers the peak; with `backward_swaps`, only the
    #: backward tensors live at a step where the plan without them passes it in live bytes
    #: are swapped (else all of them)
    limit: int = 0
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
        """The parameters `to_dict` wrote (lists back to tuples). Plan files and studies
        written before `limit` had its two halves, `recompute_limit` and `backward_limit`:
        `fit` set each to the budget where it applied, so their larger is the limit."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in data.items()
            if k not in _MERGED_INTO_LIMIT
        }
        halves = [int(data[k]) for k in _MERGED_INTO_LIMIT if data.get(k)]
        if halves and "limit" not in fields:
            fields["limit"] = max(halves)
        return cls(**fields)


#: the two parameters `PlanParams.limit` was, read from older plan files and studies
_MERGED_INTO_LIMIT = ("recompute_limit", "backward_limit")


def _check(param: Param, value: Any) -> None:
    """One parameter's value against its row: its least value, or its choices."""
    if param.choices and value not in param.choices:
        raise UserError(f"{param.name} must be one of {', '.join(param.choices)}, got {value!r}")
    if param.low is not None and not value >= param.low:
        raise UserError(f"{param.name} must be at least {param.low:g}, got {value}")


TRIGGER_STRATEGIES = _TRIGGERS
RECOMPUTE_MODES = _RECOMPUTE_MODES

#: The corner that saves the most memory: every candidate, synchronized swap-outs, swap-ins
#: just before their readers, and the backward pass's long-held tensors swapped too.
LEAST_MEMORY = PlanParams(ub=1, sync_out=True, backward_swaps=True)


@dataclass(frozen=True)
class RecomputePrice:
    """What a recompute through heavy ops is weighed with: per-op seconds and the host link."""

    cost: Mapping[str, float]
    link: Link

    def worth(self, ops: tuple[str, ...], nbytes: int, ratio: float) -> bool:
        """Whether re-running `ops` costs at most `ratio` times moving `nbytes` out and back."""
        seconds = sum(self.cost.get(o, 0.0) for o in ops)
        return seconds <= ratio * (nbytes / self.link.d2h + nbytes / self.link.h2d)
