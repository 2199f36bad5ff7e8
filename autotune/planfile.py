"""A plan saved to a file and applied elsewhere: tune once (on a CPU, for a device preset), then
train on the GPU machine with no search.

plan.json holds the plan (swaps, order edges, parameters) and what it was derived for: the
tool's and TensorFlow's versions, a fingerprint of the graph's structure and the batch size.
Loaded for the same graph at the same batch it is applied as it is; at another batch the same
parameters derive the plan there; for another graph it is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewriter.capture import Captured
from simulator import InvalidPlan, SwapPlan
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

    def for_step(self, captured: Captured, batch_size: int | None) -> SwapPlan:
        """The plan for `captured` at `batch_size`: as saved at the saved batch, derived from
        the saved parameters at another; InvalidPlan for another graph."""
        mine = captured.graph.fingerprint()
        if mine != self.fingerprint:
            raise InvalidPlan(
                f"the plan was saved for another graph (fingerprint {self.fingerprint}, this "
                f"step's is {mine}): tune this step, or capture the step the plan was tuned for "
                "(a Keras model built again in one process gets new layer names: build it in "
                "a fresh process or after keras.backend.clear_session())"
            )
        if batch_size == self.batch_size or not (self.plan.swaps or self.plan.recomputes):
            return self.plan
        from autotune.run.verify import plan_for

        return plan_for(captured, self.params)


def plan_document(plan: SwapPlan, captured: Captured, batch_size: int | None) -> dict[str, Any]:
    """The JSON form of a plan file: the plan and what it was derived for."""
    return {
        "format": FORMAT,
        "versions": _versions(),
        "graph_fingerprint": captured.graph.fingerprint(),
        "batch_size": batch_size,
        **plan.to_dict(),
    }


def save_plan(path: str | Path, plan: SwapPlan, captured: Captured, batch: int | None) -> Path:
    """Write the plan file for `plan`, derived on `captured` at `batch`; return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan_document(plan, captured, batch), indent=1) + "\n")
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
