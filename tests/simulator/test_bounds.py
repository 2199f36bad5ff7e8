import pytest

from simulator import Link
from simulator.bounds import time_bound_seconds

LINK = Link(10.0, 10.0)  # 10 B/s each way: a swapped byte costs 0.1 s out and 0.1 s back


def test_a_step_within_its_budget_is_bounded_by_its_compute() -> None:
    assert time_bound_seconds(1.0, 0, LINK) == 1.0
    assert time_bound_seconds(1.0, -5, LINK, [(100, 1.0)]) == 1.0


def test_swapped_bytes_cross_the_link_out_before_the_peak_and_back_after_it() -> None:
    assert time_bound_seconds(1.0, 10, LINK) == pytest.approx(2.0)  # 10 B x 0.2 s
    assert time_bound_seconds(3.0, 10, LINK) == pytest.approx(3.0)  # the copies hide


def test_recomputing_trades_compute_for_transfers_where_the_two_meet() -> None:
    # x recomputed bytes: max(1 + 0.1 x, 0.2 (10 - x)) is least at x = 10/3
    assert time_bound_seconds(1.0, 10, LINK, [(10, 0.1)]) == pytest.approx(1 + 1 / 3)
    # at most the tiers' bytes: 2 recomputed, 8 swapped
    assert time_bound_seconds(1.0, 10, LINK, [(2, 0.1)]) == pytest.approx(1.6)
    # free recomputes of everything leave the compute
    assert time_bound_seconds(1.0, 10, LINK, [(10, 0.0)]) == pytest.approx(1.0)


def test_recomputes_are_taken_cheapest_first() -> None:
    # 2 B at 0.05 s/B (0.1 s), then the costlier tier meets the shrinking transfers:
    # 1.1 + 0.2 (x - 2) = 0.2 (10 - x) at x = 3.25
    tiers = [(10, 0.2), (2, 0.05)]
    assert time_bound_seconds(1.0, 10, LINK, tiers) == pytest.approx(1.35)
    # the same bytes at the costlier rate alone bound higher: x = 2.5
    assert time_bound_seconds(1.0, 10, LINK, [(12, 0.2)]) == pytest.approx(1.5)
    # tiers beyond `over` are never taken
    assert time_bound_seconds(0.0, 2, LINK, [(100, 0.0)]) == 0.0
