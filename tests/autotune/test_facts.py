"""The report's lines of text: facts, parameters and order edges, from a result's summary."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.report.facts import facts as _facts
from autotune.report.facts import params_line
from simulator.derive import PlanParams

SUMMARY = Path(__file__).parents[2] / "results" / "report_resnet50" / "summary.json"


class _Tuned:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def to_dict(self) -> dict[str, Any]:
        return self.d


def test_facts_count_the_order_edges_and_leave_the_list_to_the_end() -> None:
    d = json.loads(SUMMARY.read_text())
    edges = [["a/before", "b/after"], ["c/before", "d/after"]]
    d["peak_without_order_edges_bytes"] = None  # what they save is the next test's
    facts = _facts(_Tuned({**d, "order_edges": edges}))  # type: ignore[arg-type]
    assert "- order edges: 2 (listed at the end)" in facts
    assert not any("waits for" in f for f in facts)
    assert not any("order edge" in f for f in _facts(_Tuned({**d, "order_edges": []})))  # type: ignore[arg-type]


def test_facts_say_what_the_order_edges_save() -> None:
    d = json.loads(SUMMARY.read_text())
    edges = [["a/before", "b/after"]]
    unordered = d["predicted_peak_bytes"] + (3 << 20)
    tuned = _Tuned({**d, "order_edges": edges, "peak_without_order_edges_bytes": unordered})
    facts = _facts(tuned)  # type: ignore[arg-type]
    saved = "without them the same parameters peak 3.00 MiB higher"
    assert f"- order edges: 1; {saved} (listed at the end)" in facts


def test_facts_count_the_loops_run_one_iteration_at_a_time() -> None:
    d = json.loads(SUMMARY.read_text())
    unordered = d["predicted_peak_bytes"] + (5 << 20)
    loops = {"order_edges": [], "serial_loops": ["a/while_grad", "b/while_grad"]}
    facts = _facts(_Tuned({**d, **loops, "peak_without_order_edges_bytes": unordered}))  # type: ignore[arg-type]
    saved = "without them the same parameters peak 5.00 MiB higher"
    assert f"- loops run one iteration at a time: 2; {saved}" in facts


def test_the_tuned_parameters_print_as_pairs_with_units() -> None:
    p = replace(
        PlanParams(), ub=1, sync_out=True, recompute="cheap", prefetch_bytes=3 << 30, limit=5 << 29
    )
    line = params_line(p.to_dict())
    assert line.split() == [
        "n_tensors=all", "lb=1", "ub=1", "sync_out=True", "recompute=cheap", "recompute_ops=5",
        "prefetch_bytes=3.00", "GiB", "limit=2.50", "GiB",
    ]  # fmt: skip
    assert "threshold" not in line and "[]" not in line  # defaults and empty lists left out
