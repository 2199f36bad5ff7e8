import pytest
from hypothesis import given, settings

from simulator import Graph, Link, lower_bound_bytes
from simulator.bounds import time_bound_seconds
from tests.simulator.builders import random_graphs

LINK = Link(10.0, 10.0)  # 10 B/s each way: a swapped byte costs 0.1 s out and 0.1 s back


def test_a_step_within_its_budget_is_bounded_by_its_compute() -> None:
    assert time_bound_seconds(0.4, 0.6, 0, LINK) == 1.0
    assert time_bound_seconds(0.4, 0.6, -5, LINK, [(100, 1.0)]) == 1.0


def test_swapped_bytes_cross_the_link_out_before_the_peak_and_back_after_it() -> None:
    assert time_bound_seconds(0.5, 0.5, 10, LINK) == pytest.approx(2.0)  # 1 s each way
    assert time_bound_seconds(1.5, 1.5, 10, LINK) == pytest.approx(3.0)  # the copies hide
    # a peak early in the step: the copies out cannot hide behind the compute after it
    assert time_bound_seconds(0.2, 2.0, 10, LINK) == pytest.approx(3.0)


def test_recomputing_trades_compute_after_the_peak_for_transfers() -> None:
    # S swapped, 10 - S recomputed at 0.1 s/B: max(0.5, S/10) + max(1.5 - S/10, S/10),
    # least (1.5) for S in [5, 7.5]
    assert time_bound_seconds(0.5, 0.5, 10, LINK, [(10, 0.1)]) == pytest.approx(1.5)
    # at most the tiers' bytes: 2 recomputed, 8 swapped
    assert time_bound_seconds(0.5, 0.5, 10, LINK, [(2, 0.1)]) == pytest.approx(1.6)
    # free recomputes of everything leave the compute
    assert time_bound_seconds(0.5, 0.5, 10, LINK, [(10, 0.0)]) == pytest.approx(1.0)


def test_recomputes_are_taken_cheapest_first() -> None:
    # 2 B at 0.05 s/B, then 0.2 s/B: S/10 + 2.2 - S/5 falls until it meets S/10 at S = 22/3
    tiers = [(10, 0.2), (2, 0.05)]
    assert time_bound_seconds(0.5, 0.5, 10, LINK, tiers) == pytest.approx(22 / 15)
    # the same bytes at the costlier rate alone bound higher: S = 25/3
    assert time_bound_seconds(0.5, 0.5, 10, LINK, [(12, 0.2)]) == pytest.approx(5 / 3)
    # tiers beyond `over` are never taken
    assert time_bound_seconds(0.0, 0.0, 2, LINK, [(100, 0.0)]) == 0.0


def _bound_op_by_op(graph: Graph) -> int:
    """lower_bound_bytes as a loop over the ops (how it was first written)."""
    from simulator.heap import round_up

    resident = sum(round_up(t.nbytes) for t in graph.tensors.values() if t.kind.resident)
    best = 0
    for op in graph.ops.values():
        roots = {graph.buffer_root(n) for n in [*op.inputs, *op.outputs]}
        need = sum(
            round_up(graph.tensors[r].nbytes) for r in roots if graph.tensors[r].kind.on_device
        )
        out = graph.tensors[op.outputs[0]] if op.inplace and op.outputs else None
        if out is not None and graph.buffer_root(out.name) == out.name and out.kind.on_device:
            ins = [graph.tensors[graph.buffer_root(op.inputs[i])] for i in op.inplace]
            if round_up(out.nbytes) in [round_up(t.nbytes) for t in ins if t.kind.on_device]:
                need -= round_up(out.nbytes)
        best = max(best, need + round_up(op.scratch))
    return resident + best


@settings(max_examples=200, deadline=None)
@given(random_graphs())
def test_the_bound_from_index_arrays_is_the_op_by_op_bound(g: Graph) -> None:
    assert lower_bound_bytes(g) == _bound_op_by_op(g)
