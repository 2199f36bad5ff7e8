import json
from dataclasses import replace

import pytest

from simulator import (
    BFCModel,
    Graph,
    InvalidPlan,
    Link,
    Swap,
    SwapIn,
    SwapPlan,
    TensorKind,
    Timeline,
    compile_program,
    simulate_memory,
    simulate_plan,
)
from simulator.derive import PlanContext, PlanParams, derive_plan
from tests.simulator.builders import add, held_gradient, training_chain, unet_skip


def plan_for(g, **params):  # type: ignore[no-untyped-def]
    return derive_plan(PlanContext.build(g), PlanParams(**params))


def events(result):  # type: ignore[no-untyped-def]
    return [
        (e.kind.name, e.step, e.tensor, e.live_bytes, e.host_bytes) for e in result.memory.trace
    ]


def test_chain_event_sequence_with_the_default_plan() -> None:
    g = training_chain()
    plan = plan_for(g)
    assert [(s.tensor, [(i.trigger, i.consumers) for i in s.swap_ins]) for s in plan.swaps] == [
        ("f1:0", [("gradient_tape/b2", ("gradient_tape/b1",))]),
        ("f2:0", [("gradient_tape/b3", ("gradient_tape/b2",))]),
    ]
    r = simulate_plan(compile_program(g), g, plan)
    assert events(r) == [
        ("ALLOC", 1, "f1:0", 2048, 0),
        ("SWAP_OUT", 1, "f1:0", 2048, 1024),
        ("ALLOC", 2, "f2:0", 3072, 1024),
        ("SWAP_OUT", 2, "f2:0", 3072, 2048),
        ("FREE", 2, "f1:0", 2048, 2048),
        ("ALLOC", 3, "f3:0", 3072, 2048),
        ("FREE", 3, "f2:0", 2048, 2048),
        ("ALLOC", 4, "gradient_tape/b3:0", 3072, 2048),
        # a swap-in starts once its trigger has finished: after the trigger's dead inputs go
        ("FREE", 4, "f3:0", 2048, 2048),
        ("SWAP_IN", 4, "f2:0@in0", 3072, 2048),
        ("HOST_FREE", 4, "f2:0", 3072, 1024),
        ("ALLOC", 5, "gradient_tape/b2:0", 4096, 1024),
        ("FREE", 5, "gradient_tape/b3:0", 3072, 1024),
        ("FREE", 5, "f2:0@in0", 2048, 1024),
        ("SWAP_IN", 5, "f1:0@in0", 3072, 1024),
        ("HOST_FREE", 5, "f1:0", 3072, 0),
        ("ALLOC", 6, "gradient_tape/b1:0", 4096, 0),
        ("FREE", 6, "gradient_tape/b2:0", 3072, 0),
        ("FREE", 6, "f1:0@in0", 2048, 0),
        ("FREE", 7, "gradient_tape/b1:0", 1024, 0),
    ]
    assert (r.peak_bytes, r.host_peak_bytes) == (4096, 2048)


def test_swapping_a_long_lived_activation_lowers_the_peak() -> None:
    g = training_chain((1 << 20, 1 << 20, 1 << 20))
    base = simulate_memory(compile_program(g)).peak_bytes
    r = simulate_plan(compile_program(g), g, plan_for(g, n_tensors=1))
    assert r.peak_bytes < base
    # f1's copy comes back after its trigger freed what it read: the whole 1 MiB is saved
    assert r.memory.live_peak_bytes == base - (1 << 20)


def test_n_tensors_zero_reproduces_the_no_swap_simulation() -> None:
    for g in (training_chain(), unet_skip()):
        program = compile_program(g)
        plan = plan_for(g, n_tensors=0)
        assert plan.swaps == ()
        assert (
            simulate_plan(program, g, plan).memory.trace.rows == simulate_memory(program).trace.rows
        )


def test_unet_skip_swaps_the_skip_and_keeps_its_forward_reader() -> None:
    g = unet_skip()
    plan = plan_for(g, n_tensors=1)
    (swap,) = plan.swaps
    assert swap.tensor == "e1:0" and swap.rerouted == {"gradient_tape/e1_conv"}
    r = simulate_plan(compile_program(g), g, plan)
    free_e1 = next(e for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "e1:0")
    assert free_e1.op == "cat"  # the forward concat still reads the device copy


def test_groupby_fuses_swap_ins_of_close_readers() -> None:
    g = unet_skip()
    # e2 is read by d2 (forward) and gradient_tape/d2; e1 by one backward op: one swap-in each
    assert all(len(s.swap_ins) == 1 for s in plan_for(g, groupby=10).swaps)


def test_plan_reading_a_tensor_on_the_host_is_rejected() -> None:
    g = training_chain()
    bad = SwapPlan((Swap("f1:0", 1024, (SwapIn("gradient_tape/b1", ("gradient_tape/b1",)),)),))
    with pytest.raises(InvalidPlan, match="only on the host"):
        simulate_plan(compile_program(g), g, bad)


def test_swap_in_before_the_swap_out_is_rejected() -> None:
    g = training_chain()
    bad = SwapPlan((Swap("f2:0", 1024, (SwapIn("f1", ("gradient_tape/b2",)),)),))
    with pytest.raises(InvalidPlan, match="before the tensor was produced"):
        simulate_plan(compile_program(g), g, bad)


@pytest.mark.parametrize(
    "swap,needle",
    [
        (Swap("nope:0", 4, ()), "not in the graph"),
        (Swap("x:0", 4, ()), "resident"),
        (Swap("f1:0", 4, (SwapIn("nope", ("gradient_tape/b1",)),)), "trigger op 'nope'"),
        (Swap("f1:0", 4, (SwapIn("f2", ("gradient_tape/b3",)),)), "do not read"),
    ],
)
def test_plans_naming_missing_things_are_rejected(swap: Swap, needle: str) -> None:
    g = training_chain()
    with pytest.raises(InvalidPlan, match=needle):
        simulate_plan(compile_program(g), g, SwapPlan((swap,)))


def test_late_swap_in_stalls_its_reader_by_the_transfer_time() -> None:
    g = training_chain()
    timeline = Timeline.build(compile_program(g).order, {n: 1.0 for n in g.ops})
    link = Link(d2h=1024.0, h2d=256.0)  # 1 s out, 4 s back for 1 KiB
    r = simulate_plan(compile_program(g), g, plan_for(g), timeline=timeline, link=link)
    assert r.time is not None
    # f2's swap-in starts when b3 ends (t=5) and takes 4 s; b2 would start at t=5 -> stalls 4 s
    assert r.time.stalls[5] == pytest.approx(4.0)
    # f1's swap-in is triggered by b2 (ends t=10), arrives t=14; b1 would start at 10 -> 4 s
    assert r.time.stalls[6] == pytest.approx(4.0)
    assert r.time.baseline_seconds == pytest.approx(7.0)
    assert r.time.step_seconds == pytest.approx(15.0)
    assert r.time.overhead == pytest.approx(15 / 7)


def test_slow_swap_out_keeps_the_device_copy_until_it_is_done() -> None:
    g = training_chain()
    timeline = Timeline.build(compile_program(g).order, {n: 1.0 for n in g.ops})
    fast = simulate_plan(compile_program(g), g, plan_for(g), timeline=timeline, link=Link(1e9, 1e9))
    slow = simulate_plan(
        compile_program(g), g, plan_for(g), timeline=timeline, link=Link(1024 / 3.5, 1e9)
    )
    fast_free, slow_free = (
        next(e.step for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "f1:0")
        for r in (fast, slow)
    )
    assert fast_free == 2
    assert slow_free == 5  # f1 leaves at t=2, its copy ends at t=5.5: during step 5


def test_allocator_peak_applies_to_plans() -> None:
    # f1 (1.5 MiB) lands in a fresh 2 MiB region, which BFC does not split (the rest is less
    # than the request): it holds all 2 MiB, so the allocator's peak exceeds the live bytes
    # (1.5 MiB and two 1 KiB tensors)
    g = training_chain((3 << 19, 1024, 1024))
    plan = plan_for(g)
    live = simulate_plan(compile_program(g), g, plan)
    r = simulate_plan(compile_program(g), g, plan, allocator=BFCModel())
    assert live.peak_bytes == live.memory.live_peak_bytes == r.memory.live_peak_bytes
    assert r.memory.live_peak_bytes < r.peak_bytes == (2 << 20) + 1024  # + the resident input


def test_diamond_event_sequence_with_one_fused_swap_in() -> None:
    from tests.simulator.builders import training_diamond

    g = training_diamond()
    plan = plan_for(g, n_tensors=1, groupby=1)
    assert [(s.tensor, [(i.trigger, i.consumers) for i in s.swap_ins]) for s in plan.swaps] == [
        ("a:0", [("gradient_tape/d", ("gradient_tape/b", "gradient_tape/c"))])
    ]
    r = simulate_plan(compile_program(g), g, plan)
    assert events(r) == [
        ("ALLOC", 1, "a:0", 4352, 0),
        ("SWAP_OUT", 1, "a:0", 4352, 4096),
        ("ALLOC", 2, "b:0", 5376, 4096),
        ("ALLOC", 3, "c:0", 6400, 4096),
        ("FREE", 3, "a:0", 2304, 4096),
        ("ALLOC", 4, "d:0", 2560, 4096),
        ("ALLOC", 5, "gradient_tape/d:0", 3072, 4096),
        ("FREE", 5, "d:0", 2816, 4096),
        ("SWAP_IN", 5, "a:0@in0", 6912, 4096),
        ("HOST_FREE", 5, "a:0", 6912, 0),
        ("ALLOC", 6, "gradient_tape/b:0", 7424, 0),
        ("FREE", 6, "b:0", 6400, 0),  # buffers die in the order they were made
        ("FREE", 6, "gradient_tape/d:0", 5888, 0),
        ("ALLOC", 7, "gradient_tape/c:0", 6400, 0),
        ("FREE", 7, "c:0", 5376, 0),
        ("FREE", 7, "a:0@in0", 1280, 0),
        ("FREE", 7, "gradient_tape/b:0", 768, 0),
        ("FREE", 8, "gradient_tape/c:0", 256, 0),
    ]
    assert r.peak_bytes == 7424 and r.memory.peak_op == "gradient_tape/b"


def test_synchronized_swap_out_holds_forward_readers_until_the_copy_is_done() -> None:
    g = training_chain()
    timeline = Timeline.build(compile_program(g).order, {n: 1.0 for n in g.ops})
    link = Link(1024 / 3.5, 1e9)  # 3.5 s to copy 1 KiB out
    plan = plan_for(g, sync_out=True)
    assert all(s.sync for s in plan.swaps)
    r = simulate_plan(compile_program(g), g, plan, timeline=timeline, link=link)
    assert r.time is not None
    # f1 ends at t=2, its copy at t=5.5: f2 (step 2) waits 3.5 s, and so does f3 for f2's copy
    assert r.time.stalls[2] == pytest.approx(3.5)
    assert r.time.stalls[3] == pytest.approx(3.5)
    f1_free = next(e.step for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "f1:0")
    assert f1_free == 2  # freed when f2 ends; unsynchronized it lingers to step 5


def test_a_lagged_swap_out_holds_only_its_waiter_and_the_forward_pass_runs_ahead() -> None:
    g = training_chain()
    program = compile_program(g)
    timeline = Timeline.build(program.order, {n: 1.0 for n in g.ops})
    link = Link(1024 / 3.5, 1e9)  # 3.5 s to copy 1 KiB out
    plan = plan_for(g, sync_out=True, sync_lag=2)
    assert [(s.tensor, s.waiter) for s in plan.swaps] == [
        ("f1:0", "f3"),
        ("f2:0", "gradient_tape/b3"),
    ]
    r = simulate_plan(program, g, plan, timeline=timeline, link=link)
    assert r.time is not None
    # f1's copy ends at t=5.5: f2 runs on (t=2..3), f3 waits 2.5 s; f2's copy queues behind
    # it (5.5..9), and b3 waits for it from t=6.5 (the swap-ins back take 1 us each)
    waits = {step: s for step, s in r.time.stalls.items() if s > 1e-3}
    assert waits == pytest.approx({3: 2.5, 4: 2.5})
    readers = simulate_plan(program, g, plan_for(g, sync_out=True), timeline=timeline, link=link)
    assert readers.time is not None and r.time.step_seconds < readers.time.step_seconds
    f1_free = next(e.step for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "f1:0")
    assert f1_free == 3  # the copy is done before its waiter f3 runs


@pytest.mark.parametrize(
    ("waiter", "needle"),
    [("nope", "missing"), ("x", "not after its producer"), ("f1", "not after its producer")],
)
def test_a_waiter_that_is_missing_or_not_after_the_producer_is_rejected(
    waiter: str, needle: str
) -> None:
    from simulator.derive import check_plan
    from simulator.order import categorized_order

    g = training_chain()
    plan = plan_for(g, sync_out=True, sync_lag=2)
    bad = replace(plan, swaps=(replace(plan.swaps[0], waiter=waiter), *plan.swaps[1:]))
    with pytest.raises(InvalidPlan, match=needle):
        check_plan(g, categorized_order(g), bad)


def test_a_lag_past_the_last_level_falls_back_to_the_readers() -> None:
    plan = plan_for(training_chain(), sync_out=True, sync_lag=100)
    assert all(s.sync and not s.waiter for s in plan.swaps)


def test_sync_survives_the_plan_round_trip() -> None:
    g = training_chain()
    for plan in (plan_for(g, sync_out=True), plan_for(g, sync_out=True, sync_lag=2)):
        assert SwapPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_order_edges_survive_the_plan_round_trip() -> None:
    plan = replace(plan_for(training_chain()), order_edges=(("f3", "gradient_tape/b2"),))
    back = SwapPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.order_edges == (("f3", "gradient_tape/b2"),)


def test_a_copy_that_ends_where_the_walk_has_nothing_else_to_do_frees_there() -> None:
    """f2 and f3 make no bytes, so the walk has no work at their steps; the device copy of f1
    still leaves at f2's step, where its copy to the host ends (t=2.5)."""
    g = training_chain((1024, 0, 0))
    program = compile_program(g)
    assert 2 not in program.visits
    timeline = Timeline.build(program.order, {n: 1.0 for n in g.ops})
    r = simulate_plan(program, g, plan_for(g), timeline=timeline, link=Link(1024 / 0.5, 1e9))
    frees = [e.step for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "f1:0"]
    assert frees == [2]


def test_a_swapped_in_copy_last_read_where_the_walk_has_nothing_else_to_do_is_freed_there() -> None:
    """r1 reads f1 in the backward pass, has no outputs and is the last reader of nothing (b1
    reads f1 later): the walk has no work at its step but the copy swapped in for it."""
    g = training_chain()
    add(g, "gradient_tape/r1", ["f1:0"], [], control=["gradient_tape/b3"])
    program = compile_program(g)
    r1 = program.order.position["gradient_tape/r1"]
    assert r1 not in program.visits
    swap_ins = (
        SwapIn("gradient_tape/b3", ("gradient_tape/r1",)),
        SwapIn("gradient_tape/b2", ("gradient_tape/b1",)),
    )
    r = simulate_plan(program, g, SwapPlan((Swap("f1:0", 1024, swap_ins),)))
    frees = [e.step for e in r.memory.trace if e.kind.name == "FREE" and e.tensor == "f1:0@in0"]
    assert frees == [r1]


def test_backward_swaps_swap_a_gradient_held_for_the_optimizer() -> None:
    g = held_gradient()
    ctx = PlanContext.build(g)
    late = [c.tensor for c in ctx.candidates if c.made_in_backward]
    assert late == ["gradient_tape/gw:0"] and ctx.candidates[-1].tensor == late[0]
    original = derive_plan(ctx, PlanParams(ub=1))  # the original tool's: forward tensors only
    assert "gradient_tape/gw:0" not in {s.tensor for s in original.swaps}
    plan = derive_plan(ctx, PlanParams(ub=1, backward_swaps=True))
    (gw,) = [s for s in plan.swaps if s.tensor == "gradient_tape/gw:0"]
    assert gw.rerouted == {"sgd/update"}  # every reader reads the copy
    program = compile_program(g)
    before, after = (simulate_plan(program, g, p).memory for p in (original, plan))
    assert before.peak_op == "gradient_tape/b0" and after.peak_op == "sgd/update"
    assert after.peak_bytes < before.peak_bytes
    # `n_tensors` reaches it only after every forward candidate
    capped = PlanParams(n_tensors=len(original.swaps), ub=1, backward_swaps=True)
    assert derive_plan(ctx, capped).swaps == original.swaps


def test_a_backward_tensor_read_at_the_next_level_is_no_candidate() -> None:
    ctx = PlanContext.build(training_chain())
    assert not any(c.made_in_backward for c in ctx.candidates)


def _product_of_a_swapped_input(regrouped: bool):  # type: ignore[no-untyped-def]
    """f (4 KiB) is swapped out and in for m = g * f, which may take over either input's
    buffer; `regrouped`: Grappler regroups m (`Graph.rewritten`)."""
    from simulator.graph import Graph, TensorKind

    g = Graph("product")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    f = add(g, "f", x, 4096)
    h = add(g, "h", f, 256)
    grad = add(g, "gradient_tape/g", h, 4096)
    m = add(g, "gradient_tape/m", grad + f, 4096, type="Mul", inplace=(0, 1))
    g.mark_outputs(add(g, "gradient_tape/s", grad + m, 256))
    if regrouped:
        g.rewritten = frozenset({"gradient_tape/m"})
    swap = Swap("f:0", 4096, (SwapIn("gradient_tape/g", ("gradient_tape/m",)),))
    return g, SwapPlan((swap,))


def test_a_regrouped_product_takes_over_no_swapped_in_buffer() -> None:
    # Grappler regroups a product of a swap-in otherwise than the captured one (GELU's
    # backward: erfc * 0.5 without swaps, 0.5 * grad once erfc is swapped in)
    peaks = {}
    for regrouped in (False, True):
        g, plan = _product_of_a_swapped_input(regrouped)
        peaks[regrouped] = simulate_plan(compile_program(g), g, plan).memory.peak_bytes
    # x, the gradient (read again after m) and the swap-in, whose buffer m takes over
    assert peaks[False] == 256 + 4096 + 4096 + 256  # and s at the end
    assert peaks[True] == 256 + 3 * 4096  # m's own buffer beside them


def test_a_synchronized_swap_out_that_no_forward_op_reads_is_waited_for_by_the_next_op() -> None:
    """A forward tensor only the backward pass reads (a gradient's helper made early, as
    Grappler makes swish's) has no reader to wait for its copy: the next level's op does, so
    the copy cannot still hold device memory when a large op runs after."""
    g = Graph("helper")
    x = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    f1 = add(g, "f1", x, 1024)
    h = add(g, "h", f1, 4096)  # read by the backward pass alone
    g1 = add(g, "g1", f1, 1024)
    g2 = add(g, "g2", g1, 1024)
    big = add(g, "big", g2, 8192)
    b2 = add(g, "gradient_tape/b2", big, 1024)
    b1 = add(g, "gradient_tape/b1", b2 + h, 1024)
    g.mark_outputs(add(g, "gradient_tape/b0", b1 + f1, 1024))
    program = compile_program(g)
    timeline = Timeline.build(program.order, {n: 1.0 for n in g.ops})
    link = Link(4096 / 3.5, 1e9)  # 3.5 s to copy h out
    plan = plan_for(g, sync_out=True, n_tensors=-1, threshold=2)
    waiter = {s.tensor: s.waiter for s in plan.swaps}["h:0"]
    assert program.order.level[waiter] == program.order.level["h"] + 1
    timed = simulate_plan(program, g, plan, timeline=timeline, link=link)
    instant = simulate_plan(program, g, plan)
    assert timed.time is not None and timed.time.stalls[program.order.position[waiter]] > 0
    assert timed.peak_bytes == instant.peak_bytes


def test_a_synchronized_swap_of_the_backward_pass_is_not_waited_for() -> None:
    """A gradient that only the optimizer reads (`gw`, made by the backward pass) is copied
    out while the backward pass goes on: the refinement of backward swaps times those copies
    (`refine.prefetched`), and a wait at the next op would stall the backward pass."""
    g = held_gradient()
    plan = plan_for(g, sync_out=True, n_tensors=-1, threshold=2, backward_swaps=True)
    waiters = {s.tensor: s.waiter for s in plan.swaps}
    assert waiters["gradient_tape/gw:0"] == ""


def test_serial_loops_survive_the_plan_round_trip() -> None:
    plan = replace(plan_for(training_chain()), serial_loops=("f2",))
    back = SwapPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.serial_loops == ("f2",)
