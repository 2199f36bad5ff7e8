"""A plan saved to a file and applied elsewhere: tune once (on a CPU, for a device preset), then
train on the GPU machine with no search.

plan.json holds the plan (swaps, order edges, parameters) and what it was derived for: the
tool's and TensorFlow's versions, a fingerprint of the graph's structure and the batch size.
Loaded for the same graph at the same batch it is applied as it is; at another batch the same
parameters derive the plan there; for another graph it is refused.

Keras names layers by what the process built before (`conv2d`, or `conv2d_3` after three other
convolutions), so the same model built in a notebook and in a training script gets other op
names. The file also holds a fingerprint of the graph without names (op types and edges, ops
in the order the capture lists them) and the position of each op and tensor the plan names:
a graph that matches it gets the plan with its own names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewriter.capture import Captured
from simulator import Graph, InvalidPlan, SwapPlan
from simulator.derive import PlanParams

__all__ = ["FORMAT", "SavedPlan", "load_plan", "plan_document", "save_plan"]

FORMAT = 1


@dataclass(frozen=True)
class SavedPlan:
    """A plan read from a file, with what it was derived for."""

    plan: SwapPlan
    params: PlanParams
    fingerprint: str
    batch_size: int | None
    versions: dict[str, str]
    #: the fingerprint without names, and the positions of the names the plan uses
    structure: str = ""
    positions: dict[str, str] = field(default_factory=dict)

    def for_step(self, captured: Captured, batch_size: int | None) -> SwapPlan:
        """The plan for `captured` at `batch_size`: as saved at the saved batch, derived from
        the saved parameters at another; InvalidPlan for another graph. A graph that differs
        only in its op names gets the plan in its own names."""
        graph = captured.graph
        plan = self.plan if graph.fingerprint() == self.fingerprint else self._renamed(graph)
        if batch_size == self.batch_size or not (plan.swaps or plan.recomputes):
            return plan
        from autotune.run.verify import plan_for

        return plan_for(captured, self.params)

    def _renamed(self, graph: Graph) -> SwapPlan:
        positions = graph_positions(graph)
        if not self.structure or structure_digest(graph, positions) != self.structure:
            raise InvalidPlan(
                f"the plan was saved for another graph (fingerprint {self.fingerprint}, this "
                f"step's is {graph.fingerprint()}): tune this step, or capture the step the "
                "plan was tuned for"
            )
        names = {pos: name for name, pos in positions.items()}
        mapping = {old: names[pos] for old, pos in self.positions.items()}
        return SwapPlan.from_dict(_rename(self.plan.to_dict(), mapping))


def plan_document(plan: SwapPlan, graph: Graph, batch_size: int | None) -> dict[str, Any]:
    """The JSON form of a plan file: the plan and the graph it was derived for."""
    body = plan.to_dict()
    positions = graph_positions(graph)
    return {
        "format": FORMAT,
        "versions": _versions(),
        "graph_fingerprint": graph.fingerprint(),
        "structure_fingerprint": structure_digest(graph, positions),
        "batch_size": batch_size,
        **body,
        "positions": {n: positions[n] for n in _strings(body) if n in positions},
    }


def structure_digest(graph: Graph, positions: dict[str, str]) -> str:
    """A digest of the graph's op types and edges without its names: ops in the graph's order,
    each input as the position (`graph_positions`) of its producer and output."""
    import hashlib

    digest = hashlib.sha256()
    for op in graph.ops.values():
        inputs = [positions[t] for t in op.inputs]
        controls = sorted(positions[c] for c in op.control_inputs)
        digest.update("\x1f".join((op.type, *inputs, "^", *controls)).encode() + b"\x1e")
    return digest.hexdigest()[:16]


def graph_positions(graph: Graph) -> dict[str, str]:
    """Each op's index in the graph's order ("7") and each tensor's ("7:0")."""
    out: dict[str, str] = {}
    for k, op in enumerate(graph.ops.values()):
        out[op.name] = str(k)
        out.update({t: f"{k}:{j}" for j, t in enumerate(op.outputs)})
    return out


def _strings(data: Any) -> set[str]:
    """Every string in a JSON-like value."""
    if isinstance(data, str):
        return {data}
    if isinstance(data, dict):
        return set().union(*(_strings(v) for v in data.values())) if data else set()
    if isinstance(data, list | tuple):
        return set().union(*(_strings(v) for v in data)) if data else set()
    return set()


def _rename(data: Any, mapping: dict[str, str]) -> Any:
    """`data` with every string that `mapping` names replaced."""
    if isinstance(data, str):
        return mapping.get(data, data)
    if isinstance(data, dict):
        return {k: _rename(v, mapping) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_rename(v, mapping) for v in data]
    return data


def save_plan(path: str | Path, plan: SwapPlan, graph: Graph, batch: int | None) -> Path:
    """Write the plan file for `plan`, derived on the step's `graph` at `batch`; return its
    path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan_document(plan, graph, batch), indent=1) + "\n")
    return path


def load_plan(path: str | Path) -> SavedPlan:
    """Read a plan file; a missing, unreadable or foreign file is one InvalidPlan line."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise InvalidPlan(f"cannot read plan file {str(path)!r}: {err}") from None
    if not isinstance(data, dict) or "graph_fingerprint" not in data or "swaps" not in data:
        raise InvalidPlan(f"{str(path)!r} is not a plan file written by autotune")
    plan = SwapPlan.from_dict(data)
    return SavedPlan(
        plan,
        PlanParams.from_dict(dict(plan.params)) if plan.params else PlanParams(n_tensors=0),
        str(data["graph_fingerprint"]),
        data.get("batch_size"),
        dict(data.get("versions", {})),
        str(data.get("structure_fingerprint", "")),
        {str(k): str(v) for k, v in data.get("positions", {}).items()},
    )


def _versions() -> dict[str, str]:
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    import tensorflow as tf

    return {"tf-swap-autotune": version("tf-swap-autotune"), "tensorflow": tf.__version__}
