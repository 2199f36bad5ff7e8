import pytest

from simulator import Graph, GraphError, categorized_order
from tests.simulator.builders import add, chain, diamond


def test_diamond_levels_and_distance() -> None:
    order = categorized_order(diamond())
    assert order.level == {"x": 0, "a": 1, "b": 2, "c": 2, "d": 3}
    assert order.ops == ("x", "a", "b", "c", "d")
    assert order.distance("a", "d") == 2
    assert order.level_ops(2) == ["b", "c"]
    assert order.n_levels == 4


def test_control_edges_count_as_dependencies() -> None:
    g = Graph()
    add(g, "a", [], 4)
    add(g, "b", [], 4, control=["a"])
    order = categorized_order(g)
    assert order.level["b"] == 1


def test_order_inside_a_level_follows_insertion() -> None:
    g = Graph()
    for name in ["z", "m", "a"]:
        add(g, name, [], 4)
    assert categorized_order(g).ops == ("z", "m", "a")


def test_cycle_is_reported() -> None:
    g = chain(2)
    g.ops["op1"].control_inputs.append("op2")
    g.control_consumers.setdefault("op2", []).append("op1")
    with pytest.raises(GraphError, match="cycle"):
        categorized_order(g)


def test_scheduled_order_follows_priorities_and_stays_topological() -> None:
    from simulator import scheduled_order

    g = diamond()
    order = scheduled_order(g, {"x": 0, "a": 1, "c": 2, "b": 3, "d": 4})
    assert order.ops == ("x", "a", "c", "b", "d")
    assert order.level == categorized_order(g).level


def test_unrecorded_ops_run_as_soon_as_ready() -> None:
    from simulator import scheduled_order

    g = diamond()
    # 'c' was fused away by TensorFlow: it inherits 'a''s priority and runs right after it
    order = scheduled_order(g, {"x": 0, "a": 1, "b": 5, "d": 9})
    assert order.ops == ("x", "a", "c", "b", "d")


def test_scheduled_order_never_breaks_an_edge() -> None:
    from simulator import scheduled_order

    g = diamond()
    order = scheduled_order(g, {"d": -5, "b": -4})  # priorities that contradict the edges
    for name in g.ops:
        assert all(order.position[p] < order.position[name] for p in g.predecessors(name))
