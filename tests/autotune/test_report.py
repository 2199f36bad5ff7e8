import json
from pathlib import Path
from typing import Any

from autotune.report.write import _facts

SUMMARY = Path(__file__).parents[2] / "results" / "report_resnet50" / "summary.json"


class _Tuned:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def to_dict(self) -> dict[str, Any]:
        return self.d


def test_facts_name_every_order_edge() -> None:
    d = json.loads(SUMMARY.read_text())
    edges = [["a/before", "b/after"], ["c/before", "d/after"]]
    facts = _facts(_Tuned({**d, "order_edges": edges}))  # type: ignore[arg-type]
    assert "- order edge: `b/after` waits for `a/before`" in facts
    assert "- order edge: `d/after` waits for `c/before`" in facts
    assert not any("order edge" in f for f in _facts(_Tuned({**d, "order_edges": []})))  # type: ignore[arg-type]
