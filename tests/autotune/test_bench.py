"""`autotune bench --quick` regenerates a results folder whose README quotes that very run."""

import json
from pathlib import Path

import pytest

from autotune.units import format_bytes
from tests.autotune.cli_helpers import run_cli

pytestmark = pytest.mark.tf


def test_quick_bench_writes_every_result_and_a_readme_from_them(tmp_path: Path) -> None:
    out = run_cli("bench", "--quick", "--out", str(tmp_path), timeout=900)
    assert out.returncode == 0, out.stderr
    for name in ("simulator_accuracy", "swap_plans", "max_batch", "order_edges"):
        assert (tmp_path / f"{name}.md").stat().st_size > 0
        assert (tmp_path / f"{name}.json").stat().st_size > 0
    report = tmp_path / "report_tiny-cnn"
    assert (report / "report.html").exists() and (report / "memory_timeline.png").exists()
    readme = (tmp_path / "README.md").read_text()
    for table in json.loads((tmp_path / "max_batch.json").read_text()):
        ours = next(r for r in table["rows"] if r["method"] == "ours")
        head = f"| {table['model']} | {table['device']} |"
        row = next(line for line in readme.splitlines() if line.startswith(head))
        assert f"| {ours['max']} |" in row
    summary = json.loads((report / "summary.json").read_text())
    assert f"largest batch {summary['max_batch_tuned']}" in readme
    plans = json.loads((tmp_path / "swap_plans.json").read_text())
    assert f"{plans['timing']['derive_and_simulate'] * 1e3:.1f} ms" in readme
    edges = json.loads((tmp_path / "order_edges.json").read_text())["runs"]
    assert edges["True"]["order_edges"] > 0 and edges["False"]["order_edges"] == 0
    measured = format_bytes(edges["True"]["measured_peak_bytes"])
    assert f"{measured} with {edges['True']['order_edges']}" in readme
