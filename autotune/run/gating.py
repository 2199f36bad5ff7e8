"""Check from what TensorFlow executed that every swap-in waits for its trigger.

A swap-in saves memory only if the tensor reaches the compute device after the trigger ran. Two
checks, both read from the run and not from the graph the rewriter built:

- structure, from the partition graphs TensorFlow executed (run metadata): each swap-in runs on
  the host device, it depends on its trigger (directly, or through the `_Send`/`_Recv` pair
  that carries the trigger's control edge across devices), and no swapped tensor reaches the
  compute device except through a swap-in;
- time, from one profiled step: the host's `_Send` of each swap-in's tensor starts after its
  trigger ended. The receiving device allocates and copies only when that send arrives
  (TensorFlow's same-worker rendezvous), on a GPU as on two logical CPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from rewriter.apply import TunedStep
from rewriter.names import is_swap_op, is_swap_out

__all__ = ["Gate", "GatingReport", "check_gating", "executed_partitions"]


@dataclass(frozen=True)
class Gate:
    """One swap-in: where it ran, whether it waits for its trigger, and by how much its send
    followed the trigger's end in the profiled step (seconds; None when not seen)."""

    swap_in: str
    trigger: str
    device: str
    gated: bool
    reason: str
    lag_seconds: float | None = None
    waits: tuple[str, ...] = ()

    @property
    def sent_after_trigger(self) -> bool | None:
        return None if self.lag_seconds is None else self.lag_seconds >= 0


@dataclass(frozen=True)
class GatingReport:
    """The gates of all swap-ins, and any swapped tensor the compute device got another way."""

    gates: tuple[Gate, ...]
    leaks: tuple[str, ...] = ()

    @property
    def gated(self) -> int:
        """Swap-ins that wait for their trigger in the graph and, where timed, in the run."""
        return sum(g.gated and g.sent_after_trigger is not False for g in self.gates)

    def summary(self) -> str:
        timed = sum(g.lag_seconds is not None for g in self.gates)
        late = [g.lag_seconds for g in self.gates if g.lag_seconds is not None]
        when = f"; {timed} timed, sent {min(late) * 1e3:.2f} ms or more after" if late else ""
        leaks = f"; {len(self.leaks)} swapped tensors reach the device ungated" * bool(self.leaks)
        return f"{self.gated} of {len(self.gates)} swap-ins gated on their trigger{when}{leaks}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gated": self.gated,
            "swap_ins": len(self.gates),
            "leaks": list(self.leaks),
            "gates": [
                {
                    "swap_in": g.swap_in,
                    "trigger": g.trigger,
                    "device": g.device,
                    "gated": g.gated,
                    "reason": g.reason,
                    "lag_seconds": g.lag_seconds,
                    "waits_for": list(g.waits),
                }
                for g in self.gates
            ],
        }


def executed_partitions(tuned: TunedStep, *inputs: Any) -> list[Any]:
    """Run the tuned step and return the partition graphs TensorFlow executed (run metadata
    reports them on a function's first run only)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        tuned(*inputs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return [pg for fg in metadata.function_graphs for pg in fg.partition_graphs]


def check_gating(
    tuned: TunedStep, partitions: list[Any], inputs: list[Any] | None = None
) -> GatingReport:
    """Check the structure in `partitions` (see `executed_partitions`); with `inputs`, also
    profile one step of `tuned` and time each swap-in's send against its trigger."""
    graph = _Executed(partitions)
    host = tuned.host_device or ""
    gates = [graph.gate(name, trigger, host) for name, trigger in sorted(tuned.triggers.items())]
    if inputs is not None:
        from autotune.run.profile import trace_ops

        events = trace_ops(
            lambda: tuned(*inputs), graph.watched(gates), "time the swap-ins", host_tracer_level=3
        )
        gates = _timed(gates, graph, events)
    return GatingReport(tuple(gates), tuple(graph.leaks(host)))


class _Executed:
    """The executed partition graphs as one graph: nodes by name, sends and receives by key."""

    def __init__(self, partitions: list[Any]) -> None:
        self.nodes = {n.name: n for pg in partitions for n in pg.node}
        self.sends = {_key(n): n for n in self.nodes.values() if n.op == "_Send"}
        self.sent: dict[str, list[str]] = {}  # op -> the sends that carry its output
        for n in self.sends.values():
            if n.input:
                self.sent.setdefault(_op(n.input[0]), []).append(n.name)

    def gate(self, swap_in: str, trigger: str, host: str) -> Gate:
        node = self.nodes.get(swap_in)
        if node is None:
            return Gate(swap_in, trigger, "", False, "not executed (removed by the optimizer?)")
        device = node.device
        if not _same_device(device, host):
            return Gate(swap_in, trigger, device, False, "runs on the compute device")
        waits = self.waits_for(swap_in)
        if not waits:
            return Gate(swap_in, trigger, device, False, "waits for no op")
        if trigger in waits:
            return Gate(swap_in, trigger, device, True, "waits for its trigger", None, waits)
        if trigger in self.nodes:
            reason = f"waits for {', '.join(waits)}, not its trigger"
            return Gate(swap_in, trigger, device, False, reason, None, waits)
        # the optimizer merged or removed the trigger and moved its control edge
        reason = f"trigger rewritten by the optimizer; waits for {', '.join(waits)}"
        return Gate(swap_in, trigger, device, True, reason, None, waits)

    def waits_for(self, name: str) -> tuple[str, ...]:
        """The ops `name` waits for through its control inputs, looking through the helpers
        that partitioning adds to carry a control edge across devices, and through other swap
        ops (a pinned order chains them) to what they wait for."""
        todo = _controls(self.nodes[name])
        seen, found = set(todo), []
        while todo:
            node = self.nodes.get(todo.pop())
            if node is None:
                continue
            if _HELPER.search(node.name):
                ins = [_op(i) for i in node.input]
                if node.op == "_Recv" and _key(node) in self.sends:
                    ins.append(self.sends[_key(node)].name)
            elif is_swap_op(node.name):
                ins = _controls(node)
            else:
                found.append(node.name)
                continue
            todo.extend(i for i in ins if i not in seen)
            seen.update(ins)
        return tuple(sorted(found))

    def leaks(self, host: str) -> Iterable[str]:
        """Swapped tensors sent from the host to another device without a swap-in between
        (a swap-out's output itself, not a control edge's helper named after it)."""
        for n in self.sends.values():
            source = _op(n.input[0]) if n.input else ""
            swapped = is_swap_out(source) and not _HELPER.search(source)
            if swapped and _same_device(n.device, host):
                yield source

    def watched(self, gates: list[Gate]) -> set[str]:
        """Names whose profiled events time the gates: what each waits for, and its sends."""
        return {n for g in gates for n in (*g.waits, *self.sent.get(g.swap_in, ()))}


def _timed(gates: list[Gate], graph: _Executed, events: list[tuple[int, str, float]]) -> list[Gate]:
    """The gates with the lag from each trigger's end to its swap-in's first send."""
    ends: dict[str, float] = {}
    starts: dict[str, float] = {}
    for start_ps, name, seconds in events:
        ends[name] = max(ends.get(name, 0.0), start_ps * 1e-12 + seconds)
        starts.setdefault(name, start_ps * 1e-12)
    out = []
    for g in gates:
        sent = [starts[s] for s in graph.sent.get(g.swap_in, ()) if s in starts]
        done = [ends[w] for w in g.waits if w in ends]
        lag = min(sent) - max(done) if sent and done else None
        out.append(replace(g, lag_seconds=lag))
    return out


#: Names that graph partitioning gives the ops it adds (`x/_12`, `x/ctrl/_11`).
_HELPER = re.compile(r"/_\d+$")


def _controls(node: Any) -> list[str]:
    return [c[1:] for c in node.input if c.startswith("^")]


def _key(node: Any) -> bytes:
    """What pairs a `_Send` with its `_Recv`: the tensor's rendezvous name and both devices."""
    attr = node.attr
    return b"|".join(attr[k].s for k in ("tensor_name", "send_device", "recv_device"))


def _op(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _same_device(full: str, short: str) -> bool:
    """True when a full device name ('/job:localhost/.../device:CPU:1') is `short`."""
    return bool(short) and full.upper().endswith(short.upper().removeprefix("/"))
