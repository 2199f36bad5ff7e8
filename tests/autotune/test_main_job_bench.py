import json
from pathlib import Path

import pytest

from autotune.benchmarks.main_job import main, summary

pytestmark = pytest.mark.tf


def test_the_main_job_is_timed_in_a_fresh_process_and_its_findings_written(tmp_path: Path) -> None:
    assert main(["--runs", "1", "--model", "tiny-cnn", "--gpu-memory", "40MiB",
                 "--trials", "4", "--out", str(tmp_path)]) == 0  # fmt: skip
    report = json.loads((tmp_path / "main_job.json").read_text())
    run = report["runs"][0]
    assert report["median_seconds"] == run["seconds"] > 0
    assert report["max_batch_tuned"] >= report["max_batch_no_swap"] >= 2
    assert report["command"].startswith("autotune fit --model tiny-cnn")
    assert f"| {report['max_batch_tuned']} |" in (tmp_path / "main_job.md").read_text()


def test_runs_that_found_different_batches_are_refused() -> None:
    same = {"max_batch_no_swap": 179, "max_batch_tuned": 1147, "predicted_overhead": 1.1}
    runs = [{"seconds": s, **same} for s in (50.0, 70.0, 60.0)]
    assert summary(["fit"], runs)["median_seconds"] == 60.0
    with pytest.raises(RuntimeError, match="different results"):
        summary(["fit"], [*runs, {**runs[0], "max_batch_tuned": 1146}])
