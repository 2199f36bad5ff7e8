"""Recompute: a tensor freed after its forward readers and made again for the backward pass."""

from dataclasses import replace
from typing import Any

import pytest

from simulator import (
    EventKind,
    Graph,
    InvalidPlan,
    Link,
    Recompute,
    Swap,
    SwapIn,
    SwapPlan,
    TensorKind,
    Timeline,
    compile_program,
    simulate_plan,
)
from simulator.derive import PlanContext, PlanParams, RecomputePrice, check_plan, derive_plan
from simulator.opsemantics import RECOMPUTABLE, RECOMPUTABLE_HEAVY
from tests.simulator.builders import add

MIB = 1 << 20


def _block() -> Graph:
    """x -> a (big, read again late in the backward pass) -> r = Relu(a) -> f; the loss
    gradient (6 MiB) is made between r's forward and backward readers; the backward reads r
    first (b1), then a (b3): r's copy can be made from a, which is held anyway."""
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4 * MIB, type="Conv2D")
    r = add(g, "relu", a, 4 * MIB, type="Relu")
    f = add(g, "f", r, 256)
    seed = add(g, "gradient_tape/seed", f, 6 * MIB)
    b0 = add(g, "gradient_tape/b0", seed, 2 * MIB)
    b1 = add(g, "gradient_tape/b1", b0 + r, 256)
    b2 = add(g, "gradient_tape/b2", b1, 256)
    b3 = add(g, "gradient_tape/b3", b2 + a, 256)
    g.mark_outputs(b3)
    return g


def _plan() -> SwapPlan:
    rc = Recompute("relu:0", 4 * MIB, ("relu",), "gradient_tape/b0", ("gradient_tape/b1",))
    return SwapPlan(recomputes=(rc,))


def test_a_recompute_frees_its_tensor_through_the_forward_gap() -> None:
    g = _block()
    program = compile_program(g)
    plain = simulate_plan(program, g, SwapPlan()).memory
    planned = simulate_plan(program, g, _plan()).memory
    # without: a, relu, seed and b0 live at b0; with: relu is made again once seed is gone
    assert plain.live_peak_bytes - planned.live_peak_bytes == 4 * MIB
    made = [e for e in planned.trace if e.kind is EventKind.RECOMPUTE]
    assert [(e.tensor, e.step, e.nbytes) for e in made] == [
        ("relu:0@re", program.order.position["gradient_tape/b0"], 4 * MIB)
    ]
    freed = {e.tensor: e.step for e in planned.trace if e.kind is EventKind.FREE}
    assert freed["relu:0"] == program.order.position["f"]
    assert freed["relu:0@re"] == program.order.position["gradient_tape/b1"]


def test_the_time_model_adds_the_rerun_ops_cost_once() -> None:
    g = _block()
    order = PlanContext.build(g).order
    cost = {n: 1.0 for n in g.ops}
    cost["relu"] = 0.25
    timeline = Timeline.build(order, cost)
    r = simulate_plan(compile_program(g), g, _plan(), timeline=timeline, link=Link(1e9, 1e9))
    assert r.time is not None
    assert r.time.recompute_seconds == 0.25
    assert r.time.step_seconds == timeline.baseline_seconds + 0.25


def test_a_chain_frees_its_intermediates_once_it_has_run() -> None:
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, MIB, type="Conv2D")
    m = add(g, "mul", a, MIB, type="Mul")
    r = add(g, "relu", m, MIB, type="Relu")
    seed = add(g, "gradient_tape/seed", r, 256)
    b0 = add(g, "gradient_tape/b0", seed, 256)
    b1 = add(g, "gradient_tape/b1", b0 + r + a, 256)
    g.mark_outputs(b1)
    rc = Recompute("relu:0", MIB, ("mul", "relu"), "gradient_tape/b0", ("gradient_tape/b1",))
    r_ = simulate_plan(compile_program(g), g, SwapPlan(recomputes=(rc,))).memory
    rows = [(e.kind, e.tensor) for e in r_.trace if e.step == r_.order.position["gradient_tape/b0"]]
    assert (EventKind.RECOMPUTE, "mul:0@re") in rows and (EventKind.FREE, "mul:0@re") in rows
    assert (EventKind.RECOMPUTE, "relu:0@re") in rows and (EventKind.FREE, "relu:0@re") not in rows


def test_an_element_wise_chain_writes_into_its_own_intermediates() -> None:
    # mul and relu may each take over their input's buffer: a chain of three element-wise
    # ops re-runs in one buffer, as TensorFlow's kernels run it
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, MIB, type="Conv2D")
    m = add(g, "mul", a, MIB, type="Mul")
    s = add(g, "add", m, MIB, type="AddV2", inplace=(0,))
    r = add(g, "relu", s, MIB, type="Relu", inplace=(0,))
    seed = add(g, "gradient_tape/seed", r, 256)
    b0 = add(g, "gradient_tape/b0", seed, 256)
    b1 = add(g, "gradient_tape/b1", b0 + r + a, 256)
    g.mark_outputs(b1)
    ops = ("mul", "add", "relu")
    rc = Recompute("relu:0", MIB, ops, "gradient_tape/b0", ("gradient_tape/b1",))
    result = simulate_plan(compile_program(g), g, SwapPlan(recomputes=(rc,))).memory
    at = result.order.position["gradient_tape/b0"]
    rows = [(e.kind, e.tensor, e.nbytes) for e in result.trace if e.step == at]
    made = [row for row in rows if row[1].endswith("@re")]
    assert made == [(EventKind.RECOMPUTE, "mul:0@re", MIB)]  # add and relu wrote into it
    freed = {e.tensor: e.step for e in result.trace if e.kind is EventKind.FREE}
    assert freed["mul:0@re"] == result.order.position["gradient_tape/b1"]


def test_plans_round_trip_with_their_recomputes() -> None:
    plan = _plan()
    again = SwapPlan.from_dict(plan.to_dict())
    assert again == plan and again.recomputed_bytes == 4 * MIB


def test_a_tensor_is_not_swapped_and_recomputed() -> None:
    g = _block()
    swap = Swap("relu:0", 4 * MIB, (SwapIn("gradient_tape/b0", ("gradient_tape/b1",)),))
    with pytest.raises(InvalidPlan, match="both swapped and recomputed"):
        simulate_plan(compile_program(g), g, SwapPlan((swap,), recomputes=_plan().recomputes))


def test_random_and_stateful_ops_are_never_rerun() -> None:
    g = _block()
    g.ops["relu"].type = "RandomUniform"
    ctx = PlanContext.build(g)
    with pytest.raises(InvalidPlan, match="not pure and cheap: relu \\(RandomUniform\\)"):
        check_plan(g, ctx.order, _plan())
    assert not derive_plan(ctx, PlanParams(recompute="cheap")).recomputes
    assert not {"RandomUniform", "StatelessRandomUniformV2", "ReadVariableOp"} & RECOMPUTABLE


def test_cheap_recomputes_what_a_held_tensor_can_make_and_swaps_the_rest() -> None:
    g = _block()
    ctx = PlanContext.build(g)
    kept = derive_plan(ctx, PlanParams(recompute="cheap", n_tensors=0))
    assert [(r.tensor, r.ops, r.sources) for r in kept.recomputes] == [("relu:0", ("relu",), ())]
    none = derive_plan(ctx, PlanParams(recompute="none"))
    assert not none.recomputes and {s.tensor for s in none.swaps} == {"a:0", "relu:0"}
    both = derive_plan(ctx, PlanParams(recompute="cheap"))
    check_plan(g, ctx.order, both)
    (rc,) = both.recomputes
    (swap,) = both.swaps  # a crosses the link; relu is made from a's swap-in
    assert swap.tensor == "a:0" and rc.sources == (("a:0", 0),)
    assert swap.swap_ins[0].trigger == rc.trigger == "gradient_tape/b0"  # brought forward
    # half the bytes over the slow link: relu's device copy no longer waits for its swap-out
    # (12 MiB at the peak against 16), and the step is faster by more than the re-run costs
    timeline = Timeline.build(ctx.order, {n: 1e-3 for n in g.ops})
    link = Link(1 << 30, 1 << 30)  # 1 GiB/s: a 4 MiB copy takes 3.9 ms, an op 1 ms
    program = compile_program(g, ctx.order)
    swapped = simulate_plan(program, g, none, timeline=timeline, link=link)
    mixed = simulate_plan(program, g, both, timeline=timeline, link=link)
    assert mixed.host_peak_bytes == 4 * MIB < swapped.host_peak_bytes == 8 * MIB
    assert mixed.memory.live_peak_bytes < swapped.memory.live_peak_bytes
    assert mixed.time is not None and swapped.time is not None
    assert mixed.time.recompute_seconds == 1e-3
    assert mixed.time.step_seconds < swapped.time.step_seconds


def _raising() -> Graph:
    """x -> a (swapped) -> m = Mul(a) -> relu -> f; b1 reads relu while the 6 MiB seed and
    b1's output are live, b3 reads a: relu made again from a needs a's copy from b1 on, with
    m's copy beside it, where swapping relu brings back one tensor."""
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4 * MIB, type="Conv2D")
    m = add(g, "m", a, 4 * MIB, type="Mul")
    r = add(g, "relu", m, 4 * MIB, type="Relu")
    f = add(g, "f", r, 256)
    seed = add(g, "gradient_tape/seed", f, 6 * MIB)
    b1 = add(g, "gradient_tape/b1", seed + r, 4 * MIB)
    b2 = add(g, "gradient_tape/b2", b1, 4 * MIB)
    b3 = add(g, "gradient_tape/b3", b2 + a, 256)
    g.mark_outputs(b3)
    return g


def test_the_guard_swaps_a_recompute_that_raises_the_peak_instead() -> None:
    from simulator.engine import Engine

    engine = Engine.build(_raising())
    params = PlanParams(ub=1, sync_out=True, recompute="cheap")
    plain = engine.evaluate(params, timed=False)
    assert [(r.tensor, r.sources) for r in plain.plan.recomputes] == [("relu:0", (("a:0", 0),))]
    assert plain.peak_bytes == 20 * MIB + 256  # the allocator's peak, which the guard compares
    guarded = engine.evaluate(replace(params, limit=16 * MIB), timed=False)
    assert not guarded.plan.recomputes
    assert [s.tensor for s in guarded.plan.swaps] == ["a:0", "relu:0"]
    assert guarded.peak_bytes == 16 * MIB + 256
    roomy = engine.evaluate(replace(params, limit=20 * MIB + 256), timed=False)
    assert (roomy.plan.swaps, roomy.plan.recomputes) == (plain.plan.swaps, plain.plan.recomputes)


def _raising_twice() -> Graph:
    """`_raising` twice side by side, both relus read by b1 and both a's by b3: at b1 each
    recompute holds its source's copy too, so the guard swaps both where one would do."""
    g = Graph()
    ends = []
    for k in ("", "2"):
        x = add(g, f"x{k}", [], 256, type="Placeholder", kind=TensorKind.INPUT)
        a = add(g, f"a{k}", x, 4 * MIB, type="Conv2D")
        m = add(g, f"m{k}", a, 4 * MIB, type="Mul")
        ends.append((a, add(g, f"relu{k}", m, 4 * MIB, type="Relu")))
    (a, r), (a2, r2) = ends
    seed = add(g, "gradient_tape/seed", add(g, "f", r + r2, 256), 6 * MIB)
    b1 = add(g, "gradient_tape/b1", seed + r + r2, 4 * MIB)
    b2 = add(g, "gradient_tape/b2", b1, 4 * MIB)
    g.mark_outputs(add(g, "gradient_tape/b3", b2 + a + a2, 256))
    return g


def test_the_guard_gives_back_the_recomputes_it_did_not_need() -> None:
    from simulator import get_preset
    from simulator.engine import Engine

    g = _raising_twice()
    slow = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1 << 30)
    engine = Engine.build(g, device=slow, cost=dict.fromkeys(g.ops, 1e-3))
    params = PlanParams(ub=1, sync_out=True, recompute="cheap", limit=24 * MIB + 256)
    plain = engine.evaluate(replace(params, limit=0))
    assert len(plain.plan.recomputes) == 2 and plain.peak_bytes > params.limit
    # without a time model nothing says a recompute is worth its bytes: both are swapped
    untimed = engine.evaluate(params, timed=False)
    swapped = engine.evaluate(replace(params, limit=1))
    assert not untimed.plan.recomputes and not swapped.plan.recomputes
    # with one: one recompute is given back, within the limit and faster than both swapped
    guarded = engine.evaluate(params)
    check_plan(g, engine.order, guarded.plan)
    assert len(guarded.plan.recomputes) == 1
    assert untimed.peak_bytes < guarded.peak_bytes <= params.limit
    assert guarded.step_seconds is not None and swapped.step_seconds is not None
    assert guarded.step_seconds < swapped.step_seconds


def test_heavy_ops_are_rerun_only_where_cheaper_than_the_transfers_they_save() -> None:
    g = _block()  # a = Conv2D(x): x is an input, held all step
    ctx = PlanContext.build(g)
    link = Link(1 << 30, 1 << 30)  # 4 MiB out and back: 7.8 ms
    cheap = RecomputePrice({"a": 1e-3, "relu": 1e-4}, link)
    dear = RecomputePrice({"a": 5e-3, "relu": 1e-4}, link)
    heavy = PlanParams(recompute="cheap", n_tensors=0, recompute_heavy=1.0)

    def made(params: PlanParams, price: RecomputePrice | None) -> dict[str, tuple[str, ...]]:
        plan = derive_plan(ctx, params, price=price)
        check_plan(g, ctx.order, plan)
        return {r.tensor: r.ops for r in plan.recomputes}

    # a's conv costs 1 ms against 7.8 ms of transfers: a is made again, and relu from it
    assert made(heavy, cheap) == {"a:0": ("a",), "relu:0": ("a", "relu")}
    # at 5 ms it is worth it only where it may cost the whole transfer time, not 0.25 of it
    assert "a:0" in made(heavy, dear)
    assert made(replace(heavy, recompute_heavy=0.25), dear) == {"relu:0": ("relu",)}
    # never without a share, or without costs and a link to weigh it by
    assert made(replace(heavy, recompute_heavy=0.0), cheap) == {"relu:0": ("relu",)}
    assert made(heavy, None) == {"relu:0": ("relu",)}
    assert "Conv2D" in RECOMPUTABLE_HEAVY and not RECOMPUTABLE_HEAVY & RECOMPUTABLE


def test_the_time_model_charges_a_rerun_convolution() -> None:
    g = _block()
    ctx = PlanContext.build(g)
    cost = {n: 1e-3 for n in g.ops}
    link = Link(1 << 30, 1 << 30)
    price = RecomputePrice(cost, link)
    plan = derive_plan(
        ctx, PlanParams(recompute="cheap", n_tensors=0, recompute_heavy=1.0), price=price
    )
    timeline = Timeline.build(ctx.order, cost)
    program = compile_program(g, ctx.order)
    result = simulate_plan(program, g, plan, timeline=timeline, link=link)
    assert result.time is not None
    assert result.time.recompute_seconds == pytest.approx(3e-3)  # a, then a and relu
    made = {e.tensor for e in result.memory.trace if e.kind is EventKind.RECOMPUTE}
    assert {"a:0@re", "relu:0@re"} <= made


def test_a_chain_reads_the_swap_in_that_serves_the_next_reader_of_its_source() -> None:
    """a is swapped in twice (for b0, then for b4); relu, read by b2, is made from a's second
    copy, brought forward to relu's trigger, not from the first held on from b0."""
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4 * MIB, type="Conv2D")
    r = add(g, "relu", a, 4 * MIB, type="Relu")
    f = add(g, "f", r, 256)
    seed = add(g, "gradient_tape/seed", f, 256)
    b0 = add(g, "gradient_tape/b0", seed + a, 256)
    b1 = add(g, "gradient_tape/b1", b0, 2 * MIB)
    b2 = add(g, "gradient_tape/b2", b1 + r, 256)
    b3 = add(g, "gradient_tape/b3", b2, 2 * MIB)
    b4 = add(g, "gradient_tape/b4", b3 + a, 256)
    g.mark_outputs(b4)
    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, PlanParams(recompute="cheap", ub=1))
    check_plan(g, ctx.order, plan)
    (rc,) = plan.recomputes
    (swap,) = plan.swaps
    assert rc.tensor == "relu:0" and rc.sources == (("a:0", 1),)
    first, second = swap.swap_ins
    assert first.consumers == ("gradient_tape/b0",) and second.trigger == rc.trigger
    result = simulate_plan(compile_program(g, ctx.order), g, plan).memory
    made = {e.tensor for e in result.trace if e.kind is EventKind.RECOMPUTE}
    assert "relu:0@re" in made


def _bn_backward(scale_bytes: int, scale_type: str, skip: bool = True) -> Graph:
    """A batch norm's input gradient in the backward pass: m = Mul(seed, s) waits for b1..b4
    to be summed with them; the output gradient `seed` is read again after the sum (with
    `skip`: a residual's other branch), and the per-channel scale `s` last by m."""
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4 * MIB, type="Conv2D")
    s = add(g, "s", x, scale_bytes, type=scale_type)
    seed = add(g, "gradient_tape/seed", add(g, "f", a + s, 256), 4 * MIB)
    m = add(g, "gradient_tape/m", seed + s, 4 * MIB, type="Mul")
    b = add(g, "gradient_tape/b1", seed, 2 * MIB)
    for k in range(2, 5):
        b = add(g, f"gradient_tape/b{k}", b, 2 * MIB)
    total = add(g, "gradient_tape/sum", m + b + a, 4 * MIB, type="AddN")
    g.mark_outputs(add(g, "gradient_tape/skip", total + (seed if skip else []), 256))
    return g


def test_a_backward_tensor_is_made_again_from_what_the_backward_pass_holds() -> None:
    g = _bn_backward(256, "Rsqrt")
    ctx = PlanContext.build(g)
    params = PlanParams(ub=1, recompute="cheap", backward_swaps=True)
    plan = derive_plan(ctx, params)
    check_plan(g, ctx.order, plan)
    # made again from seed (held anyway) and the 256-byte scale: the scale is swapped, and its
    # copy held past its last reader, m, to the trigger
    rc = next(r for r in plan.recomputes if r.tensor == "gradient_tape/m:0")
    assert (rc.ops, rc.consumers) == (("gradient_tape/m",), ("gradient_tape/sum",))
    assert rc.sources == (("s:0", 0),)
    assert "gradient_tape/m:0" not in {s.tensor for s in plan.swaps}
    swapped = derive_plan(ctx, replace(params, recompute="none"))
    assert "gradient_tape/m:0" in {s.tensor for s in swapped.swaps}
    # the backward pass's tensors are left alone unless the plan may touch them
    forward_only = derive_plan(ctx, replace(params, backward_swaps=False))
    assert all(not r.tensor.startswith("gradient_tape/") for r in forward_only.recomputes)
    timeline = Timeline.build(ctx.order, {n: 1e-3 for n in g.ops})
    link = Link(1 << 30, 1 << 30)
    program = compile_program(g, ctx.order)
    made = simulate_plan(program, g, plan, timeline=timeline, link=link)
    moved = simulate_plan(program, g, swapped, timeline=timeline, link=link)
    assert made.memory.live_peak_bytes <= moved.memory.live_peak_bytes
    assert made.time is not None and moved.time is not None
    assert made.time.step_seconds < moved.time.step_seconds
    events = {e.tensor for e in made.memory.trace if e.kind is EventKind.RECOMPUTE}
    assert "gradient_tape/m:0@re" in events


def test_a_backward_chain_holds_an_input_read_last_beside_the_tensor_it_makes() -> None:
    """Without the shortcut, seed's last reader runs just after m is made: m is made again
    from seed held until then, no larger than m (m takes over its buffer), where swapping m
    held both for a while; the chain also holds the scale it reads until it runs."""
    g = _bn_backward(256, "Rsqrt", skip=False)
    ctx = PlanContext.build(g)
    params = PlanParams(ub=1, recompute="cheap", backward_swaps=True)
    plan = derive_plan(ctx, params)
    check_plan(g, ctx.order, plan)
    (rc,) = [r for r in plan.recomputes if r.tensor == "gradient_tape/m:0"]
    assert rc.reads(g) == {"gradient_tape/seed:0", "s:0"}
    swapped = derive_plan(ctx, replace(params, recompute="none"))
    program = compile_program(g, ctx.order)
    held = simulate_plan(program, g, plan).memory
    moved = simulate_plan(program, g, swapped).memory
    assert held.live_peak_bytes <= moved.live_peak_bytes + g.tensors["s:0"].nbytes


@pytest.mark.parametrize("nbytes", [8 * MIB, 5 * MIB])
def test_a_backward_chain_does_not_hold_a_larger_tensor_past_its_last_reader(
    nbytes: int,
) -> None:
    g = _bn_backward(nbytes, "Conv2D")  # s: larger than m (4 MiB), made by a convolution
    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, PlanParams(ub=1, recompute="cheap", backward_swaps=True))
    assert "gradient_tape/m:0" not in {r.tensor for r in plan.recomputes}
    assert "gradient_tape/m:0" in {s.tensor for s in plan.swaps}


def test_a_chain_source_is_copied_before_the_copies_needed_after_the_chain() -> None:
    """b0 triggers two swap-ins: c for b2, and a for b3 and for relu's chain right after b0.
    a goes first: the chain needs it before b2 needs c."""
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4 * MIB, type="Conv2D")
    c = add(g, "c", x, 4 * MIB, type="Conv2D")
    r = add(g, "relu", a, 4 * MIB, type="Relu")
    seed = add(g, "gradient_tape/seed", add(g, "f", r + c, 256), 256)
    b0 = add(g, "gradient_tape/b0", seed, 256)
    b1 = add(g, "gradient_tape/b1", b0 + r, 256)
    b2 = add(g, "gradient_tape/b2", b1 + c, 256)
    g.mark_outputs(add(g, "gradient_tape/b3", b2 + a, 256))
    b = "gradient_tape/"
    plan = SwapPlan(
        (
            Swap("a:0", 4 * MIB, (SwapIn(b + "b0", (b + "b3",)),)),
            Swap("c:0", 4 * MIB, (SwapIn(b + "b0", (b + "b2",)),)),
        ),
        recomputes=(Recompute("relu:0", 4 * MIB, ("relu",), b + "b0", (b + "b1",), (("a:0", 0),)),),
    )
    order = PlanContext.build(g).order
    check_plan(g, order, plan)
    assert plan.first_reads(order.position) == {
        ("a:0", 0): order.position[b + "b0"] + 1,
        ("c:0", 0): order.position[b + "b2"],
    }
    timeline = Timeline.build(order, {n: 1e-3 for n in g.ops})
    link = Link(1 << 30, 1 << 30)  # a 4 MiB copy: 3.9 ms
    result = simulate_plan(compile_program(g, order), g, plan, timeline=timeline, link=link)
    assert result.time is not None
    copies = [t for t in result.time.transfers if t.direction == "h2d"]
    assert [t.tensor for t in copies] == ["a:0", "c:0"]
    # the chain waits for one copy (then runs 1 ms), and b2 for the second, which comes in
    # while the chain and b1 run: two copies less b1's 1 ms, where c first made the chain
    # wait for both and then run (two copies and 1 ms)
    copy = 4 * MIB / (1 << 30)
    extra = result.time.step_seconds - timeline.baseline_seconds
    assert extra == pytest.approx(2 * copy - 1e-3, rel=1e-6)


def test_a_give_back_try_is_one_simulation_and_its_plan_is_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With prefetching, a give-back try keeps the swap-ins the guarded plan was prefetched to
    and simulates once; only a try that gives the tensor back derives and prefetches again."""
    from simulator import get_preset, refine
    from simulator.engine import Engine

    g = _raising_twice()
    slow = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1 << 30)
    engine = Engine.build(g, device=slow, cost=dict.fromkeys(g.ops, 1e-3))
    params = PlanParams(
        ub=1, sync_out=True, recompute="cheap", limit=26 * MIB,
        prefetch_bytes=24 * MIB + 256,
    )  # fmt: skip
    calls = {"tries": 0, "derived": 0}
    real_released, real_plan_of = refine.released, refine.plan_of

    def counted_released(*args: Any) -> Any:
        calls["tries"] += min(len(args[2]), refine.GUARD_RELEASES)
        monkeypatch.setattr(refine, "plan_of", counting_plan_of)
        try:
            return real_released(*args)
        finally:
            monkeypatch.setattr(refine, "plan_of", real_plan_of)

    def counting_plan_of(*args: Any) -> Any:
        calls["derived"] += 1
        return real_plan_of(*args)

    monkeypatch.setattr(refine, "released", counted_released)
    guarded = engine.evaluate(params)
    check_plan(g, engine.order, guarded.plan)
    assert len(guarded.plan.recomputes) == 1 and guarded.peak_bytes <= params.limit
    assert calls == {"tries": 2, "derived": 1}  # two tries, one tensor given back
