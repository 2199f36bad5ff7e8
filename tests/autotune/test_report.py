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


def test_facts_count_the_order_edges_and_leave_the_list_to_the_end() -> None:
    d = json.loads(SUMMARY.read_text())
    edges = [["a/before", "b/after"], ["c/before", "d/after"]]
    facts = _facts(_Tuned({**d, "order_edges": edges}))  # type: ignore[arg-type]
    assert "- order edges: 2 (listed at the end)" in facts
    assert not any("waits for" in f for f in facts)
    assert not any("order edge" in f for f in _facts(_Tuned({**d, "order_edges": []})))  # type: ignore[arg-type]


def test_inline_code_shows_as_code_in_html() -> None:
    from autotune.report.write import _inline

    assert _inline("`a/b` waits for `c<d`") == "<code>a/b</code> waits for <code>c&lt;d</code>"
