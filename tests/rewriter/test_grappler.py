"""Grappler still optimizes the tuned step: no function runs unoptimized because of a rewrite.

When a Grappler pass fails on a function, TensorFlow logs "Ignoring multi-device function
optimization failure" and runs the whole function without its rewrites and fusions (slower on
a GPU). Two rewrites did that: a pinned order through ops that constant folding replaces (a
cycle once folded), and a control edge on a Pow with a constant exponent (approximate GELU's
x**3, which the arithmetic optimizer splits by copying the Pow without its last input).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

SCRIPT = """
import json, sys
import keras
from keras import layers
from autotune.api import capture
from autotune.run.measure import example_tensors
from autotune.run.verify import plan_for
from autotune.zoo import get_entry
from rewriter.apply import apply_plan
from simulator.derive import PlanParams

def approximate_gelu_transformer():
    tokens = keras.Input((16,), dtype="int32")
    x = layers.Embedding(64, 32)(tokens)
    x = layers.LayerNormalization()(x + layers.MultiHeadAttention(2, 16)(x, x))
    h = layers.Dense(128, activation=lambda t: keras.activations.gelu(t, approximate=True))(x)
    x = layers.LayerNormalization()(x + layers.Dense(32)(h))
    model = keras.Model(tokens, layers.Dense(64)(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, loss, keras.optimizers.AdamW(1e-3)

model, pin = sys.argv[1], sys.argv[2] == "pin"
if model == "gelu-tanh":
    m, loss, opt = approximate_gelu_transformer()
else:
    zm = get_entry(model).build()
    m, loss, opt = zm.model, zm.loss, zm.optimizer
cap = capture(m, loss=loss, optimizer=opt, batch_size=2)
plan = plan_for(cap, PlanParams(sync_out=True, serialize=True, backward_swaps=True))
tuned = apply_plan(cap, plan, pin_order=pin)
tuned(*example_tensors(cap.specs))
print(json.dumps({"swaps": len(plan.swaps)}))
"""

FAILURE = "optimization failure"


@pytest.mark.parametrize("pin", ["pin", "free"])
@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-unet3d", "tiny-transformer", "gelu-tanh"])
def test_the_tuned_step_is_optimized_by_grappler(model: str, pin: str) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, model, pin], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["swaps"] > 0
    failures = [line for line in out.stderr.splitlines() if FAILURE in line or "failed:" in line]
    assert not failures, failures
