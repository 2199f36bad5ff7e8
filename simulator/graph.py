"""The framework-free graph IR: ops, tensors with exact bytes, data and control edges.

Producer/consumer links are kept consistent by one setter (`Graph.add_op`), and `Graph.lint()`
checks them after an import or a rewrite, in the manner of torch.fx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

__all__ = ["Graph", "GraphError", "Op", "Tensor", "TensorKind"]


class GraphError(ValueError):
    """The graph is malformed: a dangling edge, a duplicate name, a cycle."""


class TensorKind(str, Enum):
    """Where a tensor's memory comes from, which decides whether the step allocates it."""

    TRANSIENT = "transient"  # allocated by its producer during the step, freed after last use
    INPUT = "input"  # an argument of the step: held by the caller, resident before the step
    VARIABLE = "variable"  # a resource handle; `nbytes` is the variable's storage, resident
    CONSTANT = "constant"  # a constant kept by its kernel across steps, resident
    HANDLE = "handle"  # a resource or variant handle with no device storage of its own
    HOST = "host"  # held in host memory (a swapped-out copy): no device memory

    @property
    def on_device(self) -> bool:
        """True when the step allocates the tensor's bytes on the device."""
        return self in (TensorKind.TRANSIENT,)

    @property
    def resident(self) -> bool:
        """True when the tensor's bytes are held before the step starts."""
        return self in (TensorKind.INPUT, TensorKind.VARIABLE, TensorKind.CONSTANT)


@dataclass
class Tensor:
    """One value: its dtype, static shape and exact size in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    producer: str
    kind: TensorKind = TensorKind.TRANSIENT
    consumers: list[str] = field(default_factory=list)
    #: for a loop's list (`dtype` "variant", `shape` its elements and their shape): the
    #: elements' dtype, where all have one static shape; "" for any other tensor
    element_dtype: str = ""


@dataclass
class Op:
    """One operation.

    `forwards` maps an output index to the input index whose buffer it always shares (Identity,
    Reshape, ReadVariableOp, ...); `inplace` lists input indices whose buffer output 0 may take over
    when this op is that buffer's last user and the sizes match (element-wise kernels).
    `calls` names the functions a call op (If, While, PartitionedCall) runs (`repeats` times:
    a loop's trip count); `scratch` is the
    temporary memory its kernel holds while it runs (freed when it ends); `cpu_scratch`, when
    set, replaces it for the CPU kernel of the process that captured the graph (`on_cpu`).
    `assigns` says how the op writes the variable whose handle is its input 0: "adopt" (the
    variable takes over the buffer of input 1, the value, when the value dies there), "update"
    (in place), or "" (no variable write). While a read of the variable is still to be
    consumed, its old buffer stays until then, and a write that does not adopt goes to a new
    buffer.
    """

    name: str
    type: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    control_inputs: list[str] = field(default_factory=list)
    device: str = ""
    forwards: dict[int, int] = field(default_factory=dict)
    inplace: tuple[int, ...] = ()
    calls: tuple[str, ...] = ()
    scratch: int = 0
    cpu_scratch: int | None = None
    assigns: str = ""
    #: how many times the op runs its function (`calls`): a loop's trip count
    repeats: int = 1
    #: of `scratch`, what a loop holds for the iterations its executor runs ahead (none when
    #: it runs one iteration at a time)
    ahead: int = 0
    #: output -> input of a loop's carried values: each iteration's value replaces the one
    #: before, so the output may take over the input's buffer where it dies here
    carried: dict[int, int] = field(default_factory=dict)

    def takes_over(self, j: int) -> tuple[int, ...]:
        """The inputs whose buffer output `j` may take over where it dies here (same size):
        an element-wise kernel's output 0 (`inplace`), a loop's carried values."""
        own = self.inplace if j == 0 else ()
        return own + ((self.carried[j],) if j in self.carried else ())


class Graph:
    """Ops in insertion order plus the tensors they produce; the unit every stage works on."""

    def __init__(self, name: str = "step") -> None:
        self.name = name
        self.ops: dict[str, Op] = {}
        self.tensors: dict[str, Tensor] = {}
        self.outputs: list[str] = []
        self.control_consumers: dict[str, list[str]] = {}
        self.functions: list[str] = []
        #: per op, the order of its successors where a graph pass changed the order of its
        #: out-edges (the order in which the executor sees them); others follow their outputs
        self.edge_order: dict[str, list[str]] = {}
        self._rewritten: frozenset[str] = frozenset()
        self._rewritten_later: Callable[[], frozenset[str]] | None = None

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, ops={len(self.ops)}, tensors={len(self.tensors)})"

    @property
    def rewritten(self) -> frozenset[str]:
        """The ops Grappler rewrote when it optimized the captured step (regrouped sums and
        products, fused kernels: `rewriter.optimized.rewritten_ops`). It skips a node driven
        by or driving a control dependency, so a plan's trigger, waiter or order edge on one
        of them would make the step compute, and round, otherwise."""
        if self._rewritten_later is not None:
            self._rewritten, self._rewritten_later = self._rewritten_later(), None
        return self._rewritten

    @rewritten.setter
    def rewritten(self, ops: frozenset[str]) -> None:
        self._rewritten, self._rewritten_later = ops, None

    def rewritten_later(self, find: Callable[[], frozenset[str]]) -> None:
        """Have `find` give `rewritten` when it is first read: Grappler's pass takes seconds,
        and a capture that only sizes a family of graphs (`simulator.scaling`) never reads it."""
        self._rewritten_later = find

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_rewritten=self.rewritten, _rewritten_later=None)
        return state

    def add_op(self, op: Op, tensors: list[Tensor]) -> Op:
        """Insert `op` with its output tensors; its inputs must already exist (topological)."""
        if op.name in self.ops:
            raise GraphError(f"duplicate op name {op.name!r}")
        for name in op.inputs:
            if name not in self.tensors:
                raise GraphError(f"op {op.name!r} reads unknown tensor {name!r}")
        for name in op.control_inputs:
            if name not in self.ops:
                raise GraphError(f"op {op.name!r} has a control input from unknown op {name!r}")
        if [t.name for t in tensors] != op.outputs:
            raise GraphError(f"op {op.name!r}: tensors given do not match its outputs")
        self.ops[op.name] = op
        for t in tensors:
            if t.name in self.tensors:
                raise GraphError(f"duplicate tensor name {t.name!r}")
            t.producer = op.name
            self.tensors[t.name] = t
        for name in op.inputs:
            self.tensors[name].consumers.append(op.name)
        for name in op.control_inputs:
            self.control_consumers.setdefault(name, []).append(op.name)
        return op

    def mark_outputs(self, names: list[str]) -> None:
        """Declare the tensors the step returns: they stay alive to its end."""
        for name in names:
            if name not in self.tensors:
                raise GraphError(f"unknown output tensor {name!r}")
        self.outputs = list(names)

    @property
    def persistent_bytes(self) -> int:
        """Bytes resident before the step: inputs, variables (weights, slots) and constants."""
        return sum(t.nbytes for t in self.tensors.values() if t.kind.resident)

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes per tensor kind, for reports."""
        out: dict[str, int] = {k.value: 0 for k in TensorKind}
        for t in self.tensors.values():
            out[t.kind.value] += t.nbytes
        return out

    def fingerprint(self) -> str:
        """A digest of the graph's structure (op names, types and edges), not of its sizes:
        the same at every batch size, different for another model or step."""
        import hashlib

        digest = hashlib.sha256()
        for name in sorted(self.ops):
            op = self.ops[name]
            parts = (name, op.type, *op.inputs, "^", *sorted(op.control_inputs))
            digest.update("\x1f".join(parts).encode() + b"\x1e")
        return digest.hexdigest()[:16]

    def predecessors(self, op_name: str) -> list[str]:
        """Distinct ops that must run before `op_name` (data and control edges)."""
        op = self.ops[op_name]
        preds = [self.tensors[t].producer for t in op.inputs] + op.control_inputs
        return list(dict.fromkeys(preds))

    def successors(self, op_name: str) -> list[str]:
        """Distinct ops that must run after `op_name` (data and control edges)."""
        if op_name in self.edge_order:
            return list(self.edge_order[op_name])
        op = self.ops[op_name]
        succ = [c for t in op.outputs for c in self.tensors[t].consumers]
        succ += self.control_consumers.get(op_name, [])
        return list(dict.fromkeys(succ))

    def buffer_root(self, name: str) -> str:
        """The tensor whose buffer tensor `name` shares (following forwarding ops), or `name`
        itself."""
        while True:
            op = self.ops[self.tensors[name].producer]
            j = op.outputs.index(name)
            if j not in op.forwards:
                return name
            name = op.inputs[op.forwards[j]]

    def with_control_edges(self, edges: tuple[tuple[str, str], ...]) -> Graph:
        """A copy in which, for each `(before, after)`, op `after` also waits for op `before`.

        Tensors are shared with this graph (control edges do not change them); ops that gain
        an edge are copied. The copy is checked for cycles when it is ordered.
        """
        out = self._copy()
        for before, after in edges:
            for name in (before, after):
                if name not in self.ops:
                    raise GraphError(f"control edge names op {name!r}, which is not in the graph")
            op = out.ops[after]
            out.ops[after] = replace(op, control_inputs=[*op.control_inputs, before])
            out.control_consumers.setdefault(before, []).append(after)
            if before in out.edge_order:  # an order a graph pass set lists it last
                out.edge_order[before] = list(dict.fromkeys([*out.edge_order[before], after]))
        return out

    @property
    def parallel_loops(self) -> tuple[str, ...]:  # loops holding bytes for iterations ahead
        return tuple(n for n, op in self.ops.items() if op.ahead)

    def with_serial_loops(self, loops: tuple[str, ...]) -> Graph:
        """A copy in which the loops named run one iteration at a time: they hold none of
        their scratch for iterations running ahead (`Op.ahead`)."""
        out = self._copy()
        for name in loops:
            op = self.ops.get(name)
            if op is None or not op.calls:
                raise GraphError(f"op {name!r} is not a loop of this graph")
            out.ops[name] = replace(op, scratch=op.scratch - op.ahead, ahead=0)
        return out

    def merged(self, into: str, other: str) -> Graph:
        """A copy in which op `other` is folded into op `into` (as a graph pass merges two
        kernels into one): `other`'s outputs become `into`'s last outputs and its control
        inputs `into`'s; its readers keep reading them. `other` must read only tensors
        `into` reads, and no op may wait on `other` by a control edge alone."""
        a, b = self.ops[into], self.ops[other]
        if not set(b.inputs) <= set(a.inputs):
            raise GraphError(f"op {other!r} reads tensors op {into!r} does not: cannot merge them")
        if self.control_consumers.get(other):
            raise GraphError(f"ops wait on op {other!r} by control edges: cannot merge it")
        out = self._copy()
        out.tensors = dict(self.tensors)
        for name in b.outputs:
            out.tensors[name] = replace(self.tensors[name], producer=into)
        for name in set(b.inputs):
            t = self.tensors[name]
            out.tensors[name] = replace(t, consumers=[c for c in t.consumers if c != other])
        extra = [c for c in b.control_inputs if c not in a.control_inputs]
        for c in extra:
            out.control_consumers[c] = [into if x == other else x for x in out.control_consumers[c]]
        for c in set(b.control_inputs) - set(extra):
            out.control_consumers[c] = [x for x in out.control_consumers[c] if x != other]
        out.ops[into] = replace(
            a, outputs=[*a.outputs, *b.outputs], control_inputs=[*a.control_inputs, *extra]
        )
        del out.ops[other]
        out.edge_order = {
            k: list(dict.fromkeys(into if x == other else x for x in v))
            for k, v in self.edge_order.items()
            if k != other
        }
        return out

    def with_workspace(self, producer: str, consumer: str, nbytes: int) -> Graph:
        """A copy in which op `producer` also makes a `nbytes` tensor that op `consumer` reads
        (a kernel's workspace handed from a forward op to its gradient), named
        `"{producer}:workspace"`."""
        name = f"{producer}:workspace"
        if name in self.tensors:
            raise GraphError(f"op {producer!r} already has a workspace")
        a, b = self.ops[producer], self.ops[consumer]
        out = self._copy()
        out.tensors = dict(self.tensors)
        out.tensors[name] = Tensor(name, "uint8", (nbytes,), nbytes, producer, consumers=[consumer])
        out.ops[producer] = replace(a, outputs=[*a.outputs, name])
        out.ops[consumer] = replace(b, inputs=[*b.inputs, name])
        return out

    def with_scratch(self, op_name: str, nbytes: int) -> Graph:
        """A copy in which op `op_name`'s kernel holds `nbytes` of temporary memory."""
        out = self._copy()
        out.ops[op_name] = replace(self.ops[op_name], scratch=nbytes, cpu_scratch=None)
        return out

    def with_edge_order(self, orders: dict[str, list[str]]) -> Graph:
        """A copy in which each op of `orders` sees its successors in that order (a graph
        pass re-added its out-edges); each order must list exactly the op's successors."""
        for name, order in orders.items():
            if sorted(order) != sorted(self.successors(name)):
                raise GraphError(f"edge order of op {name!r} does not list its successors")
        out = self._copy()
        out.edge_order.update({k: list(v) for k, v in orders.items()})
        return out

    def on_cpu(self) -> Graph:
        """This graph as run by the CPU kernels of the process that captured it: an op whose
        CPU kernel holds other temporary memory (`Op.cpu_scratch`) takes that as its scratch.
        Returns this graph itself when no op differs."""
        changed = {
            name: replace(op, scratch=op.cpu_scratch)
            for name, op in self.ops.items()
            if op.cpu_scratch is not None and op.cpu_scratch != op.scratch
        }
        if not changed:
            return self
        out = self._copy()
        out.ops.update(changed)
        return out

    def subgraph(self, keep: set[str]) -> Graph:
        """The ops in `keep` (one replica's share of a step run on several devices), in this
        graph's order. A tensor they read from an op left out arrives as by a receive: its
        producer stays, as a `_Recv` source with no inputs; control edges from ops left out
        are dropped, as are outputs those ops make."""
        received = {self.tensors[t].producer for n in keep for t in self.ops[n].inputs} - keep
        out = Graph(self.name)
        for name, op in self.ops.items():
            if name in keep:
                kept = [c for c in op.control_inputs if c in keep]
                out.add_op(replace(op, control_inputs=kept), self._unread(op.outputs))
            elif name in received:
                source = Op(name, "_Recv", outputs=list(op.outputs), device=op.device)
                out.add_op(source, self._unread(op.outputs))
        out.mark_outputs([t for t in self.outputs if self.tensors[t].producer in keep])
        out.functions = list(self.functions)
        out.rewritten = self.rewritten & keep
        out.edge_order = {
            k: [x for x in v if x in keep] for k, v in self.edge_order.items() if k in keep
        }
        return out

    def _unread(self, names: list[str]) -> list[Tensor]:
        """Copies of tensors `names` with no consumers yet (for a graph being built)."""
        return [replace(self.tensors[n], consumers=[]) for n in names]

    def _copy(self) -> Graph:
        """A copy with its own op table and control edges; tensors are shared."""
        out = Graph(self.name)
        out.ops = dict(self.ops)
        out.tensors = self.tensors
        out.outputs = list(self.outputs)
        out.functions = list(self.functions)
        out.control_consumers = {k: list(v) for k, v in self.control_consumers.items()}
        out.edge_order = {k: list(v) for k, v in self.edge_order.items()}
        out.rewritten = self.rewritten
        return out

    def lint(self) -> None:
        """Check that every link is consistent in both directions; raise GraphError if not."""
        for op in self.ops.values():
            for i, name in enumerate(op.outputs):
                t = self.tensors.get(name)
                if t is None or t.producer != op.name:
                    raise GraphError(f"op {op.name!r} output {i} ({name!r}) is not linked back")
            for out_i, in_i in op.forwards.items():
                if not (0 <= out_i < len(op.outputs) and 0 <= in_i < len(op.inputs)):
                    raise GraphError(f"op {op.name!r} forwards {out_i}->{in_i} out of range")
            if op.assigns not in ("", "adopt", "update"):
                raise GraphError(f"op {op.name!r} assigns {op.assigns!r}: not adopt or update")
            if op.assigns and len(op.inputs) < (2 if op.assigns == "adopt" else 1):
                raise GraphError(f"op {op.name!r} {op.assigns}s a variable without its inputs")
            for name in op.inputs:
                if op.name not in self.tensors[name].consumers:
                    raise GraphError(f"tensor {name!r} does not list consumer {op.name!r}")
        for t in self.tensors.values():
            if t.nbytes < 0:
                raise GraphError(f"tensor {t.name!r} has negative size {t.nbytes}")
            for c in t.consumers:
                if t.name not in self.ops[c].inputs:
                    raise GraphError(f"tensor {t.name!r} lists {c!r}, which does not read it")
