"""The report's batch curve, its sizes shared with a worker process.

Each size of the curve (`plots.curve_point`) is an engine built and two evaluations: on
ResNet-50 at 1147 about 0.2 s a size, and 0.5-0.8 s past the tuned maximum (the plan no longer
fits, and its recompute guard runs all its rounds), about 4 s of the main job's report on one
core. Where the step is a `StepFamily` (it pickles, `autotune.search.families`) and the
machine has another core, `CurveBeside` starts a worker (`autotune.search.workers`: a fresh
interpreter fed over a pipe) with the family, the engine at the tuned size (its order edges
with it) and the parameters, before the other plots are drawn. The worker takes sizes from the
smallest up, one at a time; this process takes them from the largest down once it has drawn
the others. Each size gives the figures it gives here (a test compares the curves); a worker
that dies leaves its sizes to this process.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from autotune.report.plots import BatchCurve, CurvePoint, batch_grid, curve_of, curve_point
from autotune.search.workers import Worker, child_streams, messages

__all__ = ["CurveBeside"]

_COMMAND = "from autotune.report.beside import work; work()"  # run by `python -c`
_READY = "ready"
#: seconds between checks of the worker while this process waits for its last size
_POLL = 0.5


class CurveBeside:
    """The batch curve's sizes, shared between this process and one worker."""

    def __init__(self, args: tuple[Any, Any, int], maxima: tuple[int, int]) -> None:
        self.engine_at, self.params, self.budget_bytes = args
        self.maxima = maxima
        self.left = deque(batch_grid(*maxima))  # sizes no one has taken, smallest first
        self.rows: dict[int, CurvePoint] = {}
        self.given: int | None = None  # the size the worker has
        self.by_worker: list[int] = []  # every size the worker computed, in turn
        self.told = 0  # how many of them `on_point` was told
        self.worker: Worker | None = None
        self._changed = threading.Condition()

    @classmethod
    def start(
        cls, steps: Any, params: Any, budget_bytes: int, max_no_swap: int, max_tuned: int
    ) -> CurveBeside | None:
        """The curve's sizes with a worker started for them; None where `steps` is not a
        `StepFamily`, this machine has one core or no worker starts (`plots.batch_curve`
        then computes them all here)."""
        from autotune.search.families import StepFamily

        if (os.cpu_count() or 1) < 2 or not isinstance(steps, StepFamily):
            return None
        beside = cls((steps.engine, params, budget_bytes), (max_no_swap, max_tuned))
        tuned = steps.engine(max(max_tuned, 2))
        tuned.serialized()  # its order edges go with it
        try:
            payload = pickle.dumps(
                (steps.detached(), tuned, params, budget_bytes), pickle.HIGHEST_PROTOCOL
            )
            beside.worker = Worker.start(_COMMAND, payload, beside._answer, quiet=True)
        except (OSError, pickle.PicklingError, TypeError, AttributeError):
            return None
        return beside

    def curve(self, on_point: Callable[[int], None] | None = None) -> BatchCurve:
        """Every size's point (this process's share from the largest down, then the worker's
        last one, or what it left); `on_point(b)` is told each size, in this thread."""
        tell = on_point or (lambda b: None)
        try:
            while (b := self._take()) is not None:
                self._tell(tell)
                tell(b)
                self._here(b)
            self._wait(tell)
        finally:
            self.stop()
        self._tell(tell)
        return curve_of(self.rows, self.budget_bytes, *self.maxima)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.close()

    def _take(self) -> int | None:
        with self._changed:
            return self.left.pop() if self.left else None

    def _here(self, b: int) -> None:
        """Size `b`'s point, computed in this process."""
        tuned_at = self.engine_at(max(self.maxima[1], 2))
        row = curve_point(self.engine_at, tuned_at, self.params, self.budget_bytes, b)
        with self._changed:
            self.rows[b] = row

    def _wait(self, tell: Callable[[int], None]) -> None:
        """Wait for the worker's size in hand; if it died, compute what it had here."""
        while True:
            with self._changed:
                if self.given is None:
                    return
                if self.worker is not None:  # alive
                    self._changed.wait(_POLL)
                    continue
                b, self.given = self.given, None
            tell(b)
            self._here(b)

    def _tell(self, tell: Callable[[int], None]) -> None:
        """Tell `tell` the sizes the worker computed since it was last told."""
        with self._changed:
            done, self.told = self.by_worker[self.told :], len(self.by_worker)
        for b in done:
            tell(b)

    def _answer(self, message: Any) -> None:
        """The worker's reader thread: READY, a size's point, or its end (None)."""
        with self._changed:
            if message is None:  # it ended: what it had is done here
                self.worker = None
            elif message != _READY:
                b, row = message
                self.rows[b], self.given = row, None
                self.by_worker.append(b)
            if self.worker is not None and self.given is None and self.left:
                self.given = self.left.popleft()
                self.worker.send(self.given)
            self._changed.notify_all()


def work() -> None:
    """The worker: load the family, the tuned engine and the parameters, then compute each
    size it is sent."""
    import gc

    from simulator.memory import fewer_collections

    stream, out = child_streams()
    family, tuned_at, params, budget_bytes = pickle.load(stream)
    pickle.dump(_READY, out)
    out.flush()
    gc.freeze()
    with fewer_collections():
        for b in messages(stream):
            pickle.dump((b, curve_point(family.engine, tuned_at, params, budget_bytes, b)), out)
            out.flush()
