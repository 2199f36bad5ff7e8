"""Lower a plan onto a compiled program: swap-outs, swap-ins, recomputes, rerouted consumers.

The device copy of a swapped tensor dies after its last consumer that is not rerouted (or, with
the time model, once its copy to the host has finished, if that is later); each swap-in allocates
a device copy when its trigger op has run (after the inputs the trigger was the last to read are
freed), which its rerouted consumers read; the host copy is
released once the last swap-in has read it. A recomputed tensor's original dies after its last
consumer that is not rerouted; when its trigger has run, the outputs of the re-run ops are
allocated (the chain's intermediates freed once it is done), and the chain's inputs live at
least until then: one whose last reader is the chain is freed after it has run, as TensorFlow
frees it after the copy that reads it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from simulator.graph import Graph, Op
from simulator.opsemantics import PRODUCTS
from simulator.plan import InvalidPlan, Recompute, Swap, SwapPlan
from simulator.program import PlacedOutput, Program, added_visits
from simulator.trace import copy_name, remade_name

__all__ = ["lower_plan"]


def lower_plan(
    program: Program, graph: Graph, plan: SwapPlan, release: dict[str, int] | None = None
) -> Program:
    """`program` with `plan` applied; `release` gives, per tensor, the step by which its copy to
    the host has finished (from the time model). Raise InvalidPlan for a plan that cannot run."""
    reads = Counter(n for rc in plan.recomputes for n in rc.reads(graph))
    pos = program.order.position
    regrouped = (pos[n] for n in graph.rewritten if n in pos and graph.ops[n].type in PRODUCTS)
    shared = frozenset(n for n, k in reads.items() if k > 1)
    lowered = _Lowering(program, shared, frozenset(regrouped))
    seen: set[str] = set()
    for swap in plan.swaps:
        if swap.tensor in seen:
            raise InvalidPlan(f"tensor {swap.tensor!r} is swapped twice")
        seen.add(swap.tensor)
        lowered.add(graph, swap, (release or {}).get(swap.tensor, -1))
    for rc in plan.recomputes:
        if rc.tensor in seen:
            raise InvalidPlan(f"tensor {rc.tensor!r} is both swapped and recomputed, or twice")
        seen.add(rc.tensor)
        lowered.add_recompute(graph, rc)
    return lowered.program()


class _Lowering:
    """Copies of the program's lists, edited swap by swap."""

    def __init__(
        self,
        program: Program,
        shared: frozenset[str] = frozenset(),
        regrouped: frozenset[int] = frozenset(),
    ) -> None:
        self.base = program
        self.steps = list(program.steps)
        self.last = list(program.last_use)
        self.names = list(program.names)
        self.alloc = list(program.alloc_bytes)
        self.host_out: dict[int, list[tuple[int, int]]] = {}
        self.host_free: dict[int, list[tuple[int, int]]] = {}
        self.swap_ins: dict[int, list[PlacedOutput]] = {}
        self.recomputes: dict[int, list[tuple[int, int, int]]] = {}
        self.extended: list[int] = []  # steps to which a chain's input now lives
        self._recomputed: list[str] = []
        #: tensors more than one recompute reads: never written into by a chain
        self.shared = shared
        #: (swapped tensor, k) -> the id of swap-in k's copy and the step it is placed at
        self.copies: dict[tuple[str, int], tuple[int, int]] = {}
        #: per step rerouted so far, which of its output entries name each buffer
        self._naming: dict[int, dict[int, list[int]]] = {}
        #: the steps of products Grappler regroups (`PRODUCTS`): rerouted, they take over no
        #: buffer of the swap-in or copy they now read
        self.regrouped = regrouped

    def _reroute_step(self, p: int, old: int, new: int) -> None:
        """Make the outputs of the op at step `p` write into `new` wherever they would have
        written into `old` (the entries are indexed: the optimizer's IdentityN has one per
        gradient and is rerouted once per swapped gradient)."""
        naming = self._naming.get(p)
        if naming is None:
            naming = self._naming[p] = {}
            for i, (_, _, fwd, cands) in enumerate(self.steps[p]):
                for b in {fwd, *cands} - {-1}:
                    naming.setdefault(b, []).append(i)
        hit = naming.pop(old, [])
        if hit:
            outs = self.steps[p] = list(self.steps[p])
            into = -1 if p in self.regrouped else new
            for i in hit:
                outs[i] = _reroute(outs[i], old, into)
            if into >= 0:
                naming.setdefault(into, []).extend(hit)

    def add(self, graph: Graph, swap: Swap, released: int) -> None:
        pos = self.base.order.position
        rerouted = swap.rerouted
        t = self._tensor_id(graph, swap, rerouted)
        tensor = graph.tensors[swap.tensor]
        produced = pos[tensor.producer]
        kept = [pos[c] for c in tensor.consumers if c not in rerouted]
        self.last[t] = max([produced, released, *kept])
        self.host_out.setdefault(produced, []).append((t, self.alloc[t]))
        done = produced
        for k, swap_in in enumerate(swap.swap_ins):
            at = self._add_swap_in(t, produced, swap, k, swap_in.trigger, swap_in.consumers)
            done = max(done, at)
        self.host_free.setdefault(done, []).append((t, self.alloc[t]))

    def _tensor_id(self, graph: Graph, swap: Swap, rerouted: frozenset[str]) -> int:
        tensor = graph.tensors.get(swap.tensor)
        if tensor is None or swap.tensor not in self.base.tid:
            raise InvalidPlan(f"plan swaps tensor {swap.tensor!r}, which is not in the graph")
        if tensor.kind.resident:
            raise InvalidPlan(f"tensor {swap.tensor!r} is resident ({tensor.kind.value})")
        if swap.tensor in graph.outputs:
            raise InvalidPlan(f"tensor {swap.tensor!r} is an output of the step")
        missing = rerouted.difference(tensor.consumers)
        if missing:
            raise InvalidPlan(f"ops {sorted(missing)} do not read tensor {swap.tensor!r}")
        return self.base.tid[swap.tensor]

    def _add_swap_in(
        self, t: int, produced: int, swap: Swap, k: int, trigger: str, consumers: tuple[str, ...]
    ) -> int:
        """Allocate a device copy after the trigger's step and reroute `consumers` to it."""
        pos = self.base.order.position
        if trigger not in pos:
            raise InvalidPlan(f"swap-in trigger op {trigger!r} is not in the graph")
        at = pos[trigger]
        if at < produced:
            raise InvalidPlan(
                f"swap-in of {swap.tensor!r} is triggered by {trigger!r} (step {at}) before the "
                f"tensor was produced and swapped out (step {produced})"
            )
        for c in consumers:
            if pos[c] <= at:
                raise InvalidPlan(
                    f"op {c!r} (step {pos[c]}) reads {swap.tensor!r} while it is only on the "
                    f"host: its swap-in is triggered by {trigger!r} at step {at}"
                )
        sid = len(self.names)
        self.copies[(swap.tensor, k)] = (sid, at)
        self.names.append(copy_name(swap.tensor, k))
        self.alloc.append(self.alloc[t])
        self.last.append(max(pos[c] for c in consumers))
        self.swap_ins.setdefault(at, []).append((sid, self.alloc[t], -1, ()))
        for c in consumers:
            self._reroute_step(pos[c], t, sid)
        return at

    def add_recompute(self, graph: Graph, rc: Recompute) -> None:
        """Free the original after its kept readers; re-run the chain after the trigger."""
        pos = self.base.order.position
        t = self._recomputed_id(graph, rc)
        self._recomputed.append(rc.tensor)
        tensor = graph.tensors[rc.tensor]
        kept = [pos[c] for c in tensor.consumers if c not in rc.consumers]
        self.last[t] = max([pos[tensor.producer], *kept])
        at = pos[rc.trigger]
        if any(pos[c] <= at for c in rc.consumers):
            raise InvalidPlan(f"recompute of {rc.tensor!r} is triggered after one of its readers")
        sources = self._sources(rc, at)
        inner = rc.made(graph)
        external: dict[str, int] = {}  # the tensors the chain reads, by name
        for op_name in rc.ops:
            for name in graph.ops[op_name].inputs:
                if name not in inner and name in self.base.tid:
                    i = external[name] = sources.get(name, self.base.tid[name])
                    self.last[i] = max(self.last[i], at)  # the chain reads it at `at`
                    self.extended.append(self.last[i])
        events, made = self._chain_events(graph, rc, at, external)
        if rc.tensor not in made:
            raise InvalidPlan(f"recompute of {rc.tensor!r}: its ops do not produce it")
        sid = made[rc.tensor]
        self.last[sid] = max(pos[c] for c in rc.consumers)
        self.recomputes.setdefault(at, []).extend(events)
        for c in rc.consumers:
            self._reroute_step(pos[c], t, sid)

    def _chain_events(
        self, graph: Graph, rc: Recompute, at: int, external: dict[str, int]
    ) -> tuple[list[tuple[int, int, int]], dict[str, int]]:
        """The chain's buffers, op by op, as (buffer id, bytes, +1 placed / -1 freed) events,
        and the buffer of each tensor it makes. An element-wise op writes into an input buffer
        of its size that it reads for the last time (as its kernel does): one the chain made,
        or, for the tensor recomputed, one of `external` (what the chain reads, by name: its
        tensor id) that nothing reads after the chain. An intermediate's buffer is freed after
        its last reader in the chain; a tensor of `external` that the chain reads last, after
        its last reader in the chain (an event of sign 0)."""
        last_read = {n: j for j, o in enumerate(rc.ops) for n in graph.ops[o].inputs}
        events: list[tuple[int, int, int]] = []
        made: dict[str, int] = {}
        for j, op_name in enumerate(rc.ops):
            op = graph.ops[op_name]
            ends = [n for n in dict.fromkeys(op.inputs) if n in external and last_read[n] == j]
            dying = [n for n in dict.fromkeys(op.inputs) if n in made and last_read[n] == j]
            for k, name in enumerate(op.outputs):
                base = self.base.tid.get(name)
                if base is None or not self.alloc[base]:
                    continue
                size = self.alloc[base]
                taken = self._taken(op, k, name == rc.tensor, dying, ends, made, external, at)
                if taken is not None:
                    made[name] = taken
                    continue
                made[name] = len(self.names)
                self.names.append(remade_name(name))
                self.alloc.append(size)
                self.last.append(at)
                events.append((made[name], size, 1))
                if name != rc.tensor and name not in last_read:
                    dying.append(name)  # an output no later op of the chain reads
            events += [(made[n], self.alloc[made[n]], -1) for n in dying]
            events += [(external[n], 0, 0) for n in ends]
        return events, made

    def _taken(
        self,
        op: Op,
        k: int,
        final: bool,
        dying: list[str],
        ends: list[str],
        made: dict[str, int],
        external: dict[str, int],
        at: int,
    ) -> int | None:
        """The buffer output `k` of `op` writes into (`dying` or `ends` lose the input taken),
        or None for a new one; `final`: the output is the tensor recomputed."""
        if k != 0:
            return None
        size = self.alloc[self.base.tid[op.outputs[0]]]
        for i in op.inplace:
            name = op.inputs[i]
            if name in dying and self.alloc[made[name]] == size:
                dying.remove(name)
                return made[name]
            t = external.get(name, -1)
            alone = final and name in ends and name not in self.shared
            if alone and self.alloc[t] == size and self.last[t] == at:  # nothing reads it later
                ends.remove(name)
                return t
        return None

    def _sources(self, rc: Recompute, at: int) -> dict[str, int]:
        """The swapped-in copies a chain reads, by the tensor they copy, checked to be there
        when the chain runs after step `at`."""
        out = {}
        for name, k in rc.sources:
            if (name, k) not in self.copies:
                raise InvalidPlan(
                    f"recompute of {rc.tensor!r} reads swap-in {k} of {name!r}, "
                    "which the plan does not have"
                )
            sid, placed = self.copies[(name, k)]
            if placed > at:
                raise InvalidPlan(
                    f"recompute of {rc.tensor!r} runs before swap-in {k} of {name!r} that it reads"
                )
            out[name] = sid
        return out

    def _recomputed_id(self, graph: Graph, rc: Recompute) -> int:
        tensor = graph.tensors.get(rc.tensor)
        if tensor is None or rc.tensor not in self.base.tid:
            raise InvalidPlan(f"plan recomputes tensor {rc.tensor!r}, which is not in the graph")
        if not tensor.kind.on_device or rc.tensor in graph.outputs:
            raise InvalidPlan(f"tensor {rc.tensor!r} is not a transient tensor of the step")
        missing = [o for o in (*rc.ops, rc.trigger) if o not in graph.ops]
        if missing:
            raise InvalidPlan(f"recompute of {rc.tensor!r} names ops missing from the graph")
        if set(rc.consumers).difference(tensor.consumers):
            raise InvalidPlan(f"recompute of {rc.tensor!r} reroutes ops that do not read it")
        return self.base.tid[rc.tensor]

    def program(self) -> Program:
        # the walk visits the steps where the plan moved a swapped tensor's last use, where a
        # swapped-in copy (appended after the base's tensors) is last read, and its swap steps
        moved = [self.last[t] for outs in self.host_out.values() for t, _ in outs]
        moved += [self.last[self.base.tid[n]] for n in self._recomputed]
        added = self.last[len(self.base.last_use) :]
        planned = [*self.host_out, *self.host_free, *self.swap_ins, *self.recomputes]
        return dataclasses.replace(
            self.base,
            steps=self.steps,
            last_use=self.last,
            names=self.names,
            alloc_bytes=self.alloc,
            host_out=self.host_out,
            host_free=self.host_free,
            swap_ins=self.swap_ins,
            recomputes=self.recomputes,
            visits=added_visits(self.base.visits, [*moved, *added, *planned, *self.extended]),
        )


def _reroute(out: PlacedOutput, old: int, new: int) -> PlacedOutput:
    """An output entry of a rerouted consumer that reads `new` wherever it read `old` (with
    `new` -1, one that takes over `old`'s replacement in no case)."""
    t, nbytes, fwd, cands = out
    moved = tuple(new if c == old else c for c in cands)
    return (t, nbytes, new if fwd == old else fwd, tuple(c for c in moved if c >= 0))
