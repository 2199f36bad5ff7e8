"""Progress bars: a total that the stages reach, so that the bar can show an ETA."""

from typing import Any

from autotune.progress import Progress


class Bar:
    def __init__(self, total: int | None) -> None:
        self.total, self.n, self.closed, self.postfix = total, 0, False, ""

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Recorded(Progress):
    def __init__(self) -> None:
        super().__init__(True)
        self.bars: list[Bar] = []

    def _bar(self, total: int | None, desc: str, unit: str) -> Any:
        self.bars.append(Bar(total))
        return self.bars[-1]


def test_expected_stages_give_a_total_the_stages_reach() -> None:
    p = Recorded()
    p.expect(3)
    for text in ("tracing", "costs"):
        p.stage(text)
    p.expect(-1)  # a stage that was not needed
    bar = p.bars[0]
    assert (bar.n, bar.total, bar.postfix) == (1, 2, "costs")
    p.done()
    assert (bar.n, bar.total, bar.closed) == (2, 2, True)


def test_a_total_never_falls_below_the_stage_running() -> None:
    p = Recorded()
    p.expect(1)
    p.stage("a")
    p.stage("b")
    p.expect(-5)
    assert p.bars[0].total == p.bars[0].n + 1 == 2


def test_a_disabled_progress_makes_no_bar() -> None:
    p = Recorded()
    p.enabled = False
    p.expect(2)
    p.stage("a")
    p.done()
    assert p.bars == []
