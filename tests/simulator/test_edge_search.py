import pytest

import simulator.edge_search as edge_search
from simulator.derive import PlanParams
from simulator.engine import Engine
from tests.simulator.builders import unrolled_recurrence


def test_ops_whose_inputs_are_held_anyway_are_deferred_where_that_lowers_the_peak() -> None:
    engine = Engine.build(unrolled_recurrence())
    serial = engine.serialized()
    assert {("q2", "p2"), ("q3", "p3")} <= set(serial.edges)
    least = PlanParams(n_tensors=0)
    assert serial.evaluate(least).peak_bytes < engine.evaluate(least).peak_bytes


def test_held_input_edges_that_lower_the_peak_by_less_than_the_share_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = Engine.build(unrolled_recurrence()).serialized().edges
    monkeypatch.setattr(edge_search, "HELD_EDGES_GAIN", 0.5)  # they lower it by about 19 %
    dropped = Engine.build(unrolled_recurrence()).serialized().edges
    assert ("q2", "p2") in kept and ("q2", "p2") not in dropped
