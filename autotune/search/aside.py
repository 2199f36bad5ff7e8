"""A largest-batch search run in another process, beside the searches of the other methods.

Random search's largest batch depends on no other method's, and it is the longest of the
baselines (results/main_job.md, docs/method.md), so `largest_batches` hands it to a worker
process while it searches the others itself. The
worker is spawned (a fresh interpreter: no TensorFlow, no forked threads) and given the step's
family without its engines; it reports its probes, for the progress bar, and its result over
a queue. Its result is the one the search gives in this process: the same engines, seeds and
trials.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import queue
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from simulator.errors import UserError
from simulator.memory import fewer_collections

if TYPE_CHECKING:
    from autotune.search.batching import BatchSearch, StepFamily

__all__ = ["Aside"]

#: seconds between checks that the worker is still alive while waiting for its result
_POLL = 0.5


class Aside:
    """One method's largest-batch search in a spawned worker process."""

    def __init__(self, process: Any, messages: Any) -> None:
        self.process, self.messages = process, messages
        self._result: BatchSearch | None = None
        self._error: str | None = None

    @classmethod
    def start(cls, steps: StepFamily, method: str, **search: Any) -> Aside | None:
        """Start `largest_batch(steps, method, **search)` in a worker; None where this machine
        has one core (nothing would run beside it)."""
        if (os.cpu_count() or 1) < 2:
            return None
        payload = pickle.dumps((steps.detached(), method, search))
        context = multiprocessing.get_context("spawn")
        messages = context.Queue()
        process = context.Process(target=_work, args=(payload, messages), daemon=True)
        process.start()
        return cls(process, messages)

    def poll(self, on_probe: Callable[[str, int], None]) -> None:
        """Hand the worker's probes reported so far on."""
        while True:
            try:
                kind, *rest = self.messages.get_nowait()
            except queue.Empty:
                return
            self._take(kind, rest, on_probe)

    def result(self, on_probe: Callable[[str, int], None]) -> BatchSearch:
        """Wait for the worker's search (handing its probes on) and return it."""
        while self._result is None and self._error is None:
            try:
                kind, *rest = self.messages.get(timeout=_POLL)
            except queue.Empty:
                if not self.process.is_alive():  # what it put before it ended, else its end
                    self.poll(on_probe)
                    if self._result is None and self._error is None:
                        self._error = f"exited with code {self.process.exitcode}"
                continue
            self._take(kind, rest, on_probe)
        self.process.join()
        if self._error is not None:
            raise UserError(f"the search beside this one failed: {self._error}")
        assert self._result is not None
        return self._result

    def stop(self) -> None:
        """End the worker (on an error or an interrupt here)."""
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()

    def _take(self, kind: str, rest: list[Any], on_probe: Callable[[str, int], None]) -> None:
        if kind == "probe":
            on_probe(rest[0], rest[1])
        elif kind == "done":
            self._result = pickle.loads(rest[0])
        else:
            self._error = rest[0]


def _work(payload: bytes, messages: Any) -> None:
    """The worker: run the search and put its probes and result on `messages`."""
    from autotune.search.batching import largest_batch

    try:
        steps, method, search = pickle.loads(payload)
        gc.freeze()  # the modules and the step live as long as the worker (see the CLI's main)
        with fewer_collections():
            found = largest_batch(
                steps, method, on_probe=lambda m, b: messages.put(("probe", m, b)), **search
            )
        if found.outcome is not None:  # the study stays here: only its figures are read
            found = replace(found, outcome=replace(found.outcome, study=None))
        messages.put(("done", pickle.dumps(found)))
    except KeyboardInterrupt:
        pass
    except Exception as error:  # reported to the parent, which raises it there
        messages.put(("error", f"{type(error).__name__}: {error}"))
