"""A tuned plan confirmed on the graph TensorFlow runs (`autotune.search.asrun`)."""

from types import SimpleNamespace
from typing import Any

import pytest

from tests.autotune.cli_helpers import cli_json

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_fit_takes_a_plan_that_fits_as_tensorflow_runs_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tiny-transformer at 10 MiB: the study's fastest plans that fit peak at 11 MiB once
    Grappler hoists GELU's gradient out of its swapped-in terms (docs/accuracy.md and
    test_verify); fit returns one that fits as run, and the step measures what that says."""
    out = cli_json(
        "fit", "--model", "tiny-transformer", "--batch-size", "128", "--gpu-memory", "10MiB",
        "--trials", "20", "--seed", "0", "--safety-ratio", "1", "--verify", "--out", str(tmp_path),
    )  # fmt: skip
    budget, as_run = out["budget_bytes"], out["as_run_peak_bytes"]
    assert as_run is not None and as_run <= budget
    assert out["methods"]["ours"]["peak_bytes"] == out["predicted_peak_bytes"]  # the one taken
    measured = out["verification"]["measured_peak_bytes"]
    assert abs(as_run / measured - 1) <= 0.05 and out["verification"]["fits"]


def test_a_best_plan_whose_graph_as_run_is_not_captured_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the graph TensorFlow runs cannot be captured, nothing says the best plan does not
    fit as run: it stays, predicted by its own simulation, and no slower plan is tried."""
    import autotune.run.predict as predict
    from autotune.search import asrun

    def never(*args: Any) -> Any:
        raise AssertionError("no other plan is tried")

    monkeypatch.setattr(predict, "reads_regrouped", lambda graph, plan: True)
    monkeypatch.setattr(asrun, "as_run", lambda captured, ev: None)
    monkeypatch.setattr(asrun, "_others", never)
    best = SimpleNamespace(plan="plan", params="params")
    engine, budget = SimpleNamespace(evaluate=never), SimpleNamespace(bytes=1 << 20)
    assert asrun.confirmed(SimpleNamespace(graph=None), engine, budget, None, best) == (best, None)
