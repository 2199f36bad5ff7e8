"""A step at any size: `StepFamily` (an affine family of graphs from two captures) and
`CapturedSteps` (a capture at every size asked for), the engines the size search runs on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rewriter.capture import Captured
from simulator import DevicePreset
from simulator.engine import Engine
from simulator.scaling import BatchFamily, ScalingError, affine_costs

__all__ = ["CAPTURE_BATCHES", "CapturedSteps", "StepFamily", "Steps"]

#: Capture batches: any two from 2 fix the memory exactly; costs are extrapolated along a line,
#: which from 16 and 32 predicted Grappler's ResNet-50 step at 128 within 0.1 %.
CAPTURE_BATCHES = (16, 32)


@dataclass
class StepFamily:
    """Engines for one step at any batch size >= 2 on one device preset."""

    family: BatchFamily
    costs: tuple[dict[str, float], dict[str, float]] | None
    device: DevicePreset | None
    trace_seconds: float
    _engines: dict[int, Engine] = field(default_factory=dict)
    _shared: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def capture(
        cls,
        capture_at: Callable[[int], Captured],
        device: DevicePreset | None,
        batches: tuple[int, int] = CAPTURE_BATCHES,
        on_stage: Callable[[str], None] | None = None,
    ) -> StepFamily:
        """Capture at `batches` (calling `on_stage` before each stage, for a progress bar)."""
        caps, costs, seconds = [], [], 0.0
        for b in batches:
            if on_stage:
                on_stage(f"tracing at batch {b}")
            cap = capture_at(b)
            caps.append(cap)
            seconds += cap.trace_seconds
            if device is not None:
                if on_stage:
                    on_stage(f"estimating op costs at batch {b}")
                costs.append(_costs(cap, device))
        family = BatchFamily.fit(caps[0].graph, batches[0], caps[1].graph, batches[1])
        pair = (costs[0], costs[1]) if costs else None
        return cls(family, pair, device, seconds)

    @classmethod
    def or_captures(
        cls,
        capture_at: Callable[[int], Captured],
        device: DevicePreset | None,
        batches: tuple[int, int] = CAPTURE_BATCHES,
        on_stage: Callable[[str], None] | None = None,
    ) -> Steps:
        """`capture`, or, where the two captures are not one affine family (a loop's
        iterations running ahead, ops named otherwise at another batch), a capture at every
        batch asked for (`CapturedSteps`)."""
        made: dict[int, Captured] = {}

        def kept(b: int) -> Captured:
            made[b] = made.get(b) or capture_at(b)
            return made[b]

        try:
            return cls.capture(kept, device, batches, on_stage)
        except ScalingError:
            seconds = sum(c.trace_seconds for c in made.values())
            return CapturedSteps(capture_at, device, seconds, made)

    def engine(self, batch: int) -> Engine:
        """The engine at `batch` (cached)."""
        if batch not in self._engines:
            cost = None
            if self.costs is not None:
                a, b = self.family.a, self.family.b
                cost = affine_costs(self.costs[0], a, self.costs[1], b, batch)
            graph = self.family.at(batch)
            self._engines[batch] = Engine.build(
                graph,
                device=self.device,
                cost=cost,
                shared=self._shared,
                lower_bound=self.lower_bound(batch),
                resized=next(iter(self._engines.values()), None),
            )
        return self._engines[batch]

    def lower_bound(self, batch: int) -> int:
        return self.family.lower_bound(batch)

    def detached(self) -> StepFamily:
        """This family without the engines it built, to send to another process (the order
        edges found so far go with it)."""
        return replace(self, _engines={}, _shared=dict(self._shared))


class Steps(Protocol):
    """What the size search needs: an engine and a lower bound at any size n >= 2."""

    def engine(self, n: int) -> Engine: ...

    def lower_bound(self, n: int) -> int: ...

    @property
    def trace_seconds(self) -> float: ...


@dataclass
class CapturedSteps:
    """Engines from a capture at every size asked for (for sizes that are not affine, such as
    a 3D U-Net's cube edge); each capture is kept. Order edges are shared between captures
    of near sizes that have their ops (`simulator.engine.EDGE_REUSE`)."""

    capture_at: Callable[[int], Captured]
    device: DevicePreset | None
    trace_seconds: float = 0.0
    _captures: dict[int, Captured] = field(default_factory=dict)
    _engines: dict[int, Engine] = field(default_factory=dict)
    _shared: dict[str, Any] = field(default_factory=dict)

    def captured(self, n: int) -> Captured:
        """The step captured at size `n` (once)."""
        if n not in self._captures:
            cap = self._captures[n] = self.capture_at(n)
            self.trace_seconds += cap.trace_seconds
        return self._captures[n]

    def engine(self, n: int) -> Engine:
        if n not in self._engines:
            from autotune.api import build_engine

            self._engines[n] = build_engine(self.captured(n), self.device, shared=self._shared)
        return self._engines[n]

    def lower_bound(self, n: int) -> int:
        return self.engine(n).lower_bound


def _costs(captured: Captured, device: DevicePreset) -> dict[str, float]:
    from rewriter.costs import step_costs

    return step_costs(captured, device)
