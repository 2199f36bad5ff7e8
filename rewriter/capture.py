"""Capture a TensorFlow 2 training step into the framework-free IR, with exact tensor sizes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from rewriter import branches
from rewriter.cpukernels import CPU_SCRATCH_TYPES, cpu_kernels, cpu_scratch_bytes
from rewriter.kernels import inplace_order, kernel_scratch
from rewriter.loops import Loop, LoopError, Loops
from rewriter.names import is_host_copy, is_swap_op, on_device_name
from rewriter.shapes import inferred_shape
from simulator.errors import UserError
from simulator.graph import Graph, Op, Tensor, TensorKind
from simulator.opsemantics import assignment, forwards

__all__ = [
    "CaptureError",
    "Captured",
    "capture_function",
    "function_refs",
    "import_step",
    "to_specs",
]

_CALL_ATTRS = ("f", "then_branch", "else_branch", "cond", "body", "branches")


class CaptureError(UserError):
    """The step cannot be captured as given; the message says what to supply."""


@dataclass
class Captured:
    """A captured step: the IR plus the TensorFlow objects a rewrite needs later."""

    graph: Graph
    concrete_function: Any
    specs: tuple[Any, ...]
    variables: list[Any]
    trace_seconds: float
    #: for a step run under a strategy: how to call it, and the step of all replicas (`graph`
    #: is then replica 0's share, and `replicas` every replica's, `rewriter.replicas`)
    distributed: Any = None
    whole: Graph | None = None
    replicas: tuple[Graph, ...] = ()

    @property
    def full_graph(self) -> Graph:
        """The graph of the whole step: every replica's ops under a strategy."""
        return self.whole or self.graph


def to_specs(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """TensorSpecs for example arguments given as tensors, arrays or specs."""
    import tensorflow as tf

    specs = []
    for i, a in enumerate(args):
        if isinstance(a, tf.TensorSpec):
            specs.append(a)
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            specs.append(tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=f"arg{i}"))
        else:
            raise CaptureError(
                f"example argument {i} is a {type(a).__name__}; "
                "give a tensor, array or tf.TensorSpec"
            )
    return tuple(specs)


def capture_function(
    step: Callable[..., Any], *example_args: Any, distributed: Any = None
) -> Captured:
    """Trace `step` (a tf.function or a plain callable, which is wrapped) and build its IR.
    With `distributed` (`rewriter.replicas.Distributed`), `step` runs `strategy.run` itself
    and `example_args` are each replica's tensors, replica by replica."""
    import tensorflow as tf

    fn = step if hasattr(step, "get_concrete_function") else tf.function(step)
    specs = to_specs(example_args)
    start = time.perf_counter()
    cf = fn.get_concrete_function(*specs)
    seconds = time.perf_counter() - start
    graph = graph_from_concrete(cf)
    graph.rewritten_later(lambda: _rewritten(cf, graph))
    if distributed is None:
        return Captured(graph, cf, specs, list(cf.variables), seconds)
    from rewriter.replicas import replica_graphs

    replicas = replica_graphs(cf, graph, distributed.devices)
    return Captured(
        replicas[0], cf, specs, list(cf.variables), seconds, distributed, graph, replicas
    )


def _rewritten(cf: Any, graph: Graph) -> frozenset[str]:
    """The ops of `graph` Grappler rewrites (`rewriter.optimized.rewritten_ops`) for the
    device the step will run on: the first GPU if TensorFlow sees one, else the CPU."""
    import tensorflow as tf

    from rewriter.optimized import rewritten_ops

    device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    return rewritten_ops(cf, device) & graph.ops.keys()


def import_step(cf: Any, graph_def: Any, inputs: tuple[Any, ...]) -> tuple[Any, set[str]]:
    """Import `graph_def` (the graph of step `cf`, rewritten or optimized) into the default
    graph with the step's arguments fed from `inputs` and its variable handles mapped in; return
    its outputs and the names of the placeholders that were fed."""
    import tensorflow as tf

    g, fg = tf.compat.v1.get_default_graph(), cf.graph
    handles = {ph.name: h for ph, h in zip(fg.internal_captures, fg.external_captures)}
    # values the step takes anew at each call (a collective's instance key, under a strategy)
    deferred = (ph.name for ph in fg.deferred_internal_captures)
    later = dict(zip(deferred, fg.deferred_external_captures))
    args = [t.name for t in fg.inputs if t.name not in handles and t.name not in later]
    present = {node.name for node in graph_def.node}
    input_map = {a: x for a, x in zip(args, inputs) if a.split(":")[0] in present}
    input_map.update({n: g.capture(h) for n, h in handles.items() if n.split(":")[0] in present})
    for ph in fg.deferred_internal_captures:
        if ph.op.name in present:
            spec = tf.TensorSpec(ph.shape, ph.dtype)
            value = later[ph.name]  # returns its value as a list of tensors
            input_map[ph.name] = g.capture_call_time_value(lambda v=value: v()[0], spec)
    outputs = tf.graph_util.import_graph_def(
        graph_def, input_map=input_map, return_elements=[t.name for t in cf.outputs], name=""
    )
    return outputs, set(input_map)


def graph_from_concrete(cf: Any, variables: list[Any] | None = None) -> Graph:
    """The IR of a concrete function: ops, tensors with bytes, variables sized from real ones
    (`variables`, for a function that does not list the variables it captures)."""
    kinds = _placeholder_kinds(cf, list(cf.variables) if variables is None else variables)
    return graph_from_func_graph(cf.graph, kinds)


def graph_from_func_graph(
    fg: Any, kinds: dict[str, tuple[TensorKind, int | None]], root: Any = None
) -> Graph:
    """The IR of a function graph whose placeholders are of `kinds`; loops in it are sized
    (`rewriter.loops`), with `root` the step's graph whose library holds their functions."""
    graph = Graph(fg.name)
    graph.functions = [f.signature.name for f in fg.as_graph_def().library.function]
    live = _live(fg)
    loops = Loops(fg, root)
    for tf_op in _topological([op for op in fg.get_operations() if op.name in live]):
        _refuse_loop(tf_op)
        try:
            loop = loops.visit(tf_op)
            if loop is not None:
                loop = _with_body_scratch(loop, root if root is not None else fg)
            branch = _branch_scratch(tf_op, loops, root if root is not None else fg)
        except (LoopError, branches.BranchError) as err:
            raise CaptureError(str(err)) from None
        tensors = [_tensor(t, kinds, loops) for t in tf_op.outputs]
        op = _op(tf_op, loop)
        graph.add_op(op if branch is None else replace(op, scratch=branch), tensors)
    for name in loops.shared & graph.tensors.keys():  # made before the loop that shares it
        graph.tensors[name].element_dtype = ""
    graph.mark_outputs([t.name for t in fg.outputs if t.name in graph.tensors])
    graph.lint()
    return graph


def _with_body_scratch(loop: Loop, root: Any) -> Loop:
    """`loop` with the working set of one iteration of its body: the live peak of the body
    above its loop variables (which the loop op's inputs and outputs count)."""
    inner = _function_ir(loop.body, root)
    return replace(loop, body_scratch=_working_set(inner))


def _branch_scratch(tf_op: Any, loops: Loops, root: Any) -> int | None:
    """For a branch op, the largest working set of its branches, above what they read and
    return (the op's inputs and outputs count those); the bytes its optionals keep for the
    gradient go to `loops.list_bytes` (`rewriter.branches`). None for any other op."""
    if tf_op.type not in branches.BRANCH_TYPES:
        return None
    bodies = [loops.function(name) for name in branches.branch_functions(tf_op)]
    for i, nbytes in branches.kept_bytes(tf_op, bodies).items():
        loops.list_bytes[tf_op.outputs[i].name] = nbytes

    def size(body: Any) -> int:  # what it returns (its values kept for the gradient too) counts
        inner = _function_ir(body, root)
        returned = sum(inner.tensors[t].nbytes for t in inner.outputs)
        return _working_set(inner, returned + branches.wrapped_bytes(tf_op, body))

    return branches.largest_working_set(tf_op, bodies, size)


def _function_ir(fg: Any, root: Any) -> Graph:
    """The IR of a function of the step (a loop body, a branch), with its arguments as inputs."""
    kinds: dict[str, tuple[TensorKind, int | None]] = {
        t.name: (TensorKind.INPUT, None) for t in fg.inputs
    }
    return graph_from_func_graph(fg, kinds, root)


def _working_set(inner: Graph, returned: int = 0) -> int:
    """The live peak of function IR `inner` above its arguments and `returned` bytes."""
    from simulator.memory import simulate_memory
    from simulator.program import compile_program

    sim = simulate_memory(compile_program(inner))
    return max(0, sim.live_peak_bytes - sim.persistent_bytes - returned)


def _live(fg: Any) -> set[str]:
    """Names of the ops the function really runs: ancestors (data and control) of its outputs
    and control outputs. TensorFlow prunes the other ops before it runs the function; keeping
    them would count memory that is never allocated and offer swap candidates for nothing."""
    roots = [t.op for t in fg.outputs] + list(getattr(fg, "control_outputs", []))
    live: set[str] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in live:
            continue
        live.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return live


#: Ops of a loop capture does not size: the frame ops of a loop Grappler lowered, whose back
#: edge closes a cycle (capture reads the functional `While` of the step's own graph)
LOOP_TYPES = frozenset({"NextIteration", "RefNextIteration"})
_UNROLL = (
    "loops lowered to frames are not simulated: capture the step's function graph, whose "
    "loops are functional While ops, or unroll the loop"
)


def _refuse_loop(tf_op: Any) -> None:
    if tf_op.type in LOOP_TYPES:
        raise CaptureError(f"op {tf_op.name!r} ({tf_op.type}) runs a loop; {_UNROLL}")


def _topological(ops: list[Any]) -> list[Any]:
    """`ops` reordered so that every op follows its data and control predecessors, stably;
    CaptureError naming an op of a cycle (a lowered loop's back edge) if there is one."""
    done: set[str] = set()
    out: list[Any] = []
    for root in ops:
        stack = [(root, False)]
        open_: set[str] = set()  # expanded, not done: the path being walked
        while stack:
            op, expanded = stack.pop()
            if op.name in done:
                continue
            if expanded:
                done.add(op.name)
                open_.discard(op.name)
                out.append(op)
                continue
            if op.name in open_:
                raise CaptureError(f"op {op.name!r} ({op.type}) is on a cycle; {_UNROLL}")
            open_.add(op.name)
            stack.append((op, True))
            preds = [t.op for t in op.inputs] + list(op.control_inputs)
            stack.extend((p, False) for p in reversed(preds) if p.name not in done)
    return out


def _placeholder_kinds(cf: Any, variables: list[Any]) -> dict[str, tuple[TensorKind, int | None]]:
    """Kind (and, for variables, storage bytes) of each placeholder of the function graph."""
    by_handle = {id(v.handle): v for v in variables}
    kinds: dict[str, tuple[TensorKind, int | None]] = {}
    # (not `cf.captured_inputs`: that takes a call-time value, a collective's next key, anew)
    for ext, internal in zip(cf.graph.external_captures, cf.graph.internal_captures):
        var = by_handle.get(id(ext))
        if var is not None:
            kinds[internal.name] = (TensorKind.VARIABLE, _variable_bytes(var))
        elif internal.dtype.name in ("resource", "variant"):
            kinds[internal.name] = (TensorKind.HANDLE, 0)
        else:
            kinds[internal.name] = (TensorKind.CONSTANT, None)
    for t in cf.graph.inputs:
        kinds.setdefault(t.name, (TensorKind.INPUT, None))
    return kinds


def _variable_bytes(var: Any) -> int:
    shape = var.shape
    if not shape.is_fully_defined():
        raise CaptureError(f"variable {var.name!r} has shape {shape}; build the model first")
    return int(shape.num_elements()) * var.dtype.size


def _received_only(t: Any) -> bool:
    """A device-mode swap-in's output, on the host: the compute device reads its receipt."""
    readers = t.consumers()
    return bool(readers) and all(r.name == on_device_name(t.op.name) for r in readers)


def _tensor(t: Any, kinds: dict[str, tuple[TensorKind, int | None]], loops: Loops) -> Tensor:
    kind, nbytes = kinds.get(t.name, (None, None))
    if kind is None:
        kind = TensorKind.CONSTANT if t.op.type == "Const" else TensorKind.TRANSIENT
    if is_host_copy(t.op.name) or _received_only(t):
        kind = TensorKind.HOST
    if t.dtype.name == "variant" and loops.list_bytes.get(t.name, 0) > 0:
        return loops.list_tensor(t)
    if t.dtype.name in ("resource", "variant") or t.op.type in _LIST_ELEMENT:
        if kind is not TensorKind.VARIABLE:
            kind, nbytes = TensorKind.HANDLE, 0
        return Tensor(t.name, t.dtype.name, (), nbytes or 0, t.op.name, kind)
    shape = t.shape
    if not shape.is_fully_defined():
        shape = inferred_shape(t)
    if shape.rank is None or not shape.is_fully_defined():
        raise CaptureError(
            f"tensor {t.name!r} of op {t.op.name!r} ({t.op.type}) has shape {shape}: "
            "give a batch size or fully defined input shapes (tf.TensorSpec with no None)"
        )
    if t.dtype.name == "string":
        raise CaptureError(
            f"tensor {t.name!r} of op {t.op.name!r} ({t.op.type}) is a string, whose size is "
            "unknown before it runs; keep strings out of the training step"
        )
    dims = tuple(int(d) for d in shape.as_list())
    return Tensor(
        t.name, t.dtype.name, dims, int(shape.num_elements()) * t.dtype.size, t.op.name, kind
    )


_LIST_ELEMENT = frozenset({"TensorListGetItem", "TensorListPopBack"})


def _op(tf_op: Any, loop: Loop | None = None) -> Op:
    n_in, n_out = len(tf_op.inputs), len(tf_op.outputs)
    swap = is_swap_op(tf_op.name)  # copies between host and device: never aliases
    op = Op(
        name=tf_op.name,
        type=tf_op.type,
        inputs=[t.name for t in tf_op.inputs],
        outputs=[t.name for t in tf_op.outputs],
        control_inputs=[c.name for c in tf_op.control_inputs],
        device=tf_op.device,
        forwards={} if swap else forwards(tf_op.type, n_in, n_out) or branches.unwrapped(tf_op),
        inplace=() if swap else inplace_order(tf_op),
        calls=_called_functions(tf_op),
        scratch=kernel_scratch(tf_op),
        cpu_scratch=_cpu_scratch(tf_op),
        assigns=assignment(tf_op.type),
    )
    if loop is None:
        return op
    scratch, ahead = loop.scratch, loop.scratch - replace(loop, parallel=1).scratch
    carried = {j: j for j in range(min(n_in, n_out)) if j not in loop.passed}
    return replace(
        op, forwards=dict(loop.passed), scratch=scratch, repeats=loop.trips, ahead=ahead,
        carried=carried,
    )  # fmt: skip


def _cpu_scratch(tf_op: Any) -> int | None:
    """The scratch of this process's CPU kernel where it differs (see rewriter.cpukernels)."""
    if tf_op.type not in CPU_SCRATCH_TYPES or not tf_op.outputs:
        return None
    try:
        return cpu_scratch_bytes(
            tf_op.type,
            [_shape(t) for t in tf_op.inputs],
            [_shape(t) for t in tf_op.outputs],
            tf_op.outputs[0].dtype.size,
            cpu_kernels(),
        )
    except ValueError as err:
        raise CaptureError(f"op {tf_op.name!r}: {err}") from None


def _shape(t: Any) -> tuple[int, ...] | None:
    return tuple(t.shape.as_list()) if t.shape.is_fully_defined() else None


def _called_functions(tf_op: Any) -> tuple[str, ...]:
    """Names of the functions a call or control-flow op runs (empty for ordinary ops)."""
    return tuple(f.name for f in function_refs(tf_op.node_def, _CALL_ATTRS))


def function_refs(node_def: Any, keys: Iterable[str] | None = None) -> Iterator[Any]:
    """The functions a NodeDef's attributes name (`NameAttrList`s, in place: a caller may
    rename them), of the attributes `keys` in that order if given, else of all."""
    attrs = node_def.attr
    for key in attrs if keys is None else keys:
        if key not in attrs:
            continue
        value = attrs[key]
        if value.HasField("func"):
            yield value.func
        yield from value.list.func
