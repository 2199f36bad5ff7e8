"""The order edges an engine runs its serialized plans with (`Engine.serialized`): deferral
edges, then deferred variable writes, then held-input edges where they pay off, then what
`find_order_edges` finds after them, each judged by the least-memory plan's peak on the graph
with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.derive import LEAST_MEMORY, PlanParams
from simulator.graph import Graph, GraphError
from simulator.memory import SimResult
from simulator.opsemantics import fused_together
from simulator.order import Order, categorized_order
from simulator.order_edges import (
    Edge,
    deferral_edges,
    feeder_edges,
    find_order_edges,
    grouped,
    held_input_edges,
)
from simulator.writes import write_edges

if TYPE_CHECKING:
    from simulator.engine import Engine

__all__ = ["EDGES_GAIN", "least_memory", "order_edges"]

#: edges found on top of others are kept only where they lower the least-memory peak by at
#: least this share: those that defer ops whose inputs are held anyway (`held_input_edges`)
#: lower it by half (the unrolled LSTM: -48 to -50 % at three sizes) or by chance, by 0.001 %
#: (ConvNeXt-Tiny, Transformer-base), where they still constrain every plan's schedule and
#: left the tuned step 4 % and 1.5 % slower; so does the second search's edge on the zoo's 3D
#: U-Net at 376 (0.00 %; its tuned plan 1.750x -> 1.796x), where on the Isensee U-Net at
#: 192 it lowers it by 12.6 % (docs/method.md, "Constants")
EDGES_GAIN = 0.01

#: the least-memory plan without backward swaps, which the edges are searched for first:
#: judged by `LEAST_MEMORY` alone, the search stops where swapping the backward pass's
#: tensors holds the peak, and finds few of the edges that plans swapping fewer need
#: (ResNet-50: one edge, and the main job's largest batch 1147 -> 776)
FORWARD_SWAPS = replace(LEAST_MEMORY, backward_swaps=False)

#: a graph, its least-memory plan's simulation and the order it walked
Simulated = tuple[Graph, SimResult, Order]


def order_edges(engine: Engine) -> tuple[Edge, ...]:
    """Deferral edges (ops made from held buffers wait for their readers' other inputs)
    if they lower the least-memory peak (an op run later may also make a short-lived
    output at a fuller moment), then variable writes deferred past the readers of the values
    read before them with what they write (`_deferred_writes`) if that lowers it, then the
    edges `find_order_edges` finds after them.
    Edges for ops whose inputs are held anyway (`held_input_edges`) that lower the peak
    too are tried as well: the edges found after them may differ, so both sets are
    found, and the one with them is kept where its least-memory plan peaks lower with the
    time model (when there is one) by at least `EDGES_GAIN`."""
    graph, order, context = engine.graph, engine.order, engine.context
    together = fused_together(graph)
    deferred = deferral_edges(graph, order)
    deferred += feeder_edges(graph, order, context.backward - context.flow)
    base = (graph, *least_memory(engine, graph))
    deferred, base = _if_lower(engine, deferred, together, base)
    writes, base = _if_lower(engine, _deferred_writes(base[0], base[2]), together, base)
    deferred += writes
    without = deferred + _found_after(engine, base, together)
    held, held_base = _if_lower(engine, held_input_edges(base[0], base[2]), together, base)
    if not held:
        return without
    with_held = deferred + held + _found_after(engine, held_base, together)
    timed = engine.timeline is not None and engine.device is not None
    peaks = [
        least_memory(engine, graph.with_control_edges(edges), timed)[0].peak_bytes
        for edges in (without, with_held)
    ]
    return with_held if peaks[1] <= (1 - EDGES_GAIN) * peaks[0] else without


def _deferred_writes(graph: Graph, order: Order) -> tuple[Edge, ...]:
    """`write_edges`, and the deferral edges they make: a weight decay's product, made from
    the variable alone, is held until its write, so it waits with the write, for the same
    reader (past a product Grappler regroups, by its read of the variable)."""
    writes = write_edges(graph, order)
    if not writes:
        return ()
    ordered = graph.with_control_edges(writes)
    try:
        made = deferral_edges(ordered, categorized_order(ordered), past_rewritten=True)
    except GraphError:  # each edge alone closes no cycle; together they could: none is kept
        return ()
    readers = {a for a, _ in writes}
    return writes + tuple(
        (a, b) for a, b in made if a in readers and a not in graph.ops[b].control_inputs
    )


def least_memory(
    engine: Engine, graph: Graph, timed: bool = False, params: PlanParams = FORWARD_SWAPS
) -> tuple[SimResult, Order]:
    """The simulation of the least-memory plan `params` on `graph` (a graph of `engine`'s
    step with other control edges) and the order it walked: memory only, or, `timed`, with
    `engine`'s time model (a tensor is then held until its copy ends)."""
    built = type(engine).build(
        graph, device=engine.device, cost=engine.cost if timed else None,
        lower_bound=engine.lower_bound, like=engine,
    )  # fmt: skip
    return built.evaluate(params, timed=timed).result.memory, built.order


def _if_lower(
    engine: Engine,
    edges: tuple[Edge, ...],
    together: Mapping[str, tuple[str, ...]],
    base: Simulated,
) -> tuple[tuple[Edge, ...], Simulated]:
    """`edges` (each into and out of the ops run as one kernel with its ends) and the
    graph `base` simulated with them (least-memory plan), if they lower its peak; else
    none and `base`."""
    edges = tuple(e for d in edges for e in grouped(d, together))
    if not edges:
        return (), base
    ordered = base[0].with_control_edges(edges)
    result, order = least_memory(engine, ordered)
    if result.peak_bytes >= base[1].peak_bytes:
        return (), base
    return edges, (ordered, result, order)


def _found_after(
    engine: Engine, base: Simulated, together: Mapping[str, tuple[str, ...]]
) -> tuple[Edge, ...]:
    """The edges `find_order_edges` finds on `base` (its simulation reused) for the plan
    that swaps forward tensors alone, then those it finds after them for `LEAST_MEMORY`,
    which swaps the backward pass's long-held tensors too (see `FORWARD_SWAPS`), where they
    lower its peak by at least `EDGES_GAIN`."""
    graph, known = base[0], base[1:]
    start = engine.backward_level()

    def peak_of(g: Graph) -> tuple[SimResult, Order]:
        return known if g is graph else least_memory(engine, g)

    found = find_order_edges(graph, peak_of, start_level=start, together=together)
    graph = graph.with_control_edges(found)

    def least_of(g: Graph) -> tuple[SimResult, Order]:
        return least_memory(engine, g, params=LEAST_MEMORY)

    more = find_order_edges(graph, least_of, start_level=start, together=together)
    if not more:
        return found
    peaks = [least_of(g)[0].peak_bytes for g in (graph, graph.with_control_edges(more))]
    return found + more if peaks[1] <= (1 - EDGES_GAIN) * peaks[0] else found
