"""`autotune.rewrite` on a custom training step (a tf.function with its own GradientTape)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import autotune  # noqa: E402
from rewriter.names import swap_in_name, swap_out_name  # noqa: E402

pytestmark = pytest.mark.tf


def _custom_step():  # type: ignore[no-untyped-def]
    init = np.random.default_rng(0).normal(size=(3, 32, 32)).astype("float32")
    ws = [tf.Variable(w) for w in init]

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            h = x
            for w in ws:
                h = tf.nn.relu(h @ w)
            loss = tf.reduce_mean(h * h)
        for w, g in zip(ws, tape.gradient(loss, ws), strict=True):
            w.assign_sub(0.1 * g)
        return loss

    return step, ws


def test_rewrite_returns_a_tuned_step_that_trains_like_the_original() -> None:
    x = tf.random.stateless_normal([64, 32], seed=[1, 2])
    original, ws_a = _custom_step()
    custom, ws_b = _custom_step()
    tuned = autotune.rewrite(custom, tf.TensorSpec([64, 32], tf.float32), n_tensors=-1)
    assert tuned.plan.swaps and tuned.mode == "emulated"
    names = {n.name for n in tuned.graph_def.node}
    first = tuned.plan.swaps[0].tensor
    assert {swap_out_name(first), swap_in_name(first, 0)} <= names
    assert np.array_equal(original(x).numpy(), tuned(x).numpy())
    for a, b in zip(ws_a, ws_b, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


def test_fit_and_rewrite_give_one_plan_for_the_same_parameters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the plan fit returns comes from an engine with the preset's costs, the allocator model
    # and the time model (order edges, guards, prefetching); rewrite and verify derive their
    # plan from the same parameters the same way
    from autotune.zoo import get_entry

    zm = get_entry("tiny-cnn").build(seed=3)
    kw = {"loss": zm.loss, "optimizer": zm.optimizer, "batch_size": 256}
    tuned = autotune.fit(zm.model, gpu_memory="80MiB", trials=10, out=tmp_path, **kw)
    assert tuned.plan.swaps or tuned.plan.recomputes
    again = autotune.rewrite(zm.model, **kw, **tuned.params.to_dict())
    assert again.plan == tuned.plan
    assert again.plan == autotune.rewrite(zm.model, **kw, plan=tuned.plan).plan
