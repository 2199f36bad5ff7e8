import contextlib
import copy
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import autotune.search.helpers as helpers_module
import autotune.search.trials as trials_module
from autotune.search.budget import Budget
from autotune.search.helpers import READY, Figures, Helpers, helper_count, upcoming
from autotune.search.space import Space
from autotune.search.trials import in_memory_study, run_study
from simulator.derive import PlanParams
from simulator.engine import Engine

pytestmark = pytest.mark.tf

#: a helper that says it is ready and then never answers
SILENT = f"import pickle, sys, time; pickle.dump((None, {READY!r}), sys.stdout.buffer); "
SILENT += "sys.stdout.flush(); time.sleep(600)"


@pytest.fixture(scope="module")
def engine() -> Engine:
    from autotune.api import build_engine, capture
    from autotune.zoo import get_entry
    from simulator import get_preset

    zm = get_entry("tiny-cnn").build()
    captured = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=64)
    return build_engine(captured, get_preset("v100-16gb-nvlink2"))


def _budget(engine: Engine, share: float) -> Budget:
    top = engine.evaluate(PlanParams(n_tensors=0)).peak_bytes
    return Budget(int(engine.lower_bound + share * (top - engine.lower_bound)), 1.0)


def _params(engine: Engine) -> list[PlanParams]:
    limit = _budget(engine, 0.5).bytes
    return [
        PlanParams(),
        PlanParams(n_tensors=-1, ub=1, sync_out=True, serialize=True, limit=limit),
        PlanParams(n_tensors=3, recompute="cheap", limit=limit, backward_swaps=True),
        PlanParams(n_tensors=-1, lb=2, ub=9, serialize=True),
    ]


def _started(helpers: Helpers) -> Helpers:
    """`helpers` started, once each has loaded the engine."""
    helpers._start()
    with helpers._changed:
        while not all(h.ready for h in helpers._procs):
            helpers._changed.wait(1)
    return helpers


class _Counted(Helpers):
    """Helpers that record the evaluations made in this process."""

    here: list[PlanParams]

    def _evaluate(self, params: PlanParams) -> Figures:
        self.here = [*getattr(self, "here", []), params]
        return super()._evaluate(params)


def test_queued_trials_are_evaluated_by_the_helper_with_the_same_figures(engine: Engine) -> None:
    first, *queued = _params(engine)
    alone = {p: Figures.of(engine.evaluate(p)) for p in _params(engine)}
    with _started(_Counted(engine, 1, 9, worth=0.0)) as helpers:
        never = lambda: False  # noqa: E731
        got = [helpers.figures(first, lambda: queued, never)]
        for i, params in enumerate(queued):
            got.append(helpers.figures(params, lambda i=i: queued[i + 1 :], never))
    assert got == [alone[p] for p in [first, *queued]]
    # the first queued trial went to the helper before this process took the first trial
    assert helpers.here[0] == first and queued[0] not in helpers.here


@contextlib.contextmanager
def _holding(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[_Counted, PlanParams]]:
    """Helpers whose one helper holds the second trial and never answers (after the first)."""
    monkeypatch.setattr(helpers_module._Helper, "COMMAND", SILENT)
    first, second, *_ = _params(engine)
    with _started(_Counted(engine, 1, 9, worth=0.0)) as helpers:
        helpers.figures(first, lambda: [second], lambda: False)
        assert helpers.sent == {second: 0} and helpers.here == [first]
        yield helpers, second


def test_a_helper_that_ends_leaves_its_trial_to_this_process(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _holding(engine, monkeypatch) as (helpers, second):
        threading.Timer(1.0, helpers._procs[0].worker.process.kill).start()
        assert helpers.figures(second, lambda: [], lambda: False) == Figures.of(
            engine.evaluate(second)
        )
    assert helpers.here[1:] == [second] and not helpers._procs


def test_an_interrupt_stops_the_wait_for_a_helper(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _holding(engine, monkeypatch) as (helpers, second), pytest.raises(KeyboardInterrupt):
        helpers.figures(second, lambda: [], lambda: True)


def test_a_study_with_helpers_runs_the_trials_it_runs_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = _budget(engine, 0.4)

    def trials(count: int) -> list[Any]:
        monkeypatch.setattr(trials_module, "helper_count", lambda: count)
        out = run_study(engine, budget, in_memory_study("tpe", 3), 30)
        return [(t.params, t.values, t.user_attrs) for t in out.study.trials]

    monkeypatch.setattr(helpers_module, "HELPER_WORTH", 0.0)
    assert trials(1) == trials(0)


def test_upcoming_lists_the_queued_trials_that_fix_every_parameter(engine: Engine) -> None:
    space = Space.of(engine, "search", 1 << 20)
    study = in_memory_study("tpe", 0)
    starts = space.starts()
    for fixed in (starts[1], {"n_tensors": 2}, starts[0]):
        study.enqueue_trial(fixed)
    assert upcoming(study, space) == [
        space.suggest(_fixed(starts[1])),
        space.suggest(_fixed(starts[0])),
    ]


def _fixed(params: dict[str, Any]) -> Any:
    import optuna

    return optuna.trial.FixedTrial(params)


def test_an_engine_is_pickled_without_the_simulations_it_keeps(engine: Engine) -> None:
    params = _params(engine)[1]
    before = engine.evaluate(params)
    assert engine.serialized()._bare  # derivation's simulations, kept for reuse
    copied = pickle.loads(pickle.dumps(engine))
    assert not copied._bare and not copied.serialized()._bare
    assert Figures.of(copied.evaluate(params)) == Figures.of(before)


def test_an_engine_that_cannot_be_pickled_is_evaluated_here(engine: Engine) -> None:
    odd = copy.copy(engine)
    odd.shared = {**engine.shared, "odd": lambda: 0}  # no pickle for a lambda
    first, *queued = _params(engine)
    with Helpers(odd, 1, 9, worth=0.0) as helpers:
        assert helpers.figures(first, lambda: queued, lambda: False) == Figures.of(
            engine.evaluate(first)
        )
        assert not helpers._procs and not helpers.sent and helpers.count == 0


def test_helpers_leave_one_core_to_this_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for cores, count in ((1, 0), (2, 1), (64, helpers_module.HELPERS_MAX)):
        monkeypatch.setattr(helpers_module.os, "sched_getaffinity", lambda _, c=cores: range(c))
        assert helper_count(tmp_path) == count


@pytest.mark.parametrize(
    "files,count",
    [
        ({"cpu.max": "max 100000\n"}, 3),
        ({"cpu.max": "150000 100000\n"}, 0),  # one and a half CPUs: one core
        ({"cpu.max": "300000 100000\n"}, 2),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
        ({"cpu.max": "garbled"}, 3),
    ],
)
def test_helpers_fit_a_containers_cpu_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: dict[str, str], count: int
) -> None:
    monkeypatch.setattr(helpers_module.os, "sched_getaffinity", lambda _: range(64))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert helper_count(tmp_path) == count


def test_helpers_start_once_the_trials_left_are_worth_it(engine: Engine) -> None:
    helpers = Helpers(engine, 1, 10, worth=2.0)
    assert not helpers._worth_it()  # nothing measured yet
    helpers.spent, helpers.evaluated, helpers.left = 0.5, 2, 7
    assert not helpers._worth_it()  # 0.25 s each, 1.75 s left
    helpers.left = 8
    assert helpers._worth_it()
