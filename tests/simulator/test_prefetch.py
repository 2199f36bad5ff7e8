from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Graph, get_preset
from simulator.derive import PlanParams, check_plan
from simulator.engine import Engine
from tests.simulator.builders import held_gradient, read_twice, training_chain
from tests.simulator.test_swap_properties import params, training_graphs

JIT = PlanParams(ub=1, sync_out=True)


def _engine(g: Graph, bandwidth: float) -> Engine:
    slow = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=bandwidth)
    return Engine.build(g, device=slow, cost=dict.fromkeys(g.ops, 1.0))


def test_a_swap_in_with_room_is_triggered_early_enough_not_to_stall() -> None:
    engine = _engine(training_chain(), 1024.0)  # a tensor crosses the link in an op's time
    plain = engine.evaluate(JIT)
    early = engine.evaluate(replace(JIT, prefetch_bytes=1 << 30))
    triggers = {s.tensor: s.swap_ins[0].trigger for s in early.plan.swaps}
    assert {s.tensor: s.swap_ins[0].trigger for s in plain.plan.swaps} == {
        "f1:0": "gradient_tape/b2",
        "f2:0": "gradient_tape/b3",
    }
    assert triggers == {"f1:0": "gradient_tape/b3", "f2:0": "gradient_tape/b3"}
    assert early.step_seconds is not None and plain.step_seconds is not None
    assert early.step_seconds < plain.step_seconds
    check_plan(engine.graph, engine.order, early.plan)


def test_without_room_the_swap_ins_stay_where_they_were() -> None:
    engine = _engine(training_chain(), 1024.0)
    plain = engine.evaluate(JIT)
    live = plain.result.memory.trace.live_by_step(len(engine.order.ops), 0)
    at_b3 = int(live[engine.order.position["gradient_tape/b3"]])
    tight = engine.evaluate(replace(JIT, prefetch_bytes=at_b3 + 1024 - 1))  # f1 needs 1024 B
    assert tight.plan.swaps == plain.plan.swaps
    roomy = engine.evaluate(replace(JIT, prefetch_bytes=at_b3 + 1024))
    assert roomy.plan.swaps != plain.plan.swaps


def test_without_a_time_model_nothing_moves() -> None:
    engine = Engine.build(training_chain())
    plain = engine.evaluate(JIT)
    assert engine.evaluate(replace(JIT, prefetch_bytes=1 << 30)).plan.swaps == plain.plan.swaps


@settings(max_examples=150, deadline=None)
@given(training_graphs(), params, st.floats(1e2, 1e6), st.integers(1, 1 << 20))
def test_prefetched_plans_are_valid_and_only_ever_earlier(
    g: Graph, p: PlanParams, bw: float, limit: int
) -> None:
    engine = _engine(g, bw)
    plain = engine.evaluate(p).plan
    early = engine.evaluate(replace(p, prefetch_bytes=limit)).plan
    check_plan(g, engine.order, early)
    pos = engine.order.position
    assert [s.tensor for s in early.swaps] == [s.tensor for s in plain.swaps]
    for a, b in zip(plain.swaps, early.swaps):
        before = {c: s.trigger for s in a.swap_ins for c in s.consumers}
        after = {c: s.trigger for s in b.swap_ins for c in s.consumers}
        assert before.keys() == after.keys()  # every reader still reads a copy, made no later
        assert all(pos[after[c]] <= pos[before[c]] for c in before)
        if b != a:  # a swap prefetch moved holds no two copies at once
            _no_copies_live_at_once(b, pos)


def _no_copies_live_at_once(swap, pos) -> None:  # type: ignore[no-untyped-def]
    for x, y in zip(swap.swap_ins, swap.swap_ins[1:]):
        assert pos[y.trigger] > max(pos[c] for c in x.consumers)


def test_copies_of_one_tensor_live_at_once_are_merged() -> None:
    from simulator.derive import merge_overlapping
    from simulator.plan import Swap, SwapIn

    pos = {"t1": 1, "r1": 5, "t2": 4, "r2": 8, "t3": 9, "r3": 12}
    swap = Swap("x:0", 64, (SwapIn("t1", ("r1",)), SwapIn("t2", ("r2",)), SwapIn("t3", ("r3",))))
    merged = merge_overlapping(swap, pos)
    assert merged.swap_ins == (SwapIn("t1", ("r1", "r2")), SwapIn("t3", ("r3",)))
    assert merge_overlapping(merged, pos) is merged


def test_a_copy_is_kept_for_the_next_reader_where_the_memory_allows() -> None:
    engine = _engine(read_twice(), 1e9)  # a link so fast that no copy needs moving
    jit = replace(JIT, groupby=0)
    plain = engine.evaluate(jit)
    f1 = next(s for s in plain.plan.swaps if s.tensor == "f1:0")
    assert [i.consumers for i in f1.swap_ins] == [("gradient_tape/b2",), ("gradient_tape/b0",)]
    live = plain.result.memory.trace.live_by_step(len(engine.order.ops), 0)
    pos = engine.order.position
    # kept, the first copy also holds its bytes after b2 until the second copy's trigger
    held = int(live[pos["gradient_tape/b2"] + 1 : pos[f1.swap_ins[1].trigger]].max())
    for limit, copies in ((held + 1024, 1), (held + 1023, 2)):
        kept = engine.evaluate(replace(jit, prefetch_bytes=limit)).plan
        (swap,) = [s for s in kept.swaps if s.tensor == "f1:0"]
        assert len(swap.swap_ins) == copies
        readers = {c for i in swap.swap_ins for c in i.consumers}
        assert readers == {"gradient_tape/b2", "gradient_tape/b0"}


def test_copies_of_tensors_the_backward_pass_makes_are_not_moved() -> None:
    engine = _engine(held_gradient(), 1024.0)  # slow: every copy would be moved if it could
    jit = replace(JIT, backward_swaps=True)
    plain = engine.evaluate(jit).plan
    early = engine.evaluate(replace(jit, prefetch_bytes=1 << 30)).plan
    triggers = [{s.tensor: s.swap_ins[0].trigger for s in p.swaps} for p in (plain, early)]
    assert triggers[0]["gradient_tape/gw:0"] == triggers[1]["gradient_tape/gw:0"]
    assert any(triggers[0][t] != triggers[1][t] for t in triggers[0] if t.startswith("f"))


def test_a_synchronized_swap_out_is_waited_for_where_its_copy_ends() -> None:
    engine = _engine(training_chain(), 1024.0)  # a copy takes an op's time
    plain = engine.evaluate(JIT)
    late = engine.evaluate(replace(JIT, prefetch_bytes=1 << 30))
    assert all(not s.waiter for s in plain.plan.swaps)
    waiters = {s.tensor: s.waiter for s in late.plan.swaps}
    assert waiters["f1:0"] and waiters["f1:0"] not in engine.graph.tensors["f1:0"].consumers
    check_plan(engine.graph, engine.order, late.plan)
    stalls = [e.result.time.stalls for e in (plain, late)]
    forward = [sum(s for k, s in st.items() if k < engine.order.position["gradient_tape/b3"])
               for st in stalls]  # fmt: skip
    assert forward[1] < forward[0]
    kept = engine.evaluate(replace(JIT, prefetch_bytes=1 << 30, postpone_waits=False))
    assert all(not s.waiter for s in kept.plan.swaps)


@settings(max_examples=150, deadline=None)
@given(training_graphs(), params, st.floats(1e2, 1e6), st.integers(1, 1 << 20))
def test_postponed_waits_keep_the_live_bytes_within_the_limit_or_the_plans_own_peak(
    g: Graph, p: PlanParams, bw: float, limit: int
) -> None:
    from simulator.prefetch import postpone_waits
    from simulator.run import simulate_plan

    engine = _engine(g, bw)
    plan = engine.evaluate(replace(p, sync_out=True, sync_lag=0, prefetch_bytes=0)).plan
    link, timeline = engine.device.link, engine.timeline  # type: ignore[union-attr]

    def live(plan):  # type: ignore[no-untyped-def]
        m = simulate_plan(engine.program, g, plan, timeline=timeline, link=link).memory
        return m.trace.live_by_step(len(engine.order.ops), m.persistent_bytes)

    before = live(plan)
    after, counted = postpone_waits(g, timeline, plan, before, limit, link, engine.context.backward)
    check_plan(g, engine.order, after)
    assert int(live(after).max()) <= max(limit, int(before.max()))
    # the count holds each device copy to its waiter: a waiter derivation already set (a
    # swap-out no forward op reads) may hold it longer than the simulation, which frees it
    # when its copy ends
    held = sum(s.nbytes for s in plan.swaps if s.waiter)
    assert int(counted.max()) <= max(limit, int(before.max()) + held)
    assert (counted >= before).all()


def test_trigger_levels_give_a_level_only_to_ops_that_may_trigger() -> None:
    """A placeholder, and an op Grappler rewrites, may not trigger a copy: their steps get a
    level past every other, the others their own."""
    from simulator.prefetch import trigger_levels

    g = training_chain()
    g.rewritten = frozenset({"f2"})
    engine = _engine(g, 1024.0)
    order = engine.order
    got = dict(zip(order.ops, trigger_levels(g, order)))
    assert got["x"] == got["f2"] == order.n_levels
    assert all(got[op] == order.level[op] for op in order.ops if op not in ("x", "f2"))
    assert engine.trigger_levels == trigger_levels(g, order)
