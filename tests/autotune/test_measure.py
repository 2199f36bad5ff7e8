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

    m = cli_json("measure", "--model", "tiny-cnn", "--batch-size", "8", "--repeats", "2")
    assert m["device"] == "CPU:0" and len(m["peaks"]) == 2
    assert m["peak_bytes"] > m["resident_bytes"] > 8 * 32 * 32 * 3 * 4
