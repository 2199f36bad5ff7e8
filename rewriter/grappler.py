"""TensorFlow's own static estimates through Grappler's virtual cluster: our peer."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["grappler_peak"]


def _item(cf: Any) -> Any:
    import tensorflow as tf
    from tensorflow.python.grappler import item as gitem

    graph = cf.graph
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
    fetch = meta.collection_def["train_op"]
    fetch.node_list.value.extend(t.name for t in cf.outputs)
    return gitem.Item(meta)


def grappler_peak(
    cf: Any, *, device: str = "/job:localhost/replica:0/task:0/device:CPU:0"
) -> tuple[int, float]:
    """(peak bytes, seconds) from `Cluster.DeterminePeakMemoryUsage` for a concrete function."""
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import cluster as gcluster

    item = _item(cf)
    props = device_properties_pb2.DeviceProperties(type="CPU", num_cores=1, frequency=2000)
    named = device_properties_pb2.NamedDevice(name=device, properties=props)
    cluster = gcluster.Cluster(devices=[named])
    start = time.perf_counter()
    peaks = cluster.DeterminePeakMemoryUsage(item)
    seconds = time.perf_counter() - start
    return int(max(v[0] for v in peaks.values())), seconds
