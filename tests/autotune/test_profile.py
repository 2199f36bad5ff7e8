"""The allocator model against TensorFlow's own allocator, request by request.

A fresh process records every request its CPU BFC allocator serves (the profiler's memory
events, from before the model is built to the end of a measured step), and the model replays
them: it must reach the allocator's own peak over the step to the byte. Unlike the accuracy
tests, this needs no assumption about which tensors a step holds and when, so it checks the
allocator model alone (best fit, splitting, coalescing, region growth).
"""

import json
import os
import subprocess
import sys

import pytest

from simulator import Request, replay_history

pytestmark = [pytest.mark.tf, pytest.mark.slow]

_RECORD = r"""
import json, sys
from autotune.run.measure import example_tensors, prepare_measurement
prepare_measurement()
from autotune.api import capture
from autotune.run.profile import record_allocation_history
from autotune.zoo import get_entry

def build():
    zm = get_entry(sys.argv[1]).build(cube=None)
    cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=int(sys.argv[2]))
    return cap.concrete_function, example_tensors(cap.specs)

h = record_allocation_history(build)
print(json.dumps({"requests": h.requests, "start": h.step_start, "peak": h.peak_bytes}))
"""


@pytest.mark.parametrize(
    "model,batch", [("tiny-cnn", 32), ("tiny-unet3d", 2), ("tiny-transformer", 16)]
)
def test_the_model_replays_a_recorded_step_to_the_allocators_own_peak(
    model: str, batch: int
) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, "-c", _RECORD, model, str(batch)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    h = json.loads(out.stdout.splitlines()[-1])
    requests = [Request(*r) for r in h["requests"]]
    step = requests[h["start"] :]
    assert sum(r.allocated for r in step) >= 20, "the measured step's requests were not recorded"
    assert replay_history(requests, h["start"]) == h["peak"]
