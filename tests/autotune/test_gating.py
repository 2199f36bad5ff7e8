"""The GPU form of the tuned step, run on two logical CPUs (CPU:0 computes, CPU:1 is the host),
checked from what TensorFlow executed: partition graphs and a profiled step."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

PRELUDE = """
import json, os, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from autotune.run.verify import use_two_cpus
use_two_cpus()
import numpy as np
from autotune.run.gating import check_gating, executed_partitions
from autotune.run.profile import trace_ops
from rewriter.apply import TunedStep, apply_plan
"""

CNN = (
    PRELUDE
    + """
from autotune.api import capture
from autotune.run.measure import example_tensors
from autotune.zoo import get_entry
from simulator.derive import PlanContext, PlanParams, derive_plan
a, b = get_entry("tiny-cnn").build(seed=5), get_entry("tiny-cnn").build(seed=5)
ca = capture(a.model, loss=a.loss, optimizer=a.optimizer, batch_size=4)
cb = capture(b.model, loss=b.loss, optimizer=b.optimizer, batch_size=4)
plan = derive_plan(PlanContext.build(cb.graph), PlanParams())
tuned = apply_plan(cb, plan, mode="device", compute_device="/device:CPU:0",
                   host_device="/device:CPU:1")
inputs = example_tensors(ca.specs, seed=2)
parts = executed_partitions(tuned, *inputs)
report = check_gating(tuned, parts, inputs)  # a second step, profiled
for _ in range(2):
    ca.concrete_function(*inputs)
devices = {n.name: n.device for pg in parts for n in pg.node if n.name in set(tuned.swap_ops)}
same = all(np.array_equal(np.asarray(x), np.asarray(y))
           for x, y in zip(a.model.weights, b.model.weights))
print(json.dumps({"planned": list(tuned.swap_ops), "executed": devices, "same": same,
                  "report": report.to_dict(), "swap_ins": len(tuned.triggers)}))
"""
)

SLOW = (
    PRELUDE
    + """
from autotune.api import capture
from simulator import Swap, SwapIn, SwapPlan

def slow(a):
    time.sleep(0.3)
    return a

def body(x, wrong=False):
    y = tf.math.square(x, name="produce")
    s = tf.numpy_function(slow, [tf.reduce_sum(y)], tf.float32, stateful=True, name="slow")
    s.set_shape([])
    if wrong:  # the swap-in on the compute device, as the rewriter once placed it
        with tf.device("/device:CPU:1"):
            out = tf.identity(y, name="swap_out/produce_0")
        with tf.device("/device:CPU:0"), tf.control_dependencies([s]):
            y = tf.identity(out, name="produce/swap_in_0_0")
        for t in (out, y):
            t.op._set_attr("_grappler_do_not_remove", tf.compat.v1.AttrValue(b=True))
    return tf.reduce_sum(tf.math.multiply(y, s, name="reader"), name="out")

x = tf.random.normal([256, 256])
step = tf.function(body)
plan = SwapPlan((Swap("produce:0", 256 * 256 * 4, (SwapIn("slow", ("reader",)),)),))
result = {}
tuned = apply_plan(capture(step, x), plan, mode="device", compute_device="/device:CPU:0",
                   host_device="/device:CPU:1")
wrong_fn = tf.function(lambda x: [body(x, wrong=True)]).get_concrete_function(x)
wrong = TunedStep(wrong_fn, plan, "device", (), [0], [], tuned.triggers, tuned.devices)
for name, t in (("host", tuned), ("compute", wrong)):
    report = check_gating(t, executed_partitions(t, x), [x])
    t(x)
    events = trace_ops(lambda: t(x), {"slow", "reader"}, "time", host_tracer_level=3)
    end = max(s * 1e-12 + d for s, n, d in events if n == "slow")
    start = min(s * 1e-12 for s, n, d in events if n == "reader")
    result[name] = {"report": report.to_dict(), "reader_after_trigger": start - end}
print(json.dumps(result))
"""
)


def _run(script: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_swap_ins_on_the_host_wait_for_their_triggers_and_train_alike() -> None:
    result = _run(CNN)
    planned, executed = result["planned"], result["executed"]
    assert planned and set(planned) == set(executed)  # Grappler kept every swap op
    assert all(device.endswith("device:CPU:1") for device in executed.values()), executed
    report = result["report"]
    assert report["swap_ins"] == result["swap_ins"] > 0
    assert report["gated"] == report["swap_ins"] and not report["leaks"]
    for gate in report["gates"]:
        assert gate["waits_for"] and gate["lag_seconds"] is not None, gate
        assert gate["lag_seconds"] >= 0, gate
    assert result["same"]


def test_a_slow_trigger_holds_the_copy_back_only_when_the_swap_in_is_on_the_host() -> None:
    result = _run(SLOW)
    host, compute = result["host"]["report"], result["compute"]["report"]
    assert host["gated"] == host["swap_ins"] == 1 and not host["leaks"]
    (gate,) = host["gates"]
    assert gate["waits_for"] == ["slow"] and gate["lag_seconds"] >= 0
    assert result["host"]["reader_after_trigger"] >= 0
    # the device-side swap-in: the compute device receives the swap-out's output directly
    assert compute["gated"] == 0 and compute["leaks"] == ["swap_out/produce_0"]
    assert compute["gates"][0]["reason"] == "runs on the compute device"
