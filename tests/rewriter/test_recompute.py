"""Recompute in the real graph: copies of the ops that wait for their trigger, kept by
Grappler, training bitwise like the original, simulated as planned."""

from dataclasses import replace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from autotune.api import capture  # noqa: E402
from autotune.run.gating import executed_partitions  # noqa: E402
from autotune.run.measure import example_tensors  # noqa: E402
from autotune.zoo import get_entry  # noqa: E402
from rewriter.apply import apply_plan  # noqa: E402
from rewriter.names import copy_name  # noqa: E402
from simulator import compile_program, simulate_memory, simulate_plan  # noqa: E402
from simulator.derive import PlanParams  # noqa: E402
from simulator.engine import Engine  # noqa: E402
from tests.executed import ancestors  # noqa: E402
from tests.models import bn_cnn, captured_residual_bn_cnn  # noqa: E402
from tests.twins import assert_same_state  # noqa: E402

pytestmark = pytest.mark.tf

GPT2 = {"layers_": 2, "heads": 2, "width": 16, "vocab": 50, "context": 16}
CASES = {"tiny-transformer": ({}, 4), "gpt2-small": (GPT2, 2), "bn-cnn": ({}, 8)}


def _captured(model: str):  # type: ignore[no-untyped-def]
    sizes, batch = CASES[model]
    built = bn_cnn() if model == "bn-cnn" else get_entry(model).build(seed=3, **sizes)
    return built, capture(built.model, loss=built.loss, optimizer=built.optimizer, batch_size=batch)


def _plan(cap, **params):  # type: ignore[no-untyped-def]
    engine = Engine.build(cap.graph)
    return engine.evaluate(PlanParams(recompute="cheap", **params), timed=False).plan


@pytest.mark.parametrize("mode", ["emulated", "device"])
@pytest.mark.parametrize("n_tensors", [0, -1])
@pytest.mark.parametrize("model", list(CASES))
def test_recompute_plans_train_bitwise_like_the_original(
    model: str, n_tensors: int, mode: str
) -> None:
    (a, cap_a), (b, cap_b) = _captured(model), _captured(model)
    plan = _plan(cap_b, n_tensors=n_tensors)
    assert plan.recomputes and bool(plan.swaps) == (n_tensors != 0)
    devices = {"compute_device": "/device:CPU:0", "host_device": "/device:CPU:1"}
    tuned = apply_plan(cap_b, plan, mode=mode, **(devices if mode == "device" else {}))
    inputs = example_tensors(cap_a.specs, seed=7)
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)


@pytest.mark.parametrize("model", list(CASES))
def test_the_copies_survive_grappler_and_wait_for_their_triggers(model: str) -> None:
    _, cap = _captured(model)
    plan = _plan(cap)
    tuned = apply_plan(cap, plan)
    parts = executed_partitions(tuned, *example_tensors(cap.specs))
    executed = {n.name: n for pg in parts for n in pg.node}
    for k, rc in enumerate(plan.recomputes):
        for op in rc.ops:
            name = copy_name(op, k)
            assert name in executed  # neither removed nor merged back into the original
            # Grappler drops a control edge another path makes redundant: the trigger must
            # still be among what the copy waits for
            assert rc.trigger in ancestors(executed, name), name


@pytest.mark.parametrize("model", list(CASES))
def test_the_recaptured_pinned_rewrite_simulates_exactly_like_the_plan(model: str) -> None:
    _, cap = _captured(model)
    plan = _plan(cap)  # chains of up to 5 ops, run in place where TensorFlow does
    tuned = apply_plan(cap, plan, pin_order=True)
    planned = simulate_plan(compile_program(cap.graph), cap.graph, plan).memory
    again = simulate_memory(compile_program(tuned.recapture()))
    assert again.peak_bytes == planned.peak_bytes
    names = set(tuned.recapture().ops)
    assert all(copy_name(rc.ops[-1], k) in names for k, rc in enumerate(plan.recomputes))


@pytest.mark.parametrize("mode", ["emulated", "device"])
def test_prefetched_swap_ins_train_bitwise_and_wait_for_their_triggers(mode: str) -> None:
    from dataclasses import replace

    from simulator import get_preset

    (a, cap_a), (b, cap_b) = _captured("bn-cnn"), _captured("bn-cnn")
    slow = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1e6)
    engine = Engine.build(cap_b.graph, device=slow, cost=dict.fromkeys(cap_b.graph.ops, 1e-3))
    jit = PlanParams(ub=1, sync_out=True)
    early = engine.evaluate(replace(jit, prefetch_bytes=1 << 40)).plan  # room for everything
    pos = engine.order.position
    pairs = [
        (s.trigger, t.trigger)
        for x, y in zip(engine.evaluate(jit).plan.swaps, early.swaps)
        for s, t in zip(x.swap_ins, y.swap_ins)
    ]
    assert any(pos[t] < pos[s] for s, t in pairs) and all(pos[t] <= pos[s] for s, t in pairs)
    devices = {"compute_device": "/device:CPU:0", "host_device": "/device:CPU:1"}
    tuned = apply_plan(cap_b, early, mode=mode, **(devices if mode == "device" else {}))
    inputs = example_tensors(cap_a.specs, seed=7)
    if mode == "device":  # a first step each: TensorFlow reports the executed graphs then
        parts = executed_partitions(tuned, *inputs)
        cap_a.concrete_function(*inputs)
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)
    if mode == "device":  # each swap-in still waits for its new trigger when it runs
        from autotune.run.gating import check_gating

        report = check_gating(tuned, parts, inputs)
        assert report.gates and all(g.gated for g in report.gates), report.summary()


def _heavy_plan(cap, **params):  # type: ignore[no-untyped-def]
    """Recomputes through convolutions and matrix products wherever a chain of up to 8 ops
    can make a tensor again (every op costs nothing, so every such chain is worth it)."""
    from simulator import get_preset
    from simulator.opsemantics import RECOMPUTABLE_HEAVY

    device = get_preset("v100-16gb-nvlink2")
    engine = Engine.build(cap.graph, device=device, cost=dict.fromkeys(cap.graph.ops, 0.0))
    heavy = PlanParams(recompute="cheap", recompute_ops=8, recompute_heavy=1.0, **params)
    plan = engine.evaluate(heavy, timed=False).plan
    kinds = {cap.graph.ops[o].type for rc in plan.recomputes for o in rc.ops}
    assert kinds & RECOMPUTABLE_HEAVY, kinds
    return plan


@pytest.mark.parametrize("n_tensors", [0, -1])
@pytest.mark.parametrize("model", ["bn-cnn", "tiny-transformer"])
def test_recomputed_convolutions_and_matmuls_train_bitwise_and_survive_grappler(
    model: str, n_tensors: int
) -> None:
    (a, cap_a), (b, cap_b) = _captured(model), _captured(model)
    plan = _heavy_plan(cap_b, n_tensors=n_tensors)
    tuned = apply_plan(cap_b, plan)
    inputs = example_tensors(cap_a.specs, seed=7)
    parts = executed_partitions(tuned, *inputs)
    executed = {n.name: n.op for pg in parts for n in pg.node}
    for k, rc in enumerate(plan.recomputes):
        for op, after in zip(rc.ops, (*rc.ops[1:], "")):
            # each copy runs, not merged back into its original by Grappler; a convolution's
            # copy may run fused with the copy of its bias add (oneDNN's remapper)
            fused = executed.get(copy_name(after, k), "").startswith("_")
            assert copy_name(op, k) in executed or fused, (op, after)
    cap_a.concrete_function(*inputs)  # a step each before comparing, as executed_partitions ran one
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)


@pytest.mark.parametrize(("mode", "n_tensors"), [("emulated", 0), ("device", 0), ("emulated", -1)])
def test_backward_recomputes_train_bitwise_and_wait_for_their_triggers(
    mode: str, n_tensors: int
) -> None:
    """The gradient of a residual block's output, held for the shortcut, makes its batch
    norms' input gradients again where they are summed (a backward tensor recomputed). With
    swaps, tensors under 1 KiB that no chain reads stay: a swapped gamma gradient rounds
    differently (tests/rewriter/test_apply.py, the batch norms' sums)."""
    (a, cap_a), (b, cap_b) = captured_residual_bn_cnn(), captured_residual_bn_cnn()
    plan = _plan(cap_b, n_tensors=n_tensors, backward_swaps=True)
    read = {name for rc in plan.recomputes for name, _ in rc.sources}
    plan = replace(plan, swaps=tuple(s for s in plan.swaps if s.nbytes >= 1024 or s.tensor in read))
    late = [k for k, rc in enumerate(plan.recomputes) if rc.tensor.startswith("gradient_tape/")]
    assert late
    devices = {"compute_device": "/device:CPU:0", "host_device": "/device:CPU:1"}
    tuned = apply_plan(cap_b, plan, mode=mode, **(devices if mode == "device" else {}))
    inputs = example_tensors(cap_a.specs, seed=7)
    parts = executed_partitions(tuned, *inputs)
    executed = {n.name: n for pg in parts for n in pg.node}
    for k in late:
        for op in plan.recomputes[k].ops:
            name = copy_name(op, k)
            assert name in executed and plan.recomputes[k].trigger in ancestors(executed, name)
    cap_a.concrete_function(*inputs)  # a step each before comparing, as executed_partitions ran one
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)


def test_backward_recomputes_simulate_like_the_recaptured_pinned_rewrite() -> None:
    _, cap = captured_residual_bn_cnn()
    plan = _plan(cap, n_tensors=0, backward_swaps=True)
    assert any(rc.tensor.startswith("gradient_tape/") for rc in plan.recomputes)
    tuned = apply_plan(cap, plan, pin_order=True)
    planned = simulate_plan(compile_program(cap.graph), cap.graph, plan).memory
    again = simulate_memory(compile_program(tuned.recapture()))
    assert again.peak_bytes == planned.peak_bytes


def test_no_recompute_copies_a_sum_grappler_regroups_and_the_rest_train_bitwise() -> None:
    """At run time Grappler sums a block's last batch norm and its shortcut as one tree of adds;
    a copy of the two adds, held apart by its control edge, would round otherwise."""
    (a, cap_a), (b, cap_b) = captured_residual_bn_cnn(), captured_residual_bn_cnn()
    regrouped = cap_b.graph.rewritten
    assert any(n.endswith("/Add") for n in regrouped)
    plan = _plan(cap_b, n_tensors=0, recompute_ops=8)
    assert plan.recomputes
    assert not {op for rc in plan.recomputes for op in rc.ops} & regrouped
    tuned = apply_plan(cap_b, plan)
    inputs = example_tensors(cap_a.specs, seed=7)
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)
