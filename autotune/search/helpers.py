"""A study's queued trials evaluated ahead of it in helper processes.

Most trials of our study are queued, not sampled: the warm starts, then the refinement's moves
around the best plan, four at a time (`autotune.search.trials.Refine`); in the main job's final
study 48 of 50. Their parameters are known before their turn, and an evaluation depends on
nothing but the parameters and the engine. So while this process runs a trial, helper
processes (each with a copy of the engine) evaluate the queued trials after it, and when a
trial's turn comes its figures are taken from them. The study itself (the sampler, the
storage, the order of trials) stays in this process and runs as it would alone: every figure
is the one this process would have computed, only sooner.

A helper is a fresh interpreter running `serve`, fed over a pipe: not a
`multiprocessing` child, which would import the user's own script again. The helpers start
only once the trials left are expected to take `HELPER_WORTH` seconds (a small study is over
before one could help); a helper that dies leaves its trials to this process.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.search.workers import Worker, child_streams, messages
from simulator.derive import PlanParams
from simulator.engine import Engine, Evaluation

__all__ = [
    "HELPER_WORTH",
    "HELPERS_MAX",
    "READY",
    "Figures",
    "Helpers",
    "helper_count",
    "serve",
    "upcoming",
]

#: helpers start once the study's trials left are expected (at the mean time of its evaluations
#: so far) to take this many seconds: a helper is ready 0.5-0.8 s after it starts (an
#: interpreter, numpy and the simulator imported, the engine unpickled; docs/method.md,
#: "Constants"), and costs this process 0.1-0.2 s
HELPER_WORTH = 2.0
#: at most this many helpers: the refinement queues 4 trials at a time, one of which is the
#: trial this process runs
HELPERS_MAX = 3
#: what a helper sends once it has loaded the engine (it is given trials only then)
READY = "ready"
#: seconds between checks for an interrupt while waiting for a helper
_POLL = 0.5


@dataclass(frozen=True)
class Figures:
    """What a trial records of an evaluation."""

    params: PlanParams
    peak_bytes: int
    host_peak_bytes: int
    step_seconds: float | None
    overhead: float | None
    swapped_tensors: int

    @classmethod
    def of(cls, ev: Evaluation) -> Figures:
        return cls(
            ev.params,
            ev.peak_bytes,
            ev.host_peak_bytes,
            ev.step_seconds,
            ev.overhead,
            len(ev.plan.swaps),
        )


def helper_count(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """How many helpers this machine runs beside this process: its other cores, at most
    `HELPERS_MAX` (none on one core). The cores are those this process may run on, and no
    more than a container's CPU quota (`cgroup`'s, v2 or v1) allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _quota(cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(0, min(cores - 1, HELPERS_MAX))


def _quota(cgroup: Path) -> float | None:
    """The CPUs a container's quota allows (`cpu.max`, or v1's `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`); None without one."""
    try:
        v2 = cgroup / "cpu.max"
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
        else:
            v1 = cgroup / "cpu"
            quota = (v1 / "cpu.cfs_quota_us").read_text().strip()
            period = (v1 / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def upcoming(study: Any, space: Any) -> list[PlanParams]:
    """The parameters of `study`'s queued trials, in the order they will run (those whose
    queued values do not fix every parameter are left out: theirs are sampled)."""
    import optuna

    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    out = []
    for t in sorted(waiting, key=lambda t: t.number):
        fixed = t.system_attrs.get("fixed_params")
        if not fixed:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out.append(space.suggest(optuna.trial.FixedTrial(fixed)))
            except ValueError:  # a parameter it does not fix
                continue
    return out


class Helpers:
    """Helper processes for one study on one engine (started when first worth it).

    Each helper holds one trial at a time. The thread that reads a helper's answer gives it the
    next queued trial at once (from the list this process last published, `figures`), so that a
    helper does not wait for this process to finish a trial of its own; a trial is never given
    to a helper once this process has it, so this process waits only for one a helper has
    started."""

    def __init__(self, engine: Engine, count: int, trials: int, worth: float | None = None) -> None:
        self.engine, self.count, self.left = engine, count, trials
        self.worth = HELPER_WORTH if worth is None else worth
        self.spent, self.evaluated = 0.0, 0  # seconds and evaluations of this process
        self.done: dict[PlanParams, Figures] = {}
        self.sent: dict[PlanParams, int] = {}  # in flight, by helper
        self._ahead: list[PlanParams] = []  # the queued trials, as this process last saw them
        self._here: set[PlanParams] = set()  # what this process is evaluating or will now
        self._procs: list[_Helper] = []
        self._changed = threading.Condition()  # guards the above; notified on every answer

    def figures(
        self, params: PlanParams, ahead: Callable[[], list[PlanParams]], stop: Callable[[], bool]
    ) -> Figures:
        """The figures of `params`: a helper's, or evaluated here. `ahead()` lists the trials
        queued after it, for the helpers (and for this process while a helper has `params`);
        `stop()` is checked while waiting (True: KeyboardInterrupt)."""
        if not self._procs and self.count and self._worth_it():
            self._start()
        self.left -= 1
        listed = ahead() if self._procs else []
        while True:
            with self._changed:
                self._ahead = [p for p in listed if p != params]
                if params in self.done:
                    return self.done[params]
                mine = params if params not in self.sent else self._next()
                if mine is not None:
                    self._here.add(mine)
                for helper in self._procs:
                    self._give(helper)
                if mine is None:
                    self._changed.wait(_POLL)
            if mine is None and stop():
                raise KeyboardInterrupt
            if mine is not None:
                got = self._evaluate(mine)
                if mine == params:
                    return got

    def close(self) -> None:
        """End the helpers."""
        for proc in self._procs:
            proc.close()
        self._procs = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _worth_it(self) -> bool:
        """Whether the trials left are expected to take `worth` seconds here."""
        return self.worth <= 0 or (
            self.evaluated > 0 and self.spent / self.evaluated * self.left >= self.worth
        )

    def _evaluate(self, params: PlanParams) -> Figures:
        start = time.perf_counter()
        got = Figures.of(self.engine.evaluate(params))
        self.spent += time.perf_counter() - start
        self.evaluated += 1
        with self._changed:
            self.done[params] = got
            self._here.discard(params)
        return got

    def _next(self) -> PlanParams | None:
        """The first queued trial no one has evaluated or is evaluating (holding the lock)."""
        taken = self.done.keys() | self.sent.keys() | self._here
        return next((p for p in self._ahead if p not in taken), None)

    def _give(self, helper: _Helper) -> None:
        """Give `helper` the next queued trial if it is free (holding the lock)."""
        if helper.ready and helper.alive and helper.index not in self.sent.values():
            params = self._next()
            if params is not None:
                self.sent[params] = helper.index
                helper.send(params)

    def _start(self) -> None:
        self.engine.serialized()  # its order edges go with it, as found here
        try:
            engine = pickle.dumps(self.engine, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):  # it holds what cannot go
            self.count = 0
            return
        for index in range(self.count):
            try:
                self._procs.append(_Helper.start(engine, index, self._answer))
            except OSError:  # no interpreter to start (an embedded Python): evaluate here
                break
        self.count = len(self._procs)

    def _answer(self, helper: _Helper, params: PlanParams | None, figures: Any) -> None:
        """What a helper's reader thread hands on: figures, READY, or its end (None, None)."""
        with self._changed:
            if params is not None:
                self.sent.pop(params, None)
                self.done[params] = figures
            elif figures == READY:
                helper.ready = True
            else:  # it ended: what it had is done here
                helper.alive = False
                self.sent = {p: i for p, i in self.sent.items() if i != helper.index}
            self._give(helper)
            self._changed.notify_all()


class _Helper:
    """One helper: its worker process, and whether it has loaded the engine and is alive."""

    COMMAND = "from autotune.search.helpers import serve; serve()"  # run by `python -c`

    def __init__(self, index: int) -> None:
        self.index, self.alive, self.ready = index, True, False
        self.worker: Worker | None = None

    @classmethod
    def start(cls, engine: bytes, index: int, answer: Callable[..., None]) -> _Helper:
        """A helper given the pickled `engine`; its reader thread calls `answer(helper,
        parameters, figures)` with each answer, and `answer(helper, None, None)` once it has
        ended. OSError if no interpreter starts."""
        helper = cls(index)

        def told(message: tuple[Any, Any] | None) -> None:
            answer(helper, *(message or (None, None)))

        # one that fails only leaves its trials to the study: its errors are not shown
        helper.worker = Worker.start(cls.COMMAND, engine, told, quiet=True)
        return helper

    def send(self, params: PlanParams) -> None:
        assert self.worker is not None
        self.worker.send(params)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def serve() -> None:
    """A helper: read an engine, then evaluate each set of parameters it is sent."""
    import gc

    from simulator.memory import fewer_collections

    stream, out = child_streams()
    engine = pickle.load(stream)
    pickle.dump((None, READY), out)
    out.flush()
    gc.freeze()
    with fewer_collections():
        for params in messages(stream):
            pickle.dump((params, Figures.of(engine.evaluate(params))), out)
            out.flush()
