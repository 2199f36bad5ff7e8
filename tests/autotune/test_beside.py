"""The report's batch curve with its sizes shared with a worker process."""

import time
from typing import Any

import pytest

from autotune.report import plots
from autotune.report.beside import CurveBeside
from autotune.search.batching import StepFamily
from simulator import get_preset
from simulator.derive import PlanParams

pytestmark = pytest.mark.tf

BUDGET = 60 << 20
PARAMS = PlanParams(n_tensors=-1, serialize=True, limit=BUDGET)


@pytest.fixture(scope="module")
def steps() -> StepFamily:
    from autotune.api import capture
    from autotune.zoo import get_entry

    zm = get_entry("tiny-cnn").build()

    def at(b: int) -> Any:
        return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=b)

    return StepFamily.capture(at, get_preset("v100-16gb-nvlink2"), (4, 8))


def test_the_curve_shared_with_a_worker_is_the_curve_made_here(steps: StepFamily) -> None:
    """Every size's figures are the ones this process computes alone; the worker computed
    some of them, and each size is told to the progress bar once."""
    alone = plots.batch_curve(steps.engine, PARAMS, BUDGET, 100, 400)
    beside = CurveBeside.start(steps, PARAMS, BUDGET, 100, 400)
    assert beside is not None and beside.worker is not None
    here: list[int] = []

    def told(b: int) -> None:  # the first size here waits for the worker's first
        here.append(b)
        deadline = time.monotonic() + 60
        while len(here) == 1 and not beside.by_worker and time.monotonic() < deadline:
            time.sleep(0.05)

    done = beside.curve(on_point=told)
    assert done == alone
    assert sorted(here) == alone.batches
    assert beside.worker is None or beside.worker.process.poll() is not None  # ended
    assert 0 < len(beside.by_worker) < len(alone.batches)


def test_a_worker_that_dies_leaves_its_sizes_here(steps: StepFamily) -> None:
    """Killed with a size in hand, the worker leaves it and the sizes no one took here."""
    alone = plots.batch_curve(steps.engine, PARAMS, BUDGET, 100, 400)
    beside = CurveBeside.start(steps, PARAMS, BUDGET, 100, 400)
    assert beside is not None and beside.worker is not None
    deadline = time.monotonic() + 60
    while beside.given is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert beside.given is not None
    beside.worker.process.kill()
    told: list[int] = []
    assert beside.curve(on_point=told.append) == alone
    assert sorted(told) == alone.batches


def test_steps_captured_at_each_size_get_no_worker(steps: StepFamily) -> None:
    """Steps that are not a `StepFamily` (captured at each size: they do not pickle) get no
    worker: the report computes every size here (`plots.batch_curve`)."""

    class Sizes:
        def __init__(self, family: StepFamily) -> None:
            self.engine = family.engine

    assert CurveBeside.start(Sizes(steps), PARAMS, BUDGET, 100, 400) is None
