"""A largest-batch search run in another process, beside the searches of the other methods.

Random search's largest batch depends on no other method's, and it is the longest of the
baselines (results/main_job.md, docs/method.md), so `largest_batches` hands it to a worker
process while it searches the others itself. The worker is a fresh interpreter
(`autotune.search.workers`: no TensorFlow, no forked threads, and not the user's script run
again) given the step's family without its engines; it reports its probes, for the progress
bar, and its result over a pipe. Its result is the one the search gives in this process: the
same engines, seeds and trials. `fit` does not wait for it once the others are searched: it
tunes ours at its batch meanwhile (`Beside`, from `largest_batches_beside`), and its probes
then leave the progress bar.
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.search.workers import Worker, child_streams
from simulator.errors import UserError
from simulator.memory import fewer_collections

if TYPE_CHECKING:
    from autotune.search.batching import BatchSearch, StepFamily

__all__ = ["Aside", "Beside"]

#: seconds between checks that the worker is still alive while waiting for its result
_POLL = 0.5
_COMMAND = "from autotune.search.aside import work; work()"  # run by `python -c`


class Aside:
    """One method's largest-batch search in a worker process."""

    def __init__(self) -> None:
        self.messages: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self.worker: Worker | None = None
        self._result: BatchSearch | None = None
        self._error: str | None = None

    @property
    def process(self) -> Any:
        assert self.worker is not None
        return self.worker.process

    @classmethod
    def start(cls, steps: StepFamily, method: str, **search: Any) -> Aside | None:
        """Start `largest_batch(steps, method, **search)` in a worker; None where this machine
        has one core (nothing would run beside it) or no interpreter can be started."""
        if (os.cpu_count() or 1) < 2:
            return None
        side = cls()
        payload = pickle.dumps((steps.detached(), method, search), pickle.HIGHEST_PROTOCOL)
        try:
            side.worker = Worker.start(_COMMAND, payload, side.messages.put, quiet=False)
        except OSError:
            return None
        return side

    def poll(self, on_probe: Callable[[str, int], None]) -> None:
        """Hand the worker's probes reported so far on."""
        while self._result is None and self._error is None:
            try:
                message = self.messages.get_nowait()
            except queue.Empty:
                return
            self._take(message, on_probe)

    def result(self, on_probe: Callable[[str, int], None]) -> BatchSearch:
        """Wait for the worker's search (handing its probes on) and return it."""
        while self._result is None and self._error is None:
            try:
                message = self.messages.get(timeout=_POLL)
            except queue.Empty:
                continue
            self._take(message, on_probe)
        self.stop()
        if self._error is not None:
            raise UserError(f"the search beside this one failed: {self._error}")
        assert self._result is not None
        return self._result

    def stop(self) -> None:
        """End the worker (once it has answered, or on an error or an interrupt here)."""
        if self.worker is not None:
            self.worker.close()

    def _take(self, message: tuple[Any, ...] | None, on_probe: Callable[[str, int], None]) -> None:
        if message is None:  # it ended without an answer
            self._error = f"exited with code {self.process.wait()}"
            return
        kind, *rest = message
        if kind == "probe":
            on_probe(rest[0], rest[1])
        elif kind == "done":
            self._result = rest[0]
        else:
            self._error = rest[0]


@dataclass
class Beside:
    """A method's largest-batch search in its worker (`side`; None where it is not run
    there) while `methods` are searched here, with the callbacks its probes are handed to
    while they are shown (`largest_batches_beside`)."""

    side: Aside | None
    methods: tuple[str, ...]
    told: Callable[[str, int], None]
    expect: Callable[[int], None]
    #: the probes its search may take (`max_probes`), and those handed on so far
    expected: int
    shown: int = 0
    quiet: bool = False

    def probed(self, method: str, batch: int) -> None:
        """A probe of a search here: the worker's reported so far are handed on first."""
        if self.side is not None:
            self.side.poll(self._told)
        self.told(method, batch)

    def hidden(self) -> None:
        """Show no more of its probes (the caller moves on while it runs): the probes
        expected of it and not shown are taken off."""
        if self.side is not None and not self.quiet:
            self.side.poll(self._told)
            self.expect(self.shown - self.expected)
        self.quiet = True

    def joined(self, here: dict[str, BatchSearch]) -> dict[str, BatchSearch]:
        """`here` with its search's result, in the order of `methods` (waits for it)."""
        out = dict(here)
        if self.side is not None:
            try:
                found = self.side.result(self._told)
            finally:
                self.side.stop()
            out[found.method] = found
            if not self.quiet:
                self.expect(found.probes - self.expected)
        return {m: out[m] for m in ("no swapping", *self.methods) if m in out}

    def stop(self) -> None:
        if self.side is not None:
            self.side.stop()

    def _told(self, method: str, batch: int) -> None:
        if not self.quiet:
            self.shown += 1
            self.told(method, batch)


def work() -> None:
    """The worker: run the search and write its probes and result."""
    from autotune.search.batching import largest_batch

    stream, out = child_streams()

    def put(*message: Any) -> None:
        pickle.dump(message, out)
        out.flush()

    try:
        steps, method, search = pickle.load(stream)
        gc.freeze()  # the modules and the step live as long as the worker (see the CLI's main)
        with fewer_collections():
            found = largest_batch(steps, method, on_probe=lambda m, b: put("probe", m, b), **search)
        if found.outcome is not None:  # the study stays here: only its figures are read
            found = replace(found, outcome=replace(found.outcome, study=None))
        put("done", found)
    except Exception as error:  # reported to the parent, which raises it there
        put("error", f"{type(error).__name__}: {error}")
