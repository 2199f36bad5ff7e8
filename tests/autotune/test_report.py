from pathlib import Path
from typing import Any

import pytest


def test_inline_code_shows_as_code_in_html() -> None:
    from autotune.report.write import _inline

    assert _inline("`a/b` waits for `c<d`") == "<code>a/b</code> waits for <code>c&lt;d</code>"


@pytest.mark.tf
def test_the_facts_the_headline_table_and_the_first_plot_fit_a_first_screen(
    tmp_path: Path,
) -> None:
    """report.html laid out by a real HTML engine (WeasyPrint) on 1280 x 800 px pages, a
    laptop's browser window: the facts, the largest-batch table and the memory plot are on the
    first page; the methods table reads its peaks in MiB (a tiny model's)."""
    import weasyprint

    import autotune
    from autotune.zoo import get_entry

    zm = get_entry("tiny-cnn").build()
    kw = {"loss": zm.loss, "optimizer": zm.optimizer, "batch_size": 64}
    tuned = autotune.fit(zm.model, gpu_memory="80MiB", trials=4, max_batch=True, **kw,
                         out=tmp_path)  # fmt: skip
    report = tuned.report(tmp_path / "report")
    _a_bar_follows_the_report(tuned, tmp_path / "again")
    # the order edges' saving is simulated exactly when the plan has them
    assert (tuned.unordered_peak_bytes is not None) == bool(tuned.plan.order_edges)
    page = weasyprint.CSS(string="@page{size:1280px 800px;margin:0}")
    pages = weasyprint.HTML(filename=report.with_suffix(".html")).render(stylesheets=[page])
    first = list(_boxes(pages.pages[0]._page_box))
    tables = [b for b in first if type(b).__name__ == "TableBox"]
    images = [b for b in first if type(b).__name__ == "InlineReplacedBox"]
    assert len(tables) == 1 and len(images) == 1
    assert images[0].position_y + images[0].height <= 800
    text = report.read_text()
    assert text.index("## Largest batch per method") < text.index("![memory_timeline]")
    assert "peak (MiB)" in text.split("## Methods at this batch")[1]


def _boxes(box: Any) -> Any:
    yield box
    for child in getattr(box, "children", None) or []:
        yield from _boxes(child)


def _a_bar_follows_the_report(tuned: Any, directory: Any) -> None:
    """Writing the report shows each size of its batch curve, then the plots and the files,
    and ends at the total it expected."""
    from autotune.report.plots import batch_grid
    from autotune.report.write import write_report
    from tests.autotune.test_progress import Recorded

    bars = Recorded()
    write_report(tuned, directory, bars)
    grid = batch_grid(tuned.batches["no swapping"].batch, tuned.batches["ours"].batch)
    (bar,) = bars.bars
    assert bar.n == bar.total == len(grid) + 2 and bar.closed
    assert bar.postfix == "report.md and report.html"
