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
    names = ("simulator_accuracy", "tuned_accuracy", "swap_plans", "max_batch", "recompute")
    names += ("order_edges", "corpus", "time_model")
    for name in names:
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
    assert (tmp_path / "recompute.png").stat().st_size > 0
    for table in json.loads((tmp_path / "recompute.json").read_text()):
        largest = table["largest"]
        row = next(
            line
            for line in readme.splitlines()
            if line.startswith(f"| {table['model']} | {table['device']} | {largest['swap only']}, ")
        )
        sizes = [r["size"] for r in table["rows"]]
        assert sizes == sorted(sizes) and largest["swap only"] in sizes
        for r in table["rows"]:  # every method fits where it is the largest size of
            assert all(r[m] >= r["time bound"] * (1 - 1e-9) for m in r["largest of"])
        assert f"| {largest['swap only']}: " in row
    summary = json.loads((report / "summary.json").read_text())
    assert f"largest batch {summary['max_batch_tuned']}" in readme
    plans = json.loads((tmp_path / "swap_plans.json").read_text())
    assert f"{plans['timing']['derive_and_simulate'] * 1e3:.1f} ms" in readme
    edges = json.loads((tmp_path / "order_edges.json").read_text())["runs"]
    assert edges["True"]["order_edges"] > 0 and edges["False"]["order_edges"] == 0
    measured = format_bytes(edges["True"]["measured_peak_bytes"])
    assert f"{measured} with {edges['True']['order_edges']}" in readme
    tuned = json.loads((tmp_path / "tuned_accuracy.json").read_text())["rows"]
    assert [r["model"] for r in tuned] == ["tiny-cnn", "tiny-transformer"]
    assert f"{tuned[0]['model']} defaults {tuned[0]['error_percent']:+.1f} %" in readme
    corpus = json.loads((tmp_path / "corpus.json").read_text())["models"]
    assert [m["name"] for m in corpus] == ["unet2d"] and "error" not in corpus[0]
    assert f"{len(corpus)} models; the least peak" in readme
    (timed,) = json.loads((tmp_path / "time_model.json").read_text())["rows"]
    assert (timed["model"], timed["calibrated_at"], timed["batch"]) == ("tiny-cnn", [4, 8], 32)
    assert timed["measured_seconds"] > 0 and timed["after_seconds"] > 0
    error = 100 * (timed["after_seconds"] / timed["measured_seconds"] - 1)
    assert f"tiny-cnn 8->32 {error:+.0f} %" in readme


def _table(model: str, unit: str, no_swap: int, ours: int) -> dict[str, object]:
    rows = [
        {"method": "no swapping", "max": no_swap, "ratio": 1.0, "overhead": 1.0},
        {"method": "ours", "max": ours, "ratio": ours / no_swap, "overhead": 1.25},
    ]
    return {"model": model, "device": "v100-16gb-nvlink2", "unit": unit, "rows": rows}


def test_the_papers_table_sets_our_ratios_beside_theirs() -> None:
    from autotune.benchmarks.bench import _papers_section

    tables = [
        _table("resnet50", "batch", 100, 550),
        _table("unet3d-isensee2017", "cube edge", 128, 256),
        _table("gpt2-small", "batch", 4, 12),
        {**_table("resnet50", "batch", 1, 2), "device": "v100-16gb-pcie3"},
    ]
    lines = _papers_section(tables)
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3  # the papers' device only
    assert "4.9x" in rows[0] and "| 100 | 550 | 5.50x the batch | 1.25x |" in rows[0]
    assert "5.6x" in rows[1] and "| 128^3 | 256^3 | 2.00x the edge, 8.00x the voxels |" in rows[1]
    assert "not in the papers" in rows[2] and "3.00x the batch" in rows[2]
    assert _papers_section([]) == []
