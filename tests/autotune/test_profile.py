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


@pytest.mark.tf
def test_a_gpu_kernel_is_timed_for_the_op_that_launched_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The GPU planes of a trace, as CUPTI writes them (nothing here has run on a GPU): each
    kernel names its op through a stat, inline or by reference, possibly nested and with
    TraceMe's metadata; kernels of other ops and host planes are left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from autotune.run.profile import _gpu_events

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/device:GPU:0")
    plane.stat_metadata[1].name = "level 0"
    plane.stat_metadata[2].name = "tf_op"
    plane.stat_metadata[3].name = "step::conv/Conv2D:Conv2D"
    line = plane.lines.add(timestamp_ns=1000)
    kernels = [
        (1, "conv/Conv2D:Conv2D#id=3#", 0, 100_000),  # an annotation with metadata
        (2, None, 200_000, 50_000),  # tf_op by reference to a nested name
        (1, "dense/MatMul:MatMul", 300_000, 20_000),
        (1, "other/Relu:Relu", 400_000, 10_000),
    ]
    for key, text, offset, duration in kernels:
        event = line.events.add(offset_ps=offset, duration_ps=duration)
        stat = event.stats.add(metadata_id=key)
        if text is None:
            stat.ref_value = 3
        else:
            stat.str_value = text
    space.planes.add(name="/host:CPU").lines.add().events.add(duration_ps=5)
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(space.SerializeToString())
    events = _gpu_events(str(path), {"conv/Conv2D", "dense/MatMul"})
    assert [(name, seconds) for _, name, seconds in events] == [
        ("conv/Conv2D", 1e-7),
        ("conv/Conv2D", 5e-8),
        ("dense/MatMul", 2e-8),
    ]
