"""The GPU-mode graph on two logical CPUs: CPU:1 stands in for the host, CPU:0 for the GPU."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

SCRIPT = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
import numpy as np
from autotune.api import capture
from autotune.measure import example_tensors
from autotune.verify import executed_swap_ops
from autotune.zoo import get_entry
from rewriter.apply import apply_plan
from rewriter.plan import PlanContext, PlanParams, derive_plan
a, b = get_entry("tiny-cnn").build(seed=5), get_entry("tiny-cnn").build(seed=5)
ca = capture(a.model, loss=a.loss, optimizer=a.optimizer, batch_size=4)
cb = capture(b.model, loss=b.loss, optimizer=b.optimizer, batch_size=4)
plan = derive_plan(PlanContext.build(cb.graph), PlanParams())
tuned = apply_plan(cb, plan, mode="device", compute_device="/device:CPU:0",
                   host_device="/device:CPU:1")
inputs = example_tensors(ca.specs, seed=2)
executed = executed_swap_ops(tuned, *inputs)
la = ca.concrete_function(*inputs)
same = all(np.array_equal(np.asarray(x), np.asarray(y))
           for x, y in zip(a.model.weights, b.model.weights))
print(json.dumps({"planned": list(tuned.swap_ops), "executed": executed, "same": same}))
"""


def test_swap_ops_run_on_the_host_device_and_survive_optimization() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    planned, executed = result["planned"], result["executed"]
    assert planned and set(planned) == set(executed)
    for name, device in executed.items():
        want = "CPU:1" if name.startswith("swap_out/") else "CPU:0"
        assert device.endswith(want), (name, device)
    assert result["same"]
