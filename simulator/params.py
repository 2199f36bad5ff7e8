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
    "PlanParams",
    "RECOMPUTE_MAX_OPS",
    "RECOMPUTE_MODES",
    "RecomputePrice",
    "TRIGGER_STRATEGIES",
]

TRIGGER_STRATEGIES = ("direct_order", "chain_rule")

RECOMPUTE_MODES = ("none", "cheap")
#: the longest chain the search (and the time bound) lets a recompute re-run
RECOMPUTE_MAX_OPS = 8


@dataclass(frozen=True)
class PlanParams:
    """The swap parameters; the defaults are the original tool's (n_tensors=-1, lb=1, ub=10000).

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
    #: as that lowers the peak (`Engine`; 0: never)
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
    #: without them passes this many live bytes (`Engine`; 0: all of them)
    backward_limit: int = 0
    #: with recomputes, also re-run convolutions and matrix products where the chain costs at
    #: most this many times the transfer time of its tensor, out and back (`RecomputePrice`;
    #: 0: never; on a link-bound step 1 trades them even, below 1 leaves room for overlap)
    recompute_heavy: float = 0.0

    def __post_init__(self) -> None:
        if self.n_tensors < -1:
            raise UserError(f"n_tensors must be -1 (all), 0 (none) or more, got {self.n_tensors}")
        if not 1 <= self.lb <= self.ub:
            raise UserError(f"need 1 <= lb <= ub, got lb={self.lb}, ub={self.ub}")
        if self.sync_lag < 0:
            raise UserError(f"sync_lag must be 0 (the readers wait) or more, got {self.sync_lag}")
        if self.threshold < 1 or self.groupby < 0:
            raise UserError("threshold must be at least 1 and groupby at least 0")
        if self.trigger not in TRIGGER_STRATEGIES:
            raise UserError(f"trigger must be one of {', '.join(TRIGGER_STRATEGIES)}")
        if self.recompute not in RECOMPUTE_MODES:
            raise UserError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}")
        if self.recompute_limit < 0:
            raise UserError(f"recompute_limit must be 0 (off) or more, got {self.recompute_limit}")
        if self.backward_limit < 0:
            raise UserError(f"backward_limit must be 0 (off) or more, got {self.backward_limit}")
        if self.prefetch_bytes < 0:
            raise UserError(f"prefetch_bytes must be 0 (off) or more, got {self.prefetch_bytes}")
        if not self.recompute_heavy >= 0:
            raise UserError(f"recompute_heavy must be 0 (off) or more, got {self.recompute_heavy}")
        if self.recompute_ops < 1:
            raise UserError(f"recompute_ops must be at least 1, got {self.recompute_ops}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanParams:
        """The parameters `to_dict` wrote (lists back to tuples)."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


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
