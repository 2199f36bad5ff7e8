"""The peak a measurement of the step will read, simulated: on the graph a plan was derived on,
and on the graph TensorFlow runs (`as_run_peak`).

A plan is derived on the captured graph. TensorFlow runs the rewritten one after Grappler's
optimizations, which regroup sums and products around the swap-ins (a factor hoisted out of a
sum is read by the sum's last product, not its first), so the graph that runs can hold buffers
longer than the one the plan was simulated on. `as_run_peak` rewrites the step, has Grappler
optimize it as at run time (and, on a CPU with oneDNN, its graph pass after it), captures that
graph and simulates it without a plan, in the order the plan pins.
"""

from __future__ import annotations

from rewriter.apply import TunedStep, planned_graph
from rewriter.capture import Captured, CaptureError
from simulator import (
    BFCModel,
    Graph,
    GraphError,
    SwapPlan,
    categorized_order,
    compile_program,
    scheduled_order,
    simulate_plan,
)
from simulator.heap import GRANULARITY, round_up
from simulator.opsemantics import REGROUPABLE

__all__ = ["as_run_peak", "predicted_peak", "reads_regrouped", "resident_bytes"]


def resident_bytes(graph: Graph) -> int:
    """The bytes a step's inputs, variables and constants take in a BFC allocator (each
    rounded up to its 256-byte granularity): held before the step, as the simulator counts."""
    resident = (t.nbytes for t in graph.tensors.values() if t.kind.resident)
    return sum(round_up(n, GRANULARITY) for n in resident)


def predicted_peak(
    graph: Graph, plan: SwapPlan, on_cpu: bool, order: dict[str, float] | None = None
) -> int:
    """The step's peak as verify measures it: what the model's step allocated above what was
    in use before it, plus the resident bytes by size (not their chunks' bytes). By default in
    the categorized order, else in the one `order` gives (priorities by op name, as
    `simulator.scheduled_order` takes them)."""
    graph = graph.on_cpu() if on_cpu else graph
    allocator = BFCModel(allow_growth=on_cpu)  # the CPU's BFC grows regions, a GPU's holds one
    ordered = scheduled_order(graph, order) if order is not None else None
    simulate_plan(compile_program(graph, ordered), graph, plan, allocator=allocator)
    return allocator.peak_above_base + resident_bytes(graph)


def reads_regrouped(graph: Graph, plan: SwapPlan) -> bool:
    """Whether a swap-in or a recompute copy of `plan` is read by a sum or a product Grappler
    regroups (`Graph.rewritten`): there the graph that runs may hold other buffers than the
    one the plan was simulated on."""
    regrouped = {n for n in graph.rewritten if graph.ops[n].type in REGROUPABLE}
    readers = {c for s in plan.swaps for si in s.swap_ins for c in si.consumers}
    readers |= {c for rc in plan.recomputes for c in rc.consumers}
    return not regrouped.isdisjoint(readers)


def as_run_peak(
    captured: Captured, tuned: TunedStep, device: str, planned: Graph | None = None
) -> int | None:
    """`predicted_peak` of the graph TensorFlow runs for `tuned` (rewritten with its order
    pinned) on `device` ('CPU:0' or 'GPU:0'), in the order the plan was simulated in (the one
    the rewrite pins; an op Grappler made runs when it is ready: `planned`'s, the plan's
    `planned_graph` if the caller has it); None when that graph cannot be captured."""
    from rewriter.cpukernels import cpu_kernels
    from rewriter.optimized import optimized_graph
    from simulator.onednn import onednn_graph

    rewritten = Captured(tuned.recapture(), tuned.function, captured.specs, tuned.variables, 0.0)
    on_cpu = device == "CPU:0"
    try:
        graph = optimized_graph(rewritten, device, variable_shapes=True)
        if on_cpu and cpu_kernels().onednn:  # oneDNN's graph pass runs after Grappler
            graph = onednn_graph(graph.on_cpu())
    except (CaptureError, GraphError):
        return None
    pinned = categorized_order(planned or planned_graph(captured, tuned.plan)).ops
    return predicted_peak(graph, SwapPlan(), on_cpu, {n: float(i) for i, n in enumerate(pinned)})
