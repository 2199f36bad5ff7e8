"""Steps run under a `tf.distribute` strategy (several GPUs of one machine).

The step that calls `strategy.run` is captured whole, with each replica's share of the batch as
its own argument, and every op is given to the replica whose device runs it. Each replica's
share (`Graph.subgraph`) is what one device holds: it is simulated and tuned as one device, and
the rewrite applies each replica's plan to its own ops, so the cross-replica reduction of the
gradients is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.errors import UserError
from simulator.graph import Graph

__all__ = ["Distributed", "replica_graphs"]


@dataclass(frozen=True)
class Distributed:
    """A step that runs `strategy.run` itself, called with distributed values (`PerReplica`,
    as a distributed dataset yields them; None leaves allowed) in the nesting of `template`."""

    strategy: Any
    template: Any

    @classmethod
    def of(cls, strategy: Any, args: tuple[Any, ...]) -> Distributed:
        """The calling convention of example `args` (their nesting; no tensor is kept)."""
        import tensorflow as tf

        return cls(strategy, tf.nest.map_structure(lambda x: None if x is None else 0, args))

    @property
    def devices(self) -> tuple[str, ...]:
        """The replicas' devices, in replica order."""
        return tuple(_canonical(d) for d in self.strategy.extended.worker_devices)

    def components(self, args: tuple[Any, ...]) -> list[Any]:
        """Each replica's tensors of `args`, replica by replica (replica 0's first)."""
        leaves = [leaf for leaf in _leaves(args) if leaf is not None]
        n = len(self.devices)
        parts = [self.strategy.experimental_local_results(leaf) for leaf in leaves]
        if any(len(p) != n for p in parts):
            raise UserError(f"the step's arguments must be distributed over its {n} replicas")
        return [part[r] for r in range(n) for part in parts]

    def flat(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`step` as a function of `components(args)`: it rebuilds the distributed values."""
        import tensorflow as tf

        inline = getattr(step, "python_function", step)  # a tf.function's ops, not a call
        empty = [leaf is None for leaf in _leaves(self.template)]
        per = len(empty) - sum(empty)

        def run(*tensors: Any) -> Any:
            shares = [tensors[r * per : (r + 1) * per] for r in range(len(self.devices))]
            it = iter([self._distributed(shares, j) for j in range(per)])
            leaves = [None if e else next(it) for e in empty]
            return inline(*tf.nest.pack_sequence_as(self.template, leaves))

        return tf.function(run)

    def _distributed(self, shares: list[tuple[Any, ...]], j: int) -> Any:
        """Leaf `j` of every local replica's share, as one distributed value (replica ids
        count the replicas of every worker, worker by worker, each worker as many)."""
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: shares[ctx.replica_id_in_sync_group % len(shares)][j]
        )


def _leaves(args: Any) -> list[Any]:
    import tensorflow as tf

    return list(tf.nest.flatten(args))


def replica_graphs(cf: Any, graph: Graph, devices: tuple[str, ...]) -> tuple[Graph, ...]:
    """Each replica's share of `graph` (the captured step `cf`): the ops its device runs."""
    placed = _placed(cf, graph, devices)
    return tuple(
        graph.subgraph({n for n, d in placed.items() if d == device}) for device in devices
    )


def _placed(cf: Any, graph: Graph, devices: tuple[str, ...]) -> dict[str, str]:
    """The device of every op: its own, or for an op the step leaves to TensorFlow's placer,
    the device of the variable it reads (a captured handle lives on its variable's device),
    of its inputs, or of its readers (a replica's share of the batch); else replica 0's."""
    placed = {n: _canonical(op.device) for n, op in graph.ops.items() if op.device}
    fg = cf.graph
    handles = {ph.op.name: h.device for ph, h in zip(fg.internal_captures, fg.external_captures)}
    placed |= {n: _canonical(d) for n, d in handles.items() if n in graph.ops and d}
    for name, op in graph.ops.items():
        if name not in placed:
            inputs = [placed.get(graph.tensors[t].producer) for t in op.inputs]
            if found := next((d for d in inputs if d), None):
                placed[name] = found
    for name in reversed(list(graph.ops)):
        if name not in placed:
            readers = {placed.get(c, "") for c in graph.successors(name)}
            placed[name] = readers.pop() if len(readers) == 1 else ""
    return {n: d or devices[0] for n, d in placed.items()}


def _canonical(device: str) -> str:
    """One spelling of a device: '/job:localhost/replica:0/task:0/device:GPU:1'."""
    import tensorflow as tf

    return str(tf.DeviceSpec.from_string(device).to_string())
