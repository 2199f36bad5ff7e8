"""A tuned plan confirmed on the graph TensorFlow runs (`autotune.search.asrun`)."""

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
