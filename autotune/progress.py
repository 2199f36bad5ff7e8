"""Progress bars on stderr for the long stages: tracing, the batch search and the trials."""

from __future__ import annotations

import sys
import weakref
from typing import Any

__all__ = ["Progress", "close_bars"]

#: the bars drawn and not closed yet, in any Progress
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def close_bars() -> None:
    """End every bar still drawn, so that what is printed next (an error, an interrupt) starts
    a line of its own instead of following the bar."""
    for bar in list(_OPEN):
        bar.close()


class Progress:
    """tqdm bars when `enabled`; every method is a no-op otherwise."""

    def __init__(self, enabled: bool = True, name: str = "preparing") -> None:
        self.enabled, self.name = enabled, name
        self._stage: Any = None
        self._running = False  # a stage has started and not ended

    def _bar(self, total: int | None, desc: str, unit: str) -> Any:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
        _OPEN.add(bar)
        return bar

    def _stages(self) -> Any:
        if self._stage is None:
            self._stage = self._bar(None, self.name, "stage")
        return self._stage

    def stage(self, text: str) -> None:
        """Start a stage (tracing, cost estimates): the one before it ends, the text as
        postfix."""
        if not self.enabled:
            return
        bar = self._stages()
        if self._running:
            bar.update(1)
        self._running = True
        bar.set_postfix_str(text)

    def expect(self, stages: int) -> None:
        """Expect `stages` more stages (fewer, if negative): the bar's total, for its ETA."""
        if not self.enabled:
            return
        bar = self._stages()
        bar.total = max(bar.n + 1, (bar.total or 0) + stages)
        bar.refresh()

    def probe(self, method: str, batch: int) -> None:
        """One batch size tried by the batch search."""
        self.stage(f"{method}: batch {batch}")

    def done(self) -> None:
        if self._stage is not None:
            if self._running:
                self._stage.update(1)
            self._stage.close()
            self._stage = None
            self._running = False

    def trials(self, total: int, already: int = 0) -> list[Any]:
        """Optuna callbacks that advance a trial bar (empty when disabled)."""
        if not self.enabled:
            return []
        self.done()
        bar = self._bar(total, "trials", "trial")
        bar.update(min(already, total))

        def callback(study: Any, trial: Any) -> None:
            bar.update(1)
            if bar.n >= total:
                bar.close()

        return [callback]
