"""The swap plan: plain data that the simulator simulates and the TensorFlow rewriter applies.

A plan swaps tensors to the host and back (`Swap`) and recomputes others in the backward pass
(`Recompute`).

One `SwapPlan` object is the single source of truth for both, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simulator.errors import UserError

if TYPE_CHECKING:
    from simulator.graph import Graph

__all__ = ["InvalidPlan", "Recompute", "Swap", "SwapIn", "SwapPlan"]


class InvalidPlan(UserError):
    """The plan cannot run on this graph: it names missing ops, or reads a tensor on the host."""


@dataclass(frozen=True)
class SwapIn:
    """Bring a swapped tensor back after op `trigger` ran, for the backward `consumers`."""

    trigger: str
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class Swap:
    """Copy `tensor` to the host once its producer ran; its device copy dies after the last
    consumer not rerouted to a swap-in; each swap-in brings it back for its consumers. With
    `sync`, the consumers not rerouted wait for the copy to finish (the original tool's
    `sync_mode` 1): the forward pass then cannot outrun the link and pile up device copies.
    With `sync` and a `waiter` (ours), that later op waits for the copy instead of the
    readers: the forward pass may then run ahead of the link by the ops in between, and the
    device copy outlives its last forward reader until the copy ends, before the waiter."""

    tensor: str
    nbytes: int
    swap_ins: tuple[SwapIn, ...]
    sync: bool = False
    waiter: str = ""

    def with_swap_ins(self, swap_ins: tuple[SwapIn, ...]) -> Swap:
        """This swap with other swap-ins (`dataclasses.replace`, without its cost: plan
        derivation makes such copies by the hundred thousand in a search)."""
        return Swap(self.tensor, self.nbytes, swap_ins, self.sync, self.waiter)

    @property
    def rerouted(self) -> frozenset[str]:
        """All consumers that read a swapped-in copy instead of the original."""
        return frozenset(c for s in self.swap_ins for c in s.consumers)


@dataclass(frozen=True)
class Recompute:
    """Free `tensor` after its last reader outside `consumers` and make it again, once op
    `trigger` has run, by re-running `ops` (in order; the last produces `tensor`) for the
    backward `consumers`. Every input of `ops` not made by `ops` itself is read from the
    tensors the step holds then, or, for a swapped input named in `sources` as (tensor,
    k), from the swap-in k of its `Swap`, triggered no later than `trigger`; the copies'
    intermediate outputs die within the chain."""

    tensor: str
    nbytes: int
    ops: tuple[str, ...]
    trigger: str
    consumers: tuple[str, ...]
    sources: tuple[tuple[str, int], ...] = ()

    def made(self, graph: Graph) -> set[str]:
        """The tensors the chain makes on `graph`."""
        return {t for o in self.ops for t in graph.ops[o].outputs}

    def reads(self, graph: Graph) -> set[str]:
        """The tensors the chain reads that it does not make itself."""
        return {t for o in self.ops for t in graph.ops[o].inputs} - self.made(graph)


@dataclass(frozen=True)
class SwapPlan:
    """The swaps of one graph, with the parameters they came from (for reports and checks).

    `order_edges` are `(before, after)` pairs of ops: `after` waits for `before`. They keep
    the backward pass from holding large tensors at the same time; the simulator orders
    the graph with them and the rewriter adds them as control edges. `serial_loops` are
    loops the rewriter has run one iteration at a time (`parallel_iterations` 1): they then
    hold nothing for iterations running ahead (`Op.ahead`).
    """

    swaps: tuple[Swap, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    graph_name: str = ""
    order_edges: tuple[tuple[str, str], ...] = ()
    recomputes: tuple[Recompute, ...] = ()
    serial_loops: tuple[str, ...] = ()

    @property
    def changes_nothing(self) -> bool:
        """No swap, no recompute, no order edge, no loop made serial: the step as it is."""
        return not (self.swaps or self.recomputes or self.order_edges or self.serial_loops)

    @property
    def swapped_bytes(self) -> int:
        """Bytes copied to the host per step."""
        return sum(s.nbytes for s in self.swaps)

    def first_reads(self, pos: dict[str, int]) -> dict[tuple[str, int], int]:
        """The step at which each swap-in (tensor, k) is first read: by an op it serves, or
        by a recompute's chain, which runs right after the recompute's trigger."""
        out = {
            (s.tensor, k): min(pos[c] for c in x.consumers)
            for s in self.swaps
            for k, x in enumerate(s.swap_ins)
        }
        for rc in self.recomputes:
            for source in rc.sources:
                out[source] = min(out[source], pos[rc.trigger] + 1)
        return out

    @property
    def recomputed_bytes(self) -> int:
        """Bytes of the tensors made again in the backward pass per step."""
        return sum(r.nbytes for r in self.recomputes)

    @property
    def recomputed_tensors(self) -> int:
        """How many tensors are made again in the backward pass."""
        return len({r.tensor for r in self.recomputes})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "params": dict(self.params),
            "graph": self.graph_name,
            "order_edges": [list(e) for e in self.order_edges],
            "serial_loops": list(self.serial_loops),
            "swaps": [
                {
                    "tensor": s.tensor,
                    "nbytes": s.nbytes,
                    "sync": s.sync,
                    "waiter": s.waiter,
                    "swap_ins": [
                        {"trigger": i.trigger, "consumers": list(i.consumers)} for i in s.swap_ins
                    ],
                }
                for s in self.swaps
            ],
            "recomputes": [
                {
                    "tensor": r.tensor,
                    "nbytes": r.nbytes,
                    "ops": list(r.ops),
                    "trigger": r.trigger,
                    "consumers": list(r.consumers),
                    "sources": [list(x) for x in r.sources],
                }
                for r in self.recomputes
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwapPlan:
        """Read back `to_dict`'s form."""
        swaps = tuple(
            Swap(
                s["tensor"],
                int(s["nbytes"]),
                tuple(SwapIn(i["trigger"], tuple(i["consumers"])) for i in s["swap_ins"]),
                bool(s.get("sync", False)),
                str(s.get("waiter", "")),
            )
            for s in data.get("swaps", [])
        )
        edges = tuple((str(a), str(b)) for a, b in data.get("order_edges", []))
        recomputes = tuple(
            Recompute(
                r["tensor"],
                int(r["nbytes"]),
                tuple(r["ops"]),
                r["trigger"],
                tuple(r["consumers"]),
                tuple((str(t), int(k)) for t, k in r.get("sources", [])),
            )
            for r in data.get("recomputes", [])
        )
        params = dict(data.get("params", {}))
        serial = tuple(str(n) for n in data.get("serial_loops", []))
        return cls(swaps, params, data.get("graph", ""), edges, recomputes, serial)
