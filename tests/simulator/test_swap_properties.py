"""Property tests: random training-like graphs, random swap parameters."""

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import EventKind, Graph, Link, TensorKind, Timeline, compile_program, simulate_plan
from simulator.derive import PlanContext, PlanParams, check_plan, derive_plan
from tests.simulator.builders import add


@st.composite
def training_graphs(draw: st.DrawFn) -> Graph:
    g = Graph("random_training")
    fwd = add(g, "x", [], draw(st.integers(0, 4096)), type="Placeholder", kind=TensorKind.INPUT)
    for i in range(draw(st.integers(1, 12))):
        ins = draw(st.lists(st.sampled_from(fwd), min_size=1, max_size=2, unique=True))
        fwd += add(
            g,
            f"f{i}",
            ins,
            draw(st.integers(1, 1 << 16)),
            # Relu and Mul are recomputable, Conv2D where it costs less than its transfers
            type=draw(st.sampled_from(["Op", "Relu", "Mul", "Conv2D"])),
            inplace=(0,) if draw(st.booleans()) else (),
        )
    grad = add(g, "gradient_tape/seed", [fwd[-1]], 256)
    for i in range(draw(st.integers(1, 12))):
        reads = draw(st.lists(st.sampled_from(fwd), min_size=1, max_size=2, unique=True))
        kind = draw(st.sampled_from(["Op", "Op", "Shape"]))
        out = add(g, f"gradient_tape/b{i}", grad + reads, draw(st.integers(1, 1 << 16)), type=kind)
        if kind != "Shape":
            grad = out
    g.mark_outputs(grad)
    return g


params = st.builds(
    lambda n, lb, span, thr, grp, trig, rc, ops, sync, lag, heavy: PlanParams(
        n,
        lb,
        lb + span,
        thr,
        grp,
        trig,
        sync,
        recompute=rc,
        recompute_ops=ops,
        sync_lag=lag,
        recompute_heavy=heavy,
    ),
    st.integers(-1, 6),
    st.integers(1, 4),
    st.integers(0, 6),
    st.integers(1, 3),
    st.integers(0, 3),
    st.sampled_from(["direct_order", "chain_rule"]),
    st.sampled_from(["none", "cheap"]),
    st.integers(1, 3),
    st.booleans(),
    st.integers(0, 4),
    st.sampled_from([0.0, 0.25, 1.0, 100.0]),
)


def _check_trace(result) -> None:  # type: ignore[no-untyped-def]
    rows = result.memory.trace.rows
    assert all(live >= 0 and host >= 0 for _, _, _, _, live, host in rows)
    if rows:
        assert rows[-1][4] == result.memory.persistent_bytes and rows[-1][5] == 0
    made = (EventKind.ALLOC, EventKind.SWAP_IN, EventKind.RECOMPUTE)
    allocs = Counter(t for k, _, t, *_ in rows if k in made)
    frees = Counter(t for k, _, t, *_ in rows if k == EventKind.FREE)
    assert allocs == frees and set(allocs.values()) <= {1}
    outs = Counter(t for k, _, t, *_ in rows if k == EventKind.SWAP_OUT)
    back = Counter(t for k, _, t, *_ in rows if k == EventKind.HOST_FREE)
    assert outs == back


@settings(max_examples=200, deadline=None)
@given(training_graphs(), params)
def test_random_plans_are_valid_and_balance(g: Graph, p: PlanParams) -> None:
    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, p)
    check_plan(g, ctx.order, plan)  # no cycle, no shape-only op involved, pure recomputes
    pos = ctx.order.position
    swapped = {s.tensor for s in plan.swaps}
    for rc in plan.recomputes:
        assert rc.reads(g) & swapped == {t for t, _ in rc.sources} and rc.tensor not in swapped
        assert len(rc.ops) <= p.recompute_ops
    for swap in plan.swaps:
        for x, y in zip(swap.swap_ins, swap.swap_ins[1:]):  # no two copies live at once
            assert pos[y.trigger] > max(pos[c] for c in x.consumers) or not plan.recomputes
        for s in swap.swap_ins:
            assert all(pos[c] > pos[s.trigger] for c in s.consumers)
            assert g.ops[s.trigger].type != "Shape"
            assert all(g.ops[c].type != "Shape" for c in s.consumers)
    _check_trace(simulate_plan(compile_program(g, ctx.order), g, plan))


@settings(max_examples=100, deadline=None)
@given(training_graphs(), params, st.floats(1e2, 1e6), st.floats(1e-4, 1e-2))
def test_random_plans_with_time_model(g: Graph, p: PlanParams, bw: float, sec: float) -> None:
    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, p)
    timeline = Timeline.build(ctx.order, {n: sec for n in g.ops})
    r = simulate_plan(compile_program(g, ctx.order), g, plan, timeline=timeline, link=Link(bw, bw))
    _check_trace(r)
    assert r.time is not None and r.time.step_seconds >= r.time.baseline_seconds
    ends = r.time.end()
    assert all(b >= a for a, b in zip(ends, ends[1:]))


@settings(max_examples=300, deadline=None)
@given(training_graphs(), params)
def test_no_plan_simulates_below_the_lower_bound(g: Graph, p: PlanParams) -> None:
    from simulator import BFCModel, lower_bound_bytes

    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, p)
    program = compile_program(g, ctx.order)
    bound = lower_bound_bytes(g)
    live = simulate_plan(program, g, plan).memory
    assert live.peak_bytes >= bound, (live.peak_bytes, bound)
    replayed = simulate_plan(program, g, plan, allocator=BFCModel(allow_growth=False)).memory
    assert replayed.peak_bytes >= bound


@settings(max_examples=300, deadline=None)
@given(
    training_graphs(),
    params,
    st.booleans(),
    st.floats(1e3, 1e7),
    st.lists(st.floats(1e-6, 1e-3), min_size=40, max_size=40),
)
def test_no_plan_that_fits_runs_faster_than_the_time_bound(
    g: Graph, p: PlanParams, serialize: bool, bw: float, costs: list[float]
) -> None:
    from simulator import get_preset
    from simulator.engine import Engine

    preset = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=bw)
    cost = {name: costs[i % len(costs)] for i, name in enumerate(sorted(g.ops))}
    engine = Engine.build(g, device=preset, cost=cost)
    ev = engine.evaluate(replace(p, serialize=serialize))
    budget = max(ev.result.memory.live_peak_bytes, engine.lower_bound)
    bound = engine.time_bound(budget)
    assert bound is not None and ev.step_seconds is not None
    assert ev.step_seconds >= bound * (1 - 1e-9), (ev.step_seconds, bound)
    # the budget the plan just fits is the tightest: any larger one gives no higher bound
    assert engine.time_bound(2 * budget) <= bound


@settings(max_examples=200, deadline=None)
@given(training_graphs(), params, st.booleans(), st.floats(1e2, 1e6))
def test_the_recompute_guard_never_raises_the_peak(
    g: Graph, p: PlanParams, timed: bool, bw: float
) -> None:
    from simulator import get_preset
    from simulator.engine import Engine

    preset = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=bw)
    engine = Engine.build(g, device=preset, cost=dict.fromkeys(g.ops, 1e-3))
    p = replace(p, recompute="cheap")
    plain = engine.evaluate(p, timed=timed)
    guarded = engine.evaluate(replace(p, limit=1), timed=timed)
    check_plan(g, engine.order, guarded.plan)
    assert guarded.peak_bytes <= plain.peak_bytes
    roomy = engine.evaluate(replace(p, limit=plain.peak_bytes), timed=timed)
    # within the limit, nothing is swapped instead
    assert (roomy.plan.swaps, roomy.plan.recomputes) == (plain.plan.swaps, plain.plan.recomputes)
