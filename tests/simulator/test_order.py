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
