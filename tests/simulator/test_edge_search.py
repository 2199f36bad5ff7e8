import pytest

import simulator.edge_search as edge_search
from simulator import Graph, TensorKind, categorized_order, get_preset
from simulator.derive import LEAST_MEMORY, PlanParams
from simulator.engine import Engine
from simulator.writes import write_edges
from tests.simulator.builders import (
    add,
    gradient_held_past_a_peak,
    unrolled_recurrence,
    weight_decay_step,
)


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
    monkeypatch.setattr(edge_search, "EDGES_GAIN", 0.5)  # they lower it by about 19 %
    dropped = Engine.build(unrolled_recurrence()).serialized().edges
    assert ("q2", "p2") in kept and ("q2", "p2") not in dropped


def test_a_weight_decay_waits_for_the_backward_read_of_the_weight() -> None:
    """Run in the forward pass, the decay writes the weight while the backward pass is still
    to read the value read before it: TensorFlow copies the weight (the allocator's peak is
    above the live one by it). Deferred past that read, with the product it subtracts, it
    writes in place: no copy, and the product is not held meanwhile."""
    engine = Engine.build(weight_decay_step(), device=get_preset("v100-16gb-nvlink2"))
    least = PlanParams(n_tensors=0)
    before = engine.evaluate(least)
    assert before.peak_bytes - before.result.memory.live_peak_bytes == 256 << 10  # the copy
    serial = engine.serialized()
    deferred = {("gradient_tape/grad_x", op) for op in ("decay_write", "wd_mul", "decay")}
    assert deferred <= set(serial.edges)
    after = serial.evaluate(least)
    assert after.peak_bytes == after.result.memory.live_peak_bytes
    assert before.peak_bytes - after.peak_bytes == 256 << 10


def test_write_edges_are_kept_only_where_they_lower_the_peak() -> None:
    # with small logits the peak is the backward pass's, which the deferred decay joins
    g = weight_decay_step(logits=1)
    serial = Engine.build(g, device=get_preset("v100-16gb-nvlink2")).serialized()
    assert not any(after == "decay_write" for _, after in serial.edges)


def test_writes_whose_readers_wait_for_each_other_are_not_deferred() -> None:
    # c1 reads v1's old value after v2's write, c2 v2's after v1's: each write may wait for
    # its reader alone, not both (a cycle)
    g = Graph("crossed_writes")
    for k in "12":
        v = add(g, f"v{k}", [], 1024, type="VarHandleOp", kind=TensorKind.VARIABLE)
        add(g, f"r{k}", v, 1024, type="ReadVariableOp", forwards={0: 0})
        add(g, f"w{k}", v, [], type="AssignAddVariableOp", assigns="update", control=[f"r{k}"])
    c1 = add(g, "c1", ["r1:0"], 256, control=["w2"])
    c2 = add(g, "c2", ["r2:0"], 256, control=["w1"])
    g.mark_outputs(c1 + c2)
    order = categorized_order(g)
    assert set(write_edges(g, order)) == {("c1", "w1"), ("c2", "w2")}
    assert edge_search._deferred_writes(g, order) == ()


def test_the_deferrals_made_with_the_writes_wait_for_the_writes_readers_only() -> None:
    # a dropout's random numbers, made from its seed state alone, are regrouped (no edge
    # may end there): deferred past them, its read of the seed state would wait for the
    # layer, which is not a write's reader; that edge changed a mirrored step's loss
    g = weight_decay_step()
    state = add(g, "state", [], 8, type="VarHandleOp", kind=TensorKind.VARIABLE)
    seed = add(g, "seed", state, 8, type="ReadVariableOp")
    mask = add(g, "random", seed, 64 << 10, type="Mul")
    g.mark_outputs(add(g, "dropped", mask + g.ops["b"].outputs, 64 << 10))
    g.rewritten = frozenset({"wd_mul", "random"})
    edges = edge_search._deferred_writes(g, categorized_order(g))
    assert ("gradient_tape/grad_x", "read2") in edges
    assert {a for a, _ in edges} == {"gradient_tape/grad_x"}


def test_edges_are_searched_again_for_the_plan_that_swaps_backward_tensors_too() -> None:
    """Without backward swaps the held gradient makes the peak at u1, where no edge helps;
    swapped, the peak is the two branches' gradients, which one after the other lower."""
    engine = Engine.build(gradient_held_past_a_peak())
    forward = engine.evaluate(edge_search.FORWARD_SWAPS).result.memory
    assert forward.peak_op == "gradient_tape/u1"
    assert engine.evaluate(LEAST_MEMORY).result.memory.peak_op in {
        "gradient_tape/a3", "gradient_tape/b3"
    }  # fmt: skip
    serial = engine.serialized()
    assert set(serial.edges) & {("gradient_tape/a3", "gradient_tape/b1"),
                                ("gradient_tape/b3", "gradient_tape/a1")}  # fmt: skip
    assert serial.evaluate(LEAST_MEMORY).peak_bytes < engine.evaluate(LEAST_MEMORY).peak_bytes
