"""The peak a measurement of the step will read, simulated: on the graph a plan was derived on,
and on the graph TensorFlow runs (`as_run_peak`).

A plan is derived on the captured graph. TensorFlow runs the rewritten one after Grappler's
optimizations, which regroup sums and products around the swap-ins (a factor hoisted out of a
sum is read by the sum's last product, not its first), so the graph that runs can hold buffers
longer than the one the plan was simulated on. `as_run_peak` rewrites the step, has Grappler
optimize it as at run time, captures that graph and simulates it without a plan, in the order
the plan pins.
"""

from __future__ import annotations

from rewriter.apply import TunedStep
from rewriter.capture import Captured, CaptureError
from simulator import BFCModel, Graph, SwapPlan, compile_program, simulate_plan
from simulator.heap import GRANULARITY, round_up

__all__ = ["as_run_peak", "predicted_peak", "resident_bytes"]


def resident_bytes(graph: Graph) -> int:
    """The bytes a step's inputs, variables and constants take in a BFC allocator (each
    rounded up to its 256-byte granularity): held before the step, as the simulator counts."""
    resident = (t.nbytes for t in graph.tensors.values() if t.kind.resident)
    return sum(round_up(n, GRANULARITY) for n in resident)


def predicted_peak(graph: Graph, plan: SwapPlan, on_cpu: bool) -> int:
    """The step's peak as verify measures it: what the model's step allocated above what was
    in use before it, plus the resident bytes by size (not their chunks' bytes)."""
    graph = graph.on_cpu() if on_cpu else graph
    allocator = BFCModel(allow_growth=on_cpu)  # the CPU's BFC grows regions, a GPU's holds one
    simulate_plan(compile_program(graph), graph, plan, allocator=allocator)
    return allocator.peak_above_base + resident_bytes(graph)


def as_run_peak(captured: Captured, tuned: TunedStep, device: str) -> int | None:
    """`predicted_peak` of the graph TensorFlow runs for `tuned` (rewritten with its order
    pinned) on `device` ('CPU:0' or 'GPU:0'); None when that graph cannot be captured."""
    from rewriter.optimized import optimized_graph

    rewritten = Captured(tuned.recapture(), tuned.function, captured.specs, tuned.variables, 0.0)
    try:
        graph = optimized_graph(rewritten, device, variable_shapes=True)
    except CaptureError:
        return None
    return predicted_peak(graph, SwapPlan(), device == "CPU:0")
