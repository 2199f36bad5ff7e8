"""Apply a swap plan to the real TensorFlow graph and hand back a tuned step.

The captured function's GraphDef is imported into a `wrap_function` graph with every captured
variable handle mapped in; for each swapped tensor a swap-out op is added, swap-in ops with a
control dependency on their trigger, and the plan's readers are rerouted to the swap-ins; the
plan's order edges become control edges. Swap ops carry `_grappler_do_not_remove`, so
TensorFlow's graph optimizer keeps them (it removes plain Identity swap ops otherwise).

Two modes. `device`: swap-out and swap-in are Identity ops on the host device, the trigger's
control edge on the host-side swap-in, as IBM's TFLMS v2 did. The compute device then receives
the tensor only when the host sends it, after the trigger ran: a swap-in placed on the compute
device would not wait, since TensorFlow starts a cross-device receive with the step and copies
on arrival (docs/gpu.md). `emulated`: the swap-out copies the tensor into a Python-side store
and returns a token, the swap-in copies it back, so swapped tensors live outside TensorFlow's
allocator and its peak shows the device-side saving on a CPU-only machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rewriter import hostops
from rewriter.capture import Captured, graph_from_concrete, import_step
from rewriter.devices import device_pair
from rewriter.names import (
    copy_name,
    is_swap_in,
    is_swap_op,
    on_device_name,
    recompute_chain,
    swap_in_name,
    swap_out_name,
)
from simulator import (
    Graph,
    GraphError,
    InvalidPlan,
    Order,
    SwapPlan,
    categorized_order,
    compile_program,
)
from simulator.derive import check_plan
from simulator.errors import UserError
from simulator.opsemantics import PRODUCTS, foldable_ops
from simulator.swap import lower_plan

__all__ = ["MODES", "TunedStep", "apply_plan", "planned_graph", "validate_plan"]

MODES = ("device", "emulated")
_KEEP = "_grappler_do_not_remove"


@dataclass
class TunedStep:
    """A callable with the original step's signature that trains exactly like it, with swaps."""

    function: Any
    plan: SwapPlan
    mode: str
    swap_ops: tuple[str, ...]
    structured_outputs: Any
    variables: list[Any]
    triggers: dict[str, str] = field(default_factory=dict)
    devices: tuple[str | None, str | None] = (None, None)
    specs: tuple[Any, ...] = ()
    #: the products Grappler regroups (`Graph.rewritten`): in the recaptured graph they take
    #: over no swap-in's or recompute copy's buffer, as in the plan's simulation
    #: (`simulator.opsemantics.PRODUCTS`)
    regrouped: frozenset[str] = frozenset()

    def __call__(self, *args: Any) -> Any:
        """Run the step on `args` (converted losslessly to the dtypes it was captured with; at
        the batch it was rewritten for: `autotune.fit`'s result takes any batch)."""
        import tensorflow as tf

        from rewriter.inputs import conform

        inputs = conform(args, self.specs, any_batch=False) if self.specs else args
        flat = self.function(*inputs)
        return tf.nest.pack_sequence_as(self.structured_outputs, flat)

    @property
    def compute_device(self) -> str | None:
        """The device the step computes on in device mode (None: TensorFlow's default)."""
        return self.devices[0]

    @property
    def host_device(self) -> str | None:
        """The device that holds swapped tensors in device mode (None when emulated)."""
        return self.devices[1]

    @property
    def graph_def(self) -> Any:
        """The rewritten GraphDef (before TensorFlow's own optimizations)."""
        return self.function.graph.as_graph_def()

    def recapture(self) -> Graph:
        """The IR of the rewritten graph: swap-outs on the host, swap-ins new device memory."""
        graph = graph_from_concrete(self.function, self.variables)
        for name in self.regrouped & graph.ops.keys():
            op = graph.ops[name]
            kept = (i for i in op.inplace if not _made_by_plan(op.inputs[i]))
            graph.ops[name] = replace(op, inplace=tuple(kept))
        return graph


def _made_by_plan(tensor: str) -> bool:
    """A swap-in's or a recompute copy's output."""
    op = tensor.rpartition(":")[0]
    return is_swap_op(op) or bool(recompute_chain(op))


def validate_plan(captured: Captured, plan: SwapPlan) -> Order:
    """Reject, before anything runs, a plan for another graph or another batch size, one that
    names missing ops or tensors, has a cycle, or reads a tensor while it is only on the host;
    return the categorized order the plan was checked in (its order edges included)."""
    graph = planned_graph(captured, plan, captured.full_graph)
    for swap in plan.swaps:
        tensor = graph.tensors.get(swap.tensor)
        if tensor is None:
            raise InvalidPlan(f"plan swaps tensor {swap.tensor!r}, which is not in this graph")
        if tensor.nbytes != swap.nbytes:
            raise InvalidPlan(
                f"plan was derived where {swap.tensor!r} had {swap.nbytes} B; here it has "
                f"{tensor.nbytes} B: derive the plan for this batch size"
            )
    order = categorized_order(graph)
    check_plan(graph, order, plan)
    lower_plan(compile_program(graph, order), graph, plan)
    return order


def planned_graph(captured: Captured, plan: SwapPlan, graph: Graph | None = None) -> Graph:
    """The captured graph (or `graph`) with the plan's order edges and serial loops (the graph
    the plan was simulated on)."""
    try:
        ordered = (graph or captured.graph).with_control_edges(plan.order_edges)
        return ordered.with_serial_loops(plan.serial_loops)
    except GraphError as err:
        raise InvalidPlan(f"plan's order edges or loops do not fit this graph: {err}") from None


def apply_plan(
    captured: Captured,
    plan: SwapPlan,
    *,
    mode: str = "emulated",
    compute_device: str | None = None,
    host_device: str = "/device:CPU:0",
    pin_order: bool = False,
) -> TunedStep:
    """The tuned step for `plan` (validated first) in `mode` ('device' or 'emulated').

    With `pin_order`, control edges chain the ops in the categorized order the plan was
    simulated in, so TensorFlow runs the schedule the simulator predicted for (its executor
    would otherwise run triggers, and so swap-ins, at other times). The chain keeps oneDNN from
    fusing some kernels, so a pinned step matches the original only to rounding, not bitwise;
    it is off by default.
    """
    import tensorflow as tf

    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "device":
        compute_device, host_device = device_pair(compute_device, host_device)
    order = validate_plan(captured, plan)
    cf = captured.concrete_function
    graph_def = _serial(cf.graph.as_graph_def(), plan.serial_loops)
    names: list[str] = []
    triggers: dict[str, str] = {}

    # a step on several replicas keeps each op on its replica's device
    scope = compute_device if mode == "device" and not captured.replicas else None

    def body(*inputs: Any) -> Any:
        g = tf.compat.v1.get_default_graph()
        with _on(scope):
            out, fed = import_step(cf, graph_def, inputs)
        for before, later in plan.order_edges:
            _wait(g.get_operation_by_name(later), g.get_operation_by_name(before))
        copies: dict[tuple[str, int], Any] = {}
        lists = _lists(captured.full_graph)
        after = _insert_swaps(g, plan, mode, (compute_device, host_device), copies, lists)
        with _on(scope):
            for trigger, ops in _insert_recomputes(g, plan, copies).items():
                after.setdefault(trigger, []).extend(ops)
        names.extend(op.name for ops in after.values() for op in ops)
        triggers.update(_triggers(after))
        if pin_order:
            _pin(g, order.ops, after, fed, foldable_ops(captured.full_graph))
        return out

    function = tf.compat.v1.wrap_function(body, signature=list(captured.specs))
    devices = (compute_device, host_device) if mode == "device" else (None, None)
    outputs, variables = cf.structured_outputs, captured.variables
    graph = captured.full_graph
    kept = frozenset(n for n in graph.rewritten if graph.ops[n].type in PRODUCTS)
    return TunedStep(
        function, plan, mode, tuple(names), outputs, variables, triggers, devices,
        captured.specs, kept,
    )  # fmt: skip


def _triggers(after: dict[str, list[Any]]) -> dict[str, str]:
    """Each swap-in op's name with the name of its trigger, the op it follows in `after`."""
    return {op.name: trigger for trigger, ops in after.items() for op in ops if is_swap_in(op.name)}


def _lists(graph: Graph) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The loops' lists of `graph` whose elements have one dtype and shape, with those."""
    return {
        name: (t.element_dtype, t.shape[1:])
        for name, t in graph.tensors.items()
        if t.dtype == "variant" and t.element_dtype
    }


def _insert_swaps(
    g: Any,
    plan: SwapPlan,
    mode: str,
    devices: tuple[str | None, str],
    copies: dict[tuple[str, int], Any],
    lists: dict[str, tuple[str, tuple[int, ...]]],
) -> dict[str, list[Any]]:
    """Add the swap ops of `plan` to the imported graph `g` and reroute the readers; return
    the swap ops by the op they follow (a swap-out its producer, a swap-in its trigger), and
    put each swap-in's output in `copies` by (tensor, k). A loop's list in `lists` goes to
    the emulated host as the stack of its elements (`hostops`)."""
    import tensorflow as tf

    compute_device, host_device = devices
    after: dict[str, list[Any]] = {}
    for swap in plan.swaps:
        tensor = g.get_tensor_by_name(swap.tensor)
        forward = [op for op in tensor.consumers() if op.name not in swap.rerouted]
        with _on(host_device if mode == "device" else tensor.device):
            element = lists.get(swap.tensor)
            stored = hostops.swap_out(
                tensor, mode, len(swap.swap_ins), swap_out_name(swap.tensor), element
            )
        after.setdefault(tensor.op.name, []).append(_keep(stored))
        waiters = [g.get_operation_by_name(swap.waiter)] if swap.waiter else forward
        for reader in waiters if swap.sync else ():
            _wait(reader, stored.op)
        for k, swap_in in enumerate(swap.swap_ins):
            trigger = g.get_operation_by_name(swap_in.trigger)
            # on the host: the copy back to the device is then sent only once the host-side
            # swap-in has run after its trigger (a device-side swap-in's receive would start
            # the copy as soon as the swap-out is sent, see docs/gpu.md)
            home = host_device if mode == "device" else tensor.device
            with _on(home), tf.control_dependencies([trigger]):
                back = hostops.swap_in(stored, tensor, mode, swap_in_name(swap.tensor, k), element)
            after.setdefault(trigger.name, []).append(_keep(back))
            if mode == "device":
                back = _on_device(back, tensor.device or compute_device)
            copies[(swap.tensor, k)] = back
            for reader in swap_in.consumers:
                _reroute(g.get_operation_by_name(reader), tensor, back)
    return after


def _insert_recomputes(
    g: Any, plan: SwapPlan, copies: dict[tuple[str, int], Any]
) -> dict[str, list[Any]]:
    """Add a copy of each recompute's ops (named `recompute/...`) that waits for its trigger,
    reading the original tensors except where the chain makes its own or reads a swap-in
    (`copies`, by the recompute's sources), and reroute the backward readers to the copy;
    return the copies by trigger. The copies carry the keep
    attribute and a control input the originals lack, so Grappler neither removes them nor
    merges them back into the originals."""
    after: dict[str, list[Any]] = {}
    for k, rc in enumerate(plan.recomputes):
        trigger = g.get_operation_by_name(rc.trigger)
        made: dict[str, Any] = {name: copies[(name, k)] for name, k in rc.sources}
        for name in rc.ops:
            original = g.get_operation_by_name(name)
            inputs = [made.get(t.name, t) for t in original.inputs]
            copy = _copy_op(g, original, inputs, copy_name(name, k))
            copy._add_control_input(trigger)  # (no Pow: not RECOMPUTABLE, see `_wait`)
            made.update(zip((t.name for t in original.outputs), copy.outputs))
            after.setdefault(rc.trigger, []).append(_keep(copy.outputs[0]))
        tensor = g.get_tensor_by_name(rc.tensor)
        for reader in rc.consumers:
            _reroute(g.get_operation_by_name(reader), tensor, made[rc.tensor])
    return after


def _copy_op(g: Any, op: Any, inputs: list[Any], name: str) -> Any:
    """A new op of `op`'s type, attributes (those of TensorFlow, not ours) and device on
    `inputs`."""
    attrs = {k: v for k, v in op.node_def.attr.items() if not k.startswith("_")}
    with _on(op.device):  # a replica's op is copied onto its replica's device
        return g.create_op(op.type, inputs, [t.dtype for t in op.outputs], name=name, attrs=attrs)


def _pin(
    g: Any,
    schedule: tuple[str, ...],
    after: dict[str, list[Any]],
    fed: set[str],
    folded: frozenset[str],
) -> None:
    """Chain the schedule's ops with control edges, each swap op right after the op it follows;
    placeholders that were fed are left out (they no longer run), and so are the ops Grappler
    folds into constants (chained, the folded graph held a cycle and Grappler gave up on it).
    Without the swap ops in the chain, TensorFlow's executor defers them until it stalls."""
    chain = []
    for name in schedule:
        op = g.get_operation_by_name(name)
        if name not in folded and not any(t.name in fed for t in op.outputs):
            chain.append(op)
        chain.extend(after.get(name, ()))
    for before, nxt in zip(chain, chain[1:]):
        _wait(nxt, before)


def _serial(graph_def: Any, loops: tuple[str, ...]) -> Any:
    """`graph_def` with the loops named run one iteration at a time: their results are the
    same (an iteration's ops still run in their data order), only what the executor holds
    for iterations running ahead goes."""
    nodes = {node.name: node for node in graph_def.node}
    for name in loops:
        node = nodes.get(name)
        if node is None or "parallel_iterations" not in node.attr:
            raise InvalidPlan(f"plan runs loop {name!r} serially, which is not a loop here")
        node.attr["parallel_iterations"].i = 1
    return graph_def


def _wait(op: Any, before: Any) -> None:
    """Make `op` wait for `before` with a control edge. A Pow with a constant exponent gets it
    through the exponent: Grappler's arithmetic optimizer turns x**3 on a CPU into x * x**2 by
    copying the Pow and dropping its last input, taken to be the exponent, so a control input
    on the Pow made the copy a one-input Square with two inputs and the whole function ran
    unoptimized (`ConvertPow__inner_Pow ... does not exist`)."""
    exponent = op.inputs[1].op if op.type == "Pow" else None
    target = exponent if exponent is not None and exponent.type == "Const" else op
    target._add_control_input(before)


def _on(device: str | None) -> Any:
    """A device scope, or none."""
    import contextlib

    import tensorflow as tf

    return tf.device(device) if device else contextlib.nullcontext()


def _on_device(host_copy: Any, compute_device: str | None) -> Any:
    """What a device-mode swap-in's readers read: the swap-in's output received on the compute
    device. Grappler regroups a product with a constant only where both of its other inputs
    are on the product's device (`ConstantPushDown`): a reader fed from the host directly
    computed GELU's backward in another order than the original, and rounded otherwise."""
    import tensorflow as tf

    with _on(compute_device):
        received = tf.identity(host_copy, name=on_device_name(host_copy.op.name))
    _keep(received)
    return received


def _keep(t: Any) -> Any:
    """Mark the op of `t` so that Grappler preserves it."""
    from tensorflow.core.framework import attr_value_pb2

    t.op._set_attr(_KEEP, attr_value_pb2.AttrValue(b=True))
    return t.op


def _reroute(op: Any, old: Any, new: Any) -> None:
    for i, t in enumerate(op.inputs):
        if t.name == old.name:
            op._update_input(i, new)
