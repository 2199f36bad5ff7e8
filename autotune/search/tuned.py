"""The step `fit` hands back: the tuned step at its batch (rewritten on first use) and at any
other batch (captured there, with the plan the tuned parameters give, or tuned there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rewriter.capture import Captured
from simulator import DevicePreset, SwapPlan
from simulator.errors import UserError
from simulator.params import PlanParams

__all__ = ["Retunes", "TrainingStep"]


class Retunes(Protocol):
    """Makes a tuned step at another batch (`autotune.search.tuning.Retuner`)."""

    def step_at(self, batch: int, params: PlanParams) -> Any: ...


@dataclass
class TrainingStep:
    """The tuned step, callable like the original at any batch size. `retuner` makes it at
    another batch (None: at `batch_size` only). `later` captures the step at its batch where
    `captured` is None: on first use (a largest-batch search tunes the step at its batch on
    a graph scaled from two other captures, so its own capture waits until it is run)."""

    captured: Captured | None
    plan: SwapPlan
    params: PlanParams
    device: DevicePreset
    batch_size: int | None
    retuner: Retunes | None = field(default=None, repr=False)
    later: Callable[[], Captured] | None = field(default=None, repr=False)
    _step: Any = field(default=None, repr=False)
    _at: dict[int, Any] = field(default_factory=dict, repr=False)

    def capture(self) -> Captured | None:
        """The step captured at its batch (captured now if it was left for later)."""
        if self.captured is None and self.later is not None:
            self.captured, self.later = self.later(), None
        return self.captured

    @property
    def rewritten(self) -> Any:
        """The tuned step at its batch (rewritten on first use), or the original when the plan
        changes nothing."""
        if self._step is None:
            captured = self.capture()
            if captured is None:
                raise UserError("this result holds no captured step to rewrite")
            from autotune.run.verify import training_step

            self._step = training_step(captured, self.plan, self.device)
        return self._step

    def __call__(self, *args: Any) -> Any:
        """Run a training step. Arguments are converted losslessly to the step's dtypes (int64
        labels to int32, float64 arrays to float32); at another batch size the plan is derived
        there from the same parameters, or tuned there if it no longer fits (`at_batch`)."""
        from rewriter.inputs import batch_of, conform

        captured = self.capture()
        if captured is None:
            return self.rewritten(*args)
        if captured.distributed is not None:  # distributed values: each replica's share
            args = tuple(captured.distributed.components(args))
        inputs = conform(args, captured.specs, any_batch=self.retuner is not None)
        batch = batch_of(inputs)
        if batch is None or batch == self.batch_size:
            return self.rewritten(*inputs)
        return self.at_batch(batch)(*inputs)

    def at_batch(self, batch: int) -> Any:
        """The tuned step at `batch` (cached): the step captured there, with the plan the same
        parameters give there if it fits the budget, else the plan tuned there."""
        if batch not in self._at:
            if self.retuner is None:
                raise UserError(
                    f"this result was tuned at batch {self.batch_size} and cannot capture the "
                    f"step at batch {batch}"
                )
            self._at[batch] = self.retuner.step_at(batch, self.params)
        return self._at[batch]

    @property
    def graph_def(self) -> Any:
        """The rewritten GraphDef (the original one when nothing is swapped)."""
        step = self.rewritten
        return step.graph_def if hasattr(step, "graph_def") else step.graph.as_graph_def()
