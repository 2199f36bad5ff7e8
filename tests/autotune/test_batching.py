import os
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.search.batching import METHODS, StepFamily, largest_batches, largest_possible
from autotune.search.core import Budget
from simulator import compile_program, get_preset, lower_bound_bytes, simulate_memory
from simulator.derive import PlanParams
from simulator.scaling import BatchFamily

pytestmark = pytest.mark.tf


def capturer(name: str):  # type: ignore[no-untyped-def]
    from autotune.api import capture
    from autotune.zoo import get_entry

    zm = get_entry(name).build()
    return lambda b: capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=b)


@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-transformer", "tiny-unet3d"])
def test_two_captures_give_the_graph_of_a_third_exactly(model: str) -> None:
    at = capturer(model)
    family = BatchFamily.fit(at(2).graph, 2, at(3).graph, 3)
    real, scaled = at(7).graph, family.at(7)
    assert list(scaled.ops) == list(real.ops)
    assert {n: (t.nbytes, t.shape, t.kind) for n, t in scaled.tensors.items()} == {
        n: (t.nbytes, t.shape, t.kind) for n, t in real.tensors.items()
    }
    assert {n: o.scratch for n, o in scaled.ops.items()} == {
        n: o.scratch for n, o in real.ops.items()
    }
    got = simulate_memory(compile_program(scaled))
    want = simulate_memory(compile_program(real))
    assert got.peak_bytes == want.peak_bytes and got.trace.rows == want.trace.rows
    assert family.lower_bound(7) == lower_bound_bytes(real)  # without building the graph


def test_a_family_runs_grapplers_pass_on_its_first_capture_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second capture only sizes the family; finding what Grappler rewrites takes seconds
    on a real model (2 s of the main job), so it is found where it is read."""
    import pickle

    import rewriter.optimized

    calls = []
    real = rewriter.optimized.rewritten_ops

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(rewriter.optimized, "rewritten_ops", counted)
    family = StepFamily.capture(capturer("tiny-transformer"), get_preset("v100-16gb-nvlink2"))
    assert not calls
    graph = family.engine(12).graph
    assert graph.rewritten and len(calls) == 1
    assert pickle.loads(pickle.dumps(graph)).rewritten == graph.rewritten and len(calls) == 1


def test_a_step_whose_loops_run_ahead_is_captured_at_each_batch() -> None:
    """Its loops' run-ahead is the most over their iterations (not affine in the batch: a
    line through two captures gave a Keras LSTM's gradient loop -1.8 GiB at batch 4934)."""
    from autotune.search.batching import CapturedSteps

    at, made = capturer("lstm-classifier-loop"), []

    def counted(b: int) -> Any:
        made.append(b)
        return at(b)

    steps = StepFamily.or_captures(counted, None, (2, 3))
    assert isinstance(steps, CapturedSteps) and made == [2, 3]
    assert steps.engine(3).graph.parallel_loops and made == [2, 3]  # the captures made, kept
    assert steps.lower_bound(5) > steps.lower_bound(3) and made == [2, 3, 5]


@pytest.fixture(scope="module")
def steps() -> StepFamily:
    return StepFamily.capture(capturer("tiny-cnn"), get_preset("v100-16gb-nvlink2"), (4, 8))


def test_engines_at_any_batch_carry_costs_that_grow_with_it(steps: StepFamily) -> None:
    small, big = steps.engine(16), steps.engine(64)
    assert small.timeline is not None and big.timeline is not None
    assert big.timeline.baseline_seconds > small.timeline.baseline_seconds
    assert steps.engine(16) is small  # cached


def test_largest_batches_are_tight_and_ordered(steps: StepFamily) -> None:
    budget = Budget(80 << 20, 0.95)
    found = largest_batches(steps, budget, trials=12, seed=0)
    assert set(found) == set(METHODS)
    n = found["no swapping"].batch

    def no_swap_peak(b: int) -> int:
        return steps.engine(b).evaluate(PlanParams(n_tensors=0)).peak_bytes

    assert no_swap_peak(n) <= budget.bytes < no_swap_peak(n + 1)
    ceiling = largest_possible(steps, budget)
    assert steps.lower_bound(ceiling) <= budget.bytes < steps.lower_bound(ceiling + 1)
    for method, search in found.items():
        assert search.batch <= ceiling
        if method != "no swapping" and search.outcome and search.outcome.best:
            assert search.outcome.best.peak_bytes <= budget.bytes
    assert found["ours"].batch > n
    warm = (found["original defaults"].batch, found["original auto-tuner"].batch)
    assert found["ours"].batch >= max(warm)


def test_the_probes_expected_end_as_the_probes_made(steps: StepFamily) -> None:
    """A progress bar's total: every method's most probes at first, then fewer by those its
    search did not need, so that the total ends at the number of probes made."""
    expected, probes = [], []
    found = largest_batches(
        steps, Budget(80 << 20, 0.95), trials=4, seed=0, methods=("no swapping", "ours"),
        on_probe=lambda method, batch: probes.append(batch), on_expect=expected.append,
    )  # fmt: skip
    assert expected[0] >= len(probes) and sum(expected) == len(probes)
    assert len(probes) == sum(search.probes for search in found.values())


def test_a_host_limit_lowers_the_largest_batch_and_is_named_as_the_limit(
    steps: StepFamily,
) -> None:
    methods = ("no swapping", "ours")
    free = largest_batches(steps, Budget(80 << 20, 0.95), trials=12, seed=0, methods=methods)
    best = free["ours"].outcome.best if free["ours"].outcome else None
    assert best is not None and best.host_peak_bytes > 0
    assert "device memory" in free["ours"].limit
    host = best.host_peak_bytes // 2
    limited = largest_batches(
        steps, Budget(80 << 20, 0.95, host), trials=12, seed=0, methods=methods
    )
    ours = limited["ours"]
    assert free["no swapping"].batch <= ours.batch < free["ours"].batch
    assert ours.limit == "host memory"
    assert ours.outcome is not None and ours.outcome.best is not None
    assert ours.outcome.best.host_peak_bytes <= host


def test_a_probe_where_nothing_fits_stops_soon_after_its_warm_starts(steps: StepFamily) -> None:
    from autotune.search.batching import PROBE_AFTER_STARTS, method_at
    from autotune.search.core import Space

    engine = steps.engine(64)
    budget = Budget(engine.lower_bound - 1, 1.0)  # under the lower bound: no plan fits
    probe = method_at(steps, "ours", 64, budget, 40, 0, first_fit=True)
    trials = probe.study.trials
    queued = sum("fixed_params" in t.system_attrs for t in trials)
    assert not probe.fits and queued > 0
    assert len(trials) == queued + PROBE_AFTER_STARTS < 40
    full = method_at(steps, "ours", 64, budget, 40, 0)
    assert len(full.study.trials) == 40  # the whole search where the outcome is wanted
    random = method_at(steps, "random search", 64, budget, 40, 0, first_fit=True)
    starts = len(Space.of(engine, budget_bytes=budget.bytes).starts())
    assert len(random.study.trials) == starts + PROBE_AFTER_STARTS <= len(trials)
    assert len(method_at(steps, "random search", 64, budget, 40, 0).study.trials) == 40


class _Sized:
    """Steps whose least-memory plan fits up to batch `plan`, and where the search fits up
    to `search` (the plans it finds may fit more)."""

    def __init__(self, plan: int, search: int) -> None:
        self.plan, self.search, self.full = plan, search, []  # type: ignore[var-annotated]

    def engine(self, batch: int) -> Any:
        peak = 1 if batch <= self.plan else 3
        return SimpleNamespace(evaluate=lambda _: SimpleNamespace(peak_bytes=peak))

    def probe(self, _steps: Any, _method: str, batch: int, *_: Any, **__: Any) -> Any:
        self.full.append(batch)
        return SimpleNamespace(fits=batch <= self.search, shown=None)


@pytest.mark.parametrize(
    ("plan", "search", "failed"),
    [(700, 700, 1), (640, 700, 6), (50, 50, 1), (300, 300, 1), (300, 2000, 0), (10, 10, 1)],
)
def test_ours_probes_only_past_the_largest_batch_its_least_memory_plan_fits(
    plan: int, search: int, failed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that fails runs all its trials: ours' size search finds where its least-memory
    plan stops fitting by single evaluations, and runs a probe only there and past it (and
    further up only where the search fits more). It finds the batch a binary search of probes
    finds (none where nothing fits 50); that one would have run 5 failing probes in (50, 2000]
    at 700."""
    from autotune.search import batching

    steps: Any = _Sized(plan, search)
    monkeypatch.setattr(batching, "method_at", steps.probe)
    found = batching.largest_batch(
        steps, "ours", Budget(2), trials=12, seed=0, low=50, high=2000, full_outcome=False
    )
    assert found.batch == (min(search, 2000) if search >= 50 else 0)
    assert sum(b > search for b in steps.full) == failed
    first = [plan, plan + 1] if search >= 50 else [50]
    assert steps.full[: len(first)] == first
    assert found.probes <= batching.max_probes(50, 2000, "ours")


def test_random_search_beside_the_others_finds_what_it_finds_here(
    steps: StepFamily, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random search's largest batch is searched in a worker process: the same batch, plan
    and figures as searched in this one, and its probes reach the progress bar."""
    from autotune.search import batching
    from autotune.search.aside import Aside
    from autotune.search.batching import largest_batch

    class Watched(Aside):
        workers: list[int] = []

        @classmethod
        def start(cls, *args: Any, **kwargs: Any) -> Aside | None:
            side = super().start(*args, **kwargs)
            Watched.workers.append(side.process.pid if side else 0)
            return side

    monkeypatch.setattr(batching, "Aside", Watched)
    budget, probes = Budget(80 << 20, 0.95), []
    found = largest_batches(
        steps, budget, trials=6, seed=0, methods=("no swapping", "random search"),
        on_probe=lambda method, batch: probes.append(method),
    )  # fmt: skip
    low, high = found["no swapping"].batch, largest_possible(steps, budget)
    here = largest_batch(steps, "random search", budget, trials=6, seed=0, low=low, high=high)
    aside = found["random search"]
    assert aside.batch == here.batch > low and aside.probes == here.probes
    assert aside.outcome is not None and here.outcome is not None
    assert aside.outcome.best is not None and here.outcome.best is not None
    assert aside.outcome.best.plan == here.outcome.best.plan
    assert aside.outcome.best.peak_bytes == here.outcome.best.peak_bytes
    assert probes.count("random search") == here.probes
    assert len(Watched.workers) == 1 and Watched.workers[0] not in (0, os.getpid())


def test_the_search_beside_goes_on_while_this_process_moves_on(steps: StepFamily) -> None:
    """`largest_batches_beside` returns what it searched here while random search's worker
    may still run; `joined` adds that search's result (the one `largest_batches` gives) and
    ends the worker. Once `hidden`, its probes reach the bar no more, and the bar's total
    loses the probes expected of it and not shown: it ends where the probes shown do."""
    from autotune.search.batching import largest_batches_beside

    budget, methods = Budget(80 << 20, 0.95), ("no swapping", "random search")
    probes: list[str] = []
    totals: list[int] = []
    here, beside = largest_batches_beside(
        steps, budget, trials=6, seed=0, methods=methods,
        on_probe=lambda method, batch: probes.append(method), on_expect=totals.append,
    )  # fmt: skip
    assert list(here) == ["no swapping"] and beside.side is not None
    beside.hidden()
    shown = probes.count("random search")
    found = beside.joined(here)
    assert list(found) == list(methods) and probes.count("random search") == shown
    assert sum(totals) == len(probes)
    assert beside.side.process.poll() is not None
    alone = largest_batches(steps, budget, trials=6, seed=0, methods=methods)["random search"]
    got = found["random search"]
    assert got.batch == alone.batch and got.probes == alone.probes
    assert got.outcome is not None and alone.outcome is not None
    assert got.outcome.best is not None and alone.outcome.best is not None
    assert got.outcome.best.plan == alone.outcome.best.plan


def test_fit_ends_the_search_beside_when_its_tuning_is_interrupted(
    steps: StepFamily, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fit(max_batch=True)` tunes ours while random search's worker goes on: an interrupt
    there stops the worker too (whether or not its search had ended by then), before it is
    raised."""
    from autotune.search import batching, tuning
    from autotune.search.aside import Aside

    started: list[Aside] = []
    stopped: list[Aside] = []

    class Watched(Aside):
        @classmethod
        def start(cls, *args: Any, **kwargs: Any) -> Aside | None:
            side = super().start(*args, **kwargs)
            if side is not None:
                started.append(side)
            return side

        def stop(self) -> None:
            stopped.append(self)
            super().stop()

    def captured_never(batch: int | None) -> Any:
        raise AssertionError("the family is given: nothing is captured")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        assert started and not stopped  # not waited for before ours is tuned
        raise KeyboardInterrupt

    monkeypatch.setattr(batching, "Aside", Watched)
    monkeypatch.setattr(tuning, "tune_captured", interrupted)
    monkeypatch.setattr(tuning.StepFamily, "or_captures", lambda *a, **k: steps)
    with pytest.raises(KeyboardInterrupt):
        tuning._fit_max_batch(
            captured_never, get_preset("v100-16gb-nvlink2"), Budget(80 << 20, 0.95), None,
            tuning.Progress(False), trials=50, seed=0, storage="sqlite://", objectives=1,
            recompute="search",
        )  # fmt: skip
    assert len(started) == 1 and stopped == started
    assert started[0].process.poll() is not None


def test_a_failure_beside_is_one_error_here(steps: StepFamily) -> None:
    from autotune.search.aside import Aside
    from simulator.errors import UserError

    side = Aside.start(
        steps, "no such method", budget=Budget(80 << 20), trials=2, seed=0, low=2, high=8
    )
    assert side is not None
    with pytest.raises(
        UserError, match="the search beside this one failed: UserError: unknown method"
    ):
        side.result(lambda method, batch: None)


def test_a_worker_that_dies_is_one_error_here(steps: StepFamily) -> None:
    from autotune.search.aside import Aside
    from simulator.errors import UserError

    side = Aside.start(
        steps, "random search", budget=Budget(80 << 20), trials=50, seed=0, low=2, high=4096
    )
    assert side is not None
    side.process.kill()
    with pytest.raises(UserError, match="the search beside this one failed: exited with code"):
        side.result(lambda method, batch: None)
