"""Plan derivation's simulating steps (`simulator.refine`): what an evaluation reports is the
simulation of the plan it returns, however derivation got there, and a plan derivation has
simulated is not simulated again."""

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import simulator.engine
import simulator.run
from simulator import Graph, TensorKind, get_preset
from simulator.derive import PlanParams
from simulator.engine import Engine
from tests.simulator.builders import add, held_gradient
from tests.simulator.test_swap_properties import params, training_graphs


def _engine(g: Graph, bandwidth: float) -> Engine:
    slow = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=bandwidth)
    return Engine.build(g, device=slow, cost=dict.fromkeys(g.ops, 1.0))


@settings(max_examples=120, deadline=None)
@given(training_graphs(), params, st.floats(1e2, 1e6), st.integers(1, 1 << 20), st.booleans())
def test_an_evaluation_reports_the_simulation_of_the_plan_it_returns(
    g: Graph, p: PlanParams, bw: float, limit: int, late: bool
) -> None:
    engine = _engine(g, bw)
    p = replace(p, prefetch_bytes=limit, limit=limit)
    if late:
        p = replace(p, n_tensors=-1, backward_swaps=True, limit=limit)
    ev = engine.evaluate(p)
    fresh = engine.simulate(ev.plan)
    assert ev.result.peak_bytes == fresh.peak_bytes
    assert ev.result.memory.live_peak_bytes == fresh.memory.live_peak_bytes
    assert ev.result.time == fresh.time
    assert ev.result.plan is ev.plan
    # the guard's give-backs skip the allocator's replay of a plan whose live peak misses
    assert ev.result.peak_bytes >= ev.result.memory.live_peak_bytes


def _plans_passed(monkeypatch, module, name: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """The plans (third argument) `module.name` is called with from now on."""
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_plan_derivation_simulated_is_not_simulated_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(held_gradient(), 1024.0)
    link = engine.device.link if engine.device else None
    plan = engine.evaluate(PlanParams(ub=1, sync_out=True)).plan
    calls = _plans_passed(monkeypatch, simulator.engine, "simulate_plan")
    first = engine.simulate_bare(plan, link)
    same = replace(plan, params={"another": "label"})  # the same swaps, another object
    again = engine.simulate_bare(same, link)
    assert len(calls) == 1
    assert again.memory is first.memory and again.plan is same
    engine.simulate_bare(replace(plan, swaps=plan.swaps[1:]), link)
    assert len(calls) == 2


def test_rounds_of_prefetching_report_the_last_rounds_plan() -> None:
    # a held weight gradient swapped: each round prefetches under a lower limit (3 rounds)
    engine = _engine(held_gradient(), 1000.0)
    jit = PlanParams(ub=1, sync_out=True)
    limit = engine.evaluate(jit).result.memory.live_peak_bytes // 2
    p = replace(jit, backward_swaps=True, limit=limit, prefetch_bytes=limit)
    ev = engine.evaluate(p)
    fresh = engine.simulate(ev.plan)
    assert (ev.result.peak_bytes, ev.result.time) == (fresh.peak_bytes, fresh.time)


def test_a_give_back_try_that_is_not_faster_is_not_simulated_for_memory(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.simulator.test_recompute import MIB, _raising_twice

    g = _raising_twice()
    # re-running a Mul and a Relu costs more than their copies over the link: the guard's
    # tries to recompute them again are slower, whatever their memory
    cost = {**dict.fromkeys(g.ops, 1e-3), "m": 1.0, "relu": 1.0, "m2": 1.0, "relu2": 1.0}
    engine = Engine.build(g, device=get_preset("v100-16gb-nvlink2"), cost=cost)
    params = PlanParams(ub=1, sync_out=True, recompute="cheap", limit=24 * MIB + 256)
    lowered = _plans_passed(monkeypatch, simulator.run, "lower_plan")
    screened = engine.evaluate(params)
    screened_lowerings = len(lowered)
    engine._bare.clear()
    lowered.clear()
    monkeypatch.setattr(Engine, "timed", lambda *_: None)  # every try simulated in full
    full = engine.evaluate(params)
    assert screened.plan == full.plan and screened.result.time == full.result.time
    assert screened.peak_bytes == full.peak_bytes and not full.plan.recomputes
    assert screened_lowerings == len(lowered) - 2  # the two tries, neither given back


def shared_level() -> Graph:
    """`a` is read back by `gradient_tape/a`, whose other inputs p and q share the level
    before it: a copy triggered by p (the level's first op) is live while q runs, beside
    the gradient both read."""
    g = Graph("shared_level")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 8192)
    loss = add(g, "loss", add(g, "big", add(g, "f", a, 1024), 16384), 4)
    gl = add(g, "gradient_tape/loss", loss, 8192)
    p = add(g, "gradient_tape/p", gl, 4096)
    q = add(g, "gradient_tape/q", gl, 4096)
    g.mark_outputs(loss + add(g, "gradient_tape/a", p + q + a, 1024))
    return g


def test_a_swap_in_live_at_a_peak_over_the_limit_waits_for_the_peaks_op() -> None:
    engine = _engine(shared_level(), 1e6)
    least = PlanParams(ub=1, sync_out=True)
    runs = {limit: engine.evaluate(replace(least, limit=limit)) for limit in (0, 20000, 30000)}
    triggers = {k: [s.trigger for s in r.plan.swaps[0].swap_ins] for k, r in runs.items()}
    assert triggers == {0: ["gradient_tape/p"], 20000: ["gradient_tape/q"],
                        30000: ["gradient_tape/p"]}  # fmt: skip
    assert runs[0].result.memory.peak_op == "gradient_tape/q"
    assert runs[20000].peak_bytes < runs[0].peak_bytes == runs[30000].peak_bytes
