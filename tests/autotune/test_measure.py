import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

SCRIPT = """
import tensorflow as tf
import autotune
from autotune.zoo import get_entry
zm = get_entry("tiny-cnn").build()
try:
    autotune.measure(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=2)
except autotune.MeasurementError as err:
    print("ERR", err)
"""


def test_measure_without_bfc_says_how_to_set_it_up() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "ERR" in out.stdout and "TF_CPU_ALLOCATOR_USE_BFC=true" in out.stdout


def test_measured_peak_exceeds_resident() -> None:
    from tests.autotune.cli_helpers import cli_json

    args = ("--model", "tiny-cnn", "--batch-size", "8", "--repeats", "2", "--warmup-steps", "2")
    m = cli_json("measure", *args)
    assert m["device"] == "CPU:0" and len(m["peaks"]) == 2 and m["warmup_steps"] == 2
    assert m["peak_bytes"] > m["resident_bytes"] > 8 * 32 * 32 * 3 * 4
    times = m["steps_seconds"]
    assert len(times) == 2 and min(times) > 0 and m["step_seconds"] == sum(times) / 2


COUNTED = """
from autotune.run.measure import prepare_measurement
prepare_measurement()
import tensorflow as tf
import autotune
runs = tf.Variable(0)

@tf.function
def step(x):
    runs.assign_add(1)
    return tf.reduce_sum(x * x)

m = autotune.measure(step, tf.TensorSpec([64, 64]), warmup=5, repeats=2)
print("RUNS", int(runs.numpy()), m.warmup_steps, len(m.peaks))
try:
    autotune.measure(step, tf.TensorSpec([64, 64]), warmup=0)
except ValueError as err:
    print("ERR", err)
"""


def test_measure_runs_its_warm_up_steps_before_the_measured_ones() -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", COUNTED], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "RUNS 7 5 2" in out.stdout  # 5 warm-up steps, then 2 measured
    assert "ERR warmup=0 and repeats=3: each must be at least 1" in out.stdout
