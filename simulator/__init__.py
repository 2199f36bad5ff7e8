"""Framework-free simulation of a training step's memory: the IR, the order, the interpreter.

Nothing in this package imports TensorFlow; `tests/simulator/test_no_tensorflow.py` proves it.
"""

from simulator.allocator import BFCModel, OutOfMemory
from simulator.bounds import lower_bound_bytes
from simulator.devices import PRESETS, DevicePreset, get_preset
from simulator.graph import Graph, GraphError, Op, Tensor, TensorKind
from simulator.heap import GRANULARITY, Heap, LiveBytes, round_up
from simulator.memory import SimResult, simulate_memory
from simulator.order import (
    Order,
    categorized_order,
    executor_order,
    executor_orders,
    scheduled_order,
)
from simulator.plan import InvalidPlan, Recompute, Swap, SwapIn, SwapPlan
from simulator.program import Assignment, Move, Program, compile_program
from simulator.replay import BFCHeap, Request, replay_history, replay_peak, with_allocator
from simulator.run import PlanResult, simulate_plan
from simulator.swap import lower_plan
from simulator.timing import Link, Timeline, TimeResult, Transfer, simulate_time
from simulator.trace import Event, EventKind, Trace

__all__ = [
    "PRESETS",
    "DevicePreset",
    "InvalidPlan",
    "Link",
    "PlanResult",
    "Recompute",
    "Swap",
    "SwapIn",
    "SwapPlan",
    "TimeResult",
    "Timeline",
    "Transfer",
    "lower_plan",
    "get_preset",
    "lower_bound_bytes",
    "simulate_plan",
    "simulate_time",
    "BFCHeap",
    "GRANULARITY",
    "Heap",
    "LiveBytes",
    "Assignment",
    "BFCModel",
    "OutOfMemory",
    "Request",
    "replay_history",
    "replay_peak",
    "round_up",
    "with_allocator",
    "Event",
    "EventKind",
    "Graph",
    "GraphError",
    "Move",
    "Op",
    "Order",
    "Program",
    "SimResult",
    "Tensor",
    "TensorKind",
    "Trace",
    "categorized_order",
    "executor_order",
    "executor_orders",
    "scheduled_order",
    "compile_program",
    "simulate",
    "simulate_memory",
]


def simulate(
    graph: Graph,
    order: Order | None = None,
    *,
    granularity: int = GRANULARITY,
    allocator: BFCModel | None = None,
) -> SimResult:
    """Simulate one step of `graph` in `order` (the categorized order by default).

    The peak is what a BFC allocator would report (`allocator`, by default TensorFlow's CPU BFC
    with growing regions), after a warm-up step; `live_peak_bytes` is the sum of live tensors.
    """
    result = simulate_memory(compile_program(graph, order, granularity=granularity))
    return with_allocator(result, allocator or BFCModel())
