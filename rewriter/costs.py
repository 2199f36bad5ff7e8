"""Per-op compute times from TensorFlow's analytical cost model, for a device preset.

Grappler's virtual cluster (`Cluster.MeasureCosts`) estimates each node's compute cost from its
shapes and the device's properties (SM count, clock, memory bandwidth); nodes must carry a GPU
device name to get GPU estimates.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from simulator.devices import DevicePreset

__all__ = ["grappler_costs", "step_costs"]

_LOG = logging.getLogger("autotune")
_NOTED: set[str] = set()  # notes said already, each once a process
_DEVICE = "/job:localhost/replica:0/task:0/device:{}:0"


def grappler_costs(cf: Any, preset: DevicePreset) -> tuple[dict[str, float], float]:
    """({op name: seconds}, seconds the estimate took) for the concrete function `cf`, on the
    preset's GPU or, for a calibrated CPU (`preset.kind`), its cores at its clock."""
    import tensorflow as tf
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import item as gitem

    graph_def = cf.graph.as_graph_def()
    _known_variable_reads(graph_def, cf.graph)
    device = _DEVICE.format(preset.kind)
    for node in graph_def.node:
        node.device = device
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=cf.graph)
    meta.collection_def["train_op"].node_list.value.extend(t.name for t in cf.outputs)
    props = device_properties_pb2.DeviceProperties(
        type=preset.kind,
        vendor="NVIDIA" if preset.kind == "GPU" else "",
        frequency=preset.clock_mhz,
        num_cores=preset.sm_count,
        memory_size=1 << 50,  # costs do not depend on it; the real limit would refuse big graphs
        bandwidth=int(preset.memory_bandwidth_bytes_per_s / 1000),  # KB/s, as Grappler wants
        environment={"architecture": "7", "cuda": "11000", "cudnn": "8000"},
    )
    named = device_properties_pb2.NamedDevice(name=device, properties=props)
    cluster = gcluster.Cluster(devices=[named])
    start = time.perf_counter()
    op_perfs, _, _ = cluster.MeasureCosts(gitem.Item(meta))
    seconds = time.perf_counter() - start
    return {p.node: p.compute_cost * 1e-9 for p in op_perfs}, seconds


def step_costs(captured: Any, preset: DevicePreset, graph: Any = None) -> dict[str, float]:
    """Per-op seconds of a captured step (of `graph`, by default the captured graph) on
    `preset`: from its calibration where it has one (`autotune calibrate`), else Grappler's."""
    if preset.calibration is None:
        costs = grappler_costs(captured.concrete_function, preset)[0]
        return _with_loops(costs, captured.concrete_function.graph, graph or captured.graph, preset)
    estimate = None
    if preset.sm_count and preset.clock_mhz:
        estimate = lambda: grappler_costs(captured.concrete_function, preset)[0]  # noqa: E731
    costs = preset.calibration.costs(graph or captured.graph, estimate)
    if costs.by_type or costs.estimated or costs.unpriced or costs.switched:
        note(f"op times: {costs.note}")
    note(_versionnote(preset.calibration.tensorflow))
    return dict(costs.seconds)


def _with_loops(
    costs: dict[str, float], fg: Any, graph: Any, preset: DevicePreset
) -> dict[str, float]:
    """`costs` with each loop of `graph` priced as its trip count times its body's ops, and
    each branch op as its costliest branch (Grappler prices either op itself as one cheap op;
    which branch runs depends on the data)."""
    from types import SimpleNamespace

    from rewriter.branches import BRANCH_TYPES
    from rewriter.loops import Loops
    from simulator.opsemantics import LOOP_TYPES

    loops = Loops(fg)

    def priced(function: str) -> float:
        body = loops.function(function)
        step = SimpleNamespace(graph=body, outputs=body.outputs)
        return sum(grappler_costs(step, preset)[0].values())

    for name, op in graph.ops.items():
        if op.type in LOOP_TYPES and len(op.calls) == 2:
            costs[name] = costs.get(name, 0.0) + op.repeats * priced(op.calls[1])
        elif op.type in BRANCH_TYPES and op.calls:
            costs[name] = costs.get(name, 0.0) + max(priced(f) for f in op.calls)
    return costs


def note(text: str) -> None:
    """Say `text` on stderr once a process (nothing when empty)."""
    if text and text not in _NOTED:
        _NOTED.add(text)
        _LOG.warning("autotune: note: %s", text)


def _versionnote(calibrated: str) -> str:
    """What to say when the profile was taken with another TensorFlow: its kernels, and so
    its op times, may differ."""
    import tensorflow as tf

    if calibrated == tf.__version__:
        return ""
    return (
        f"the calibration profile was taken with TensorFlow {calibrated}, this is "
        f"{tf.__version__}: its kernels may take other times; calibrate again"
    )


def _known_variable_reads(graph_def: Any, fg: Any) -> None:
    """Turn each variable read into a placeholder of the variable's shape. Grappler's shape
    inference cannot see through a captured resource handle, so without this every op that
    reads a weight (MatMul, Conv2D's filter) has an unknown shape and no estimated cost."""
    shapes = {
        op.name: op.outputs[0].shape
        for op in fg.get_operations()
        if op.type == "ReadVariableOp" and op.outputs[0].shape.is_fully_defined()
    }
    for node in graph_def.node:
        if node.name in shapes:
            dtype = node.attr["dtype"].type
            node.op = "Placeholder"
            del node.input[:]
            node.attr.clear()
            node.attr["dtype"].type = dtype
            node.attr["shape"].shape.CopyFrom(shapes[node.name].as_proto())
