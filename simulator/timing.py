"""The time model: one compute stream and two copy streams (device→host, host→device).

Ops run one after another in the schedule, each taking its cost. A swap-out is queued on the
device→host stream when its producer ends; a swap-in is queued on the host→device stream when
its trigger ends (and not before its swap-out finished), those of one trigger in the order of
their readers; an op that reads a swapped-in copy waits
for that copy to arrive, and the wait is a stall. Under a synchronized swap-out, the tensor's
other readers wait for the swap-out to finish. Transfers overlap compute; where the link cannot
copy both ways at full bandwidth, the two streams slow each other (`simulator.streams`). Ops a
plan re-runs (`Recompute`) run on the compute stream right after their trigger, taking their own
cost again.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from simulator.graph import Graph
from simulator.order import Order
from simulator.plan import SwapPlan
from simulator.streams import Link, streams_for

__all__ = ["Link", "TimeResult", "Timeline", "Transfer", "simulate_time"]


@dataclass(frozen=True)
class Transfer:
    """One copy on a copy stream: `direction` is 'd2h' (swap-out) or 'h2d' (swap-in)."""

    tensor: str
    direction: str
    nbytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Per-step compute seconds in a schedule and their running sum: built once per graph."""

    order: Order
    cost: list[float]
    base_end: list[float]

    @classmethod
    def build(cls, order: Order, cost: dict[str, float]) -> Timeline:
        """`cost` gives each op's compute seconds (ops missing from it take none)."""
        seconds = [cost.get(name, 0.0) for name in order.ops]
        return cls(order, seconds, list(itertools.accumulate(seconds)))

    @property
    def baseline_seconds(self) -> float:
        return self.base_end[-1] if self.base_end else 0.0


@dataclass(frozen=True)
class TimeResult:
    """Predicted step time with its stalls and transfers; per-step times derive from them."""

    timeline: Timeline
    step_seconds: float
    stalls: dict[int, float]
    transfer_rows: list[tuple[str, str, int, float, float]] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)
    #: per trigger step, the seconds of the ops the plan re-runs after it
    recomputed: dict[int, float] = field(default_factory=dict)
    #: per stalled step, what it waited for last: "swap-out" (a synchronized swap-out's
    #: reader or waiter) or "swap-in"
    stall_causes: dict[int, str] = field(default_factory=dict)
    #: per trigger step, the seconds its re-run ops waited for their swapped-in inputs
    recompute_waits: dict[int, float] = field(default_factory=dict)

    @property
    def recompute_seconds(self) -> float:
        """Compute time spent re-running ops, per step."""
        return sum(self.recomputed.values())

    @property
    def transfers(self) -> list[Transfer]:
        """Every copy on the two streams, in the order it was queued."""
        return [Transfer(*row) for row in self.transfer_rows]

    @property
    def baseline_seconds(self) -> float:
        return self.timeline.baseline_seconds

    @property
    def overhead(self) -> float:
        """Step time with the plan divided by without it."""
        base = self.baseline_seconds
        return self.step_seconds / base if base else 1.0

    @property
    def stall_seconds(self) -> float:
        return sum(self.stalls.values())

    def waits(self) -> dict[str, float]:
        """Seconds the step waited, by what for: ops for swap-outs, ops for swap-ins, and
        re-run ops for the swap-ins they read."""
        out = dict.fromkeys(("swap-out", "swap-in"), 0.0)
        for p, seconds in self.stalls.items():
            out[self.stall_causes.get(p, "swap-in")] += seconds
        out["recompute input"] = sum(self.recompute_waits.values(), 0.0)
        return out

    def end(self) -> list[float]:
        """When each step's op ends, stalls and the re-run ops after earlier steps included."""
        shift, out = 0.0, []
        last = len(self.timeline.base_end) - 1
        for p, e in enumerate(self.timeline.base_end):
            shift += self.stalls.get(p, 0.0)
            out.append(e + shift)
            if p < last:
                shift += self.recompute_waits.get(p, 0.0) + self.recomputed.get(p, 0.0)
        return out


def simulate_time(graph: Graph, timeline: Timeline, plan: SwapPlan, link: Link) -> TimeResult:
    """Walk only the steps where a swap happens; between them ops run back to back, so each
    step's end is its stall-free end shifted by the stalls before it."""
    outs, ins, waits = _swap_steps(graph, timeline.order, plan)
    extra = _recompute_steps(timeline, plan)
    streams = streams_for(link)
    cost, base_end = timeline.cost, timeline.base_end
    shift, stalls, causes, held = 0.0, {}, {}, {}
    marks: list[tuple[int, float]] = [(-1, 0.0)]  # (step, shift from that step on)
    for p in sorted({*outs, *ins, *waits, *extra}):
        start = base_end[p] - cost[p] + shift
        ready, last = max(((streams.arrival(w), w[1]) for w in waits.get(p, ())),
                          default=(start, 0))  # fmt: skip
        if ready > start:
            stalls[p] = ready - start
            causes[p] = "swap-out" if last < 0 else "swap-in"
            shift += ready - start
            marks.append((p, shift))
        now = base_end[p] + shift
        for tensor, nbytes in outs.get(p, ()):
            streams.swap_out(tensor, nbytes, now)
        for tensor, k, nbytes in ins.get(p, ()):
            streams.swap_in(tensor, k, nbytes, now)
        if p in extra and p + 1 < len(base_end):  # the re-run ops delay the next op
            seconds, sources = extra[p]
            ready = max((streams.arrival(s) for s in sources), default=now)
            if ready > now:  # waiting for swapped-in inputs first
                held[p] = ready - now
            shift += held.get(p, 0.0) + seconds
            marks.append((p + 1, shift))
    streams.finish()
    firsts = [base_end[max(step, 0)] + shift for step, shift in marks] if base_end else []
    released = {
        t: _first_end_after(done, base_end, marks, firsts) for t, done in streams.out_done.items()
    }
    total = timeline.baseline_seconds + shift
    recomputed = {p: seconds for p, (seconds, _) in extra.items()}
    return TimeResult(
        timeline, total, stalls, streams.transfers, released, recomputed, causes, held
    )


def _recompute_steps(
    timeline: Timeline, plan: SwapPlan
) -> dict[int, tuple[float, list[tuple[str, int]]]]:
    """Per trigger step, the cost of the ops the plan re-runs after it (their own cost) and
    the swap-ins (tensor, k) they read, which must have arrived first."""
    pos = timeline.order.position
    out: dict[int, tuple[float, list[tuple[str, int]]]] = {}
    for rc in plan.recomputes:
        at = pos[rc.trigger]
        seconds, sources = out.get(at, (0.0, []))
        cost = sum(timeline.cost[pos[o]] for o in rc.ops)
        out[at] = (seconds + cost, [*sources, *rc.sources])
    return out


_Steps = tuple[
    dict[int, list[tuple[str, int]]],
    dict[int, list[tuple[str, int, int]]],
    dict[int, list[tuple[str, int]]],
]


def _swap_steps(graph: Graph, order: Order, plan: SwapPlan) -> _Steps:
    """Per step: swap-outs after it, swap-ins triggered by it, copies it waits for (swap-in k
    of a tensor, or its swap-out as k = -1 when the swap is synchronized: by its forward
    readers, or by its waiter)."""
    pos = order.position
    outs: dict[int, list[tuple[str, int]]] = {}
    ins: dict[int, list[tuple[str, int, int]]] = {}
    waits: dict[int, list[tuple[str, int]]] = {}
    for swap in plan.swaps:
        produced = pos[graph.tensors[swap.tensor].producer]
        outs.setdefault(produced, []).append((swap.tensor, swap.nbytes))
        for k, s in enumerate(swap.swap_ins):
            ins.setdefault(pos[s.trigger], []).append((swap.tensor, k, swap.nbytes))
            for c in s.consumers:
                waits.setdefault(pos[c], []).append((swap.tensor, k))
        if swap.sync and swap.waiter:
            waits.setdefault(pos[swap.waiter], []).append((swap.tensor, -1))
        elif swap.sync:
            rerouted = swap.rerouted
            for c in dict.fromkeys(graph.tensors[swap.tensor].consumers):
                if c not in rerouted:
                    waits.setdefault(pos[c], []).append((swap.tensor, -1))
    needed = plan.first_reads(pos)
    for queue in ins.values():  # copies one trigger starts go in the order they are needed
        queue.sort(key=lambda q: needed[q[0], q[1]])
    return outs, ins, waits


def _first_end_after(
    done: float, base_end: list[float], marks: list[tuple[int, float]], firsts: list[float]
) -> int:
    """The first step whose end (stalls included) is at or after `done`; len(steps) if none.

    `marks` splits the steps into segments of constant shift and `firsts` holds each segment's
    first end; ends grow along the schedule, so bisecting `firsts` finds the segment.
    """
    i = max(bisect.bisect_right(firsts, done) - 1, 0)
    step, shift = marks[i]
    hi = marks[i + 1][0] if i + 1 < len(marks) else len(base_end)
    q = bisect.bisect_left(base_end, done - shift, max(step, 0), hi)
    return q if q < hi else hi
