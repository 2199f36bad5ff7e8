"""Write edges (`simulator.writes`): a variable's write waits for the readers of its old
value, and never closes a cycle."""

from simulator import categorized_order
from simulator.writes import write_edges
from tests.simulator.builders import add, weight_decay_step


def test_a_variable_write_waits_for_the_readers_of_what_was_read_before_it() -> None:
    g = weight_decay_step()
    order = categorized_order(g)
    assert order.position["decay_write"] < order.position["gradient_tape/grad_x"]
    assert write_edges(g, order) == (("gradient_tape/grad_x", "decay_write"),)
    # a later reader that needs the write itself keeps its place: no cycle
    add(g, "after_write", g.ops["read"].outputs, 256, control=["decay_write"])
    order = categorized_order(g)
    assert "after_write" not in {a for a, _ in write_edges(g, order)}
    categorized_order(g.with_control_edges(write_edges(g, order)))  # acyclic
