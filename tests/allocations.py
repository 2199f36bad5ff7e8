"""The requests TensorFlow's CPU allocator served during one call, by the op that made each: what
the tests of the kernels' memory check the model against. For a fresh process that called
`autotune.prepare_measurement()` (the BFC allocator reports only then)."""

from __future__ import annotations

import collections
import glob
import tempfile
from collections.abc import Callable
from typing import Any


def recorded_requests(call: Callable[[], Any]) -> dict[str, list[tuple[str, int]]]:
    """Run `call()` under the profiler; per op, (region type, requested bytes) of each
    allocation it made, in order. Region types are "output" and "temp"."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp()
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
    tf.profiler.experimental.start(logdir, options=options)
    call()
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    out: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for plane in space.planes:
        names, stats = plane.event_metadata, plane.stat_metadata
        for line in plane.lines:
            for e in line.events:
                if names[e.metadata_id].name != "MemoryAllocation":
                    continue
                s = {stats[x.metadata_id].name: x for x in e.stats}
                if "tf_op" in s and "region_type" in s:
                    text = {k: s[k].str_value or stats[s[k].ref_value].name for k in s}
                    n = s["requested_bytes"].int64_value or s["requested_bytes"].uint64_value
                    out[text["tf_op"]].append((text["region_type"], n))
    return out
