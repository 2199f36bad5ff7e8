from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import (
    Assignment,
    EventKind,
    Graph,
    Program,
    TensorKind,
    categorized_order,
    compile_program,
    lower_bound_bytes,
    replay_peak,
    simulate,
    simulate_memory,
)
from simulator.program import added_visits
from tests.simulator.builders import add, chain, diamond, random_graphs


def run(g: Graph):  # type: ignore[no-untyped-def]
    return simulate_memory(compile_program(g))


def test_chain_event_sequence_is_exact() -> None:
    r = run(chain(3, 1024))
    seq = [(e.kind.name, e.op, e.tensor, e.live_bytes) for e in r.trace]
    assert seq == [
        ("ALLOC", "op1", "op1:0", 2048),
        ("ALLOC", "op2", "op2:0", 3072),
        ("FREE", "op2", "op1:0", 2048),
        ("ALLOC", "op3", "op3:0", 3072),
        ("FREE", "op3", "op2:0", 2048),
        ("FREE", "<end>", "op3:0", 1024),
    ]
    assert (r.peak_bytes, r.peak_op, r.persistent_bytes) == (3072, "op2", 1024)
    assert r.largest_at_peak() == [("op1:0", 1024), ("op2:0", 1024)]


def test_diamond_keeps_shared_input_until_last_reader() -> None:
    r = run(diamond())
    frees = [(e.op, e.tensor) for e in r.trace if e.kind is EventKind.FREE]
    assert frees[0] == ("c", "a:0")
    assert r.peak_bytes == 256 + 1024 + 2048 + 512
    assert r.peak_op == "c"


def test_forwarding_op_shares_its_input_buffer() -> None:
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    r_ = add(g, "r", a, 4096, type="Reshape", forwards={0: 0})
    b = add(g, "b", r_, 256)
    g.mark_outputs(b)
    r = run(g)
    allocs = [e.tensor for e in r.trace if e.kind is EventKind.ALLOC]
    assert allocs == ["a:0", "b:0"]
    free_a = next(e for e in r.trace if e.kind is EventKind.FREE and e.tensor == "a:0")
    assert free_a.op == "b"


def test_inplace_op_takes_over_a_dying_input() -> None:
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    relu = add(g, "relu", a, 4096, type="Relu", inplace=(0,))
    g.mark_outputs(relu)
    r = run(g)
    assert [e.tensor for e in r.trace if e.kind is EventKind.ALLOC] == ["a:0"]
    # so no plan needs a's and relu's bytes at once: the lower bound counts one of them
    assert lower_bound_bytes(g) == 256 + 4096
    assert r.peak_bytes == 256 + 4096


def test_freed_at_names_the_step_of_the_reader_that_freed_a_shared_buffer() -> None:
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    relu = add(g, "relu", a, 4096, type="Relu", inplace=(0,))
    g.mark_outputs(add(g, "b", relu, 64))
    r = run(g)
    # a's buffer lives on as relu's: b, relu's reader, frees it
    assert r.trace.freed_at()["a:0"] == r.order.position["b"]
    assert r.trace.freed_at()["b:0"] == len(r.order.ops)  # a step output: at the step's end


def test_inplace_is_refused_while_the_input_has_other_readers() -> None:
    g = Graph()
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    relu = add(g, "relu", a, 4096, type="Relu", inplace=(0,))
    out = add(g, "sum", a + relu, 256)
    g.mark_outputs(out)
    assert run(g).peak_bytes == 256 + 4096 * 2 + 256


def test_allocator_model_counts_whole_chunks() -> None:
    # a 1.5 MiB tensor in a fresh 2 MiB region keeps the whole region (BFC splits only at 2x)
    g = chain(1, 3 << 19)
    r = simulate(g)
    assert r.live_peak_bytes == 2 * (3 << 19)
    assert r.peak_bytes > r.live_peak_bytes


def test_a_functions_scratch_and_lists_are_many_buffers_to_the_allocator_model() -> None:
    # a loop's or a branch's scratch (its functions' buffers) and a loop's lists are
    # TensorFlow's many buffers: in the model they hold their bytes, where one 1.5 MiB
    # request keeps a whole 2 MiB chunk
    g = chain(1, 1024)
    g.ops["op1"].scratch = 3 << 19
    assert simulate(g).peak_bytes == 2 << 20
    g.ops["op1"].calls = ("body",)  # a loop's, or a branch's
    assert simulate(g).peak_bytes == 2048 + (3 << 19)
    g = chain(2, 1024)
    g.tensors["op1:0"] = replace(g.tensors["op1:0"], nbytes=3 << 19)
    plain = simulate(g).peak_bytes
    g.tensors["op1:0"].dtype = "variant"
    assert (plain, simulate(g).peak_bytes) == ((2 << 20) + 1024, 2048 + (3 << 19))


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_levels_respect_every_edge(g: Graph) -> None:
    order = categorized_order(g)
    for name in g.ops:
        for pred in g.predecessors(name):
            assert order.level[pred] < order.level[name]


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_trace_invariants(g: Graph) -> None:
    r = run(g)
    lives = [e.live_bytes for e in r.trace]
    assert all(live >= 0 for live in lives)
    allocs = Counter(e.tensor for e in r.trace if e.kind is EventKind.ALLOC)
    frees = Counter(e.tensor for e in r.trace if e.kind is EventKind.FREE)
    assert allocs == frees and set(allocs.values()) <= {1}
    assert r.peak_bytes == max(lives, default=r.persistent_bytes)
    assert (lives[-1] if lives else r.persistent_bytes) == r.persistent_bytes
    assert replay_peak(r.trace, list(r.resident_sizes)) >= r.peak_bytes
    at_peak = r.largest_at_peak(n=len(g.tensors) + len(g.ops))
    assert r.persistent_bytes + sum(b for _, b in at_peak) == r.peak_bytes


def test_scratch_memory_counts_only_while_its_op_runs() -> None:
    g = chain(2, 1024)
    g.ops["op1"].scratch = 4096
    r = run(g)
    seq = [(e.kind.name, e.tensor, e.live_bytes) for e in r.trace]
    assert seq[:3] == [
        ("ALLOC", "op1:0", 2048),
        ("ALLOC", "op1:scratch", 6144),
        ("FREE", "op1:scratch", 2048),
    ]
    assert r.peak_bytes == 6144 and r.peak_op == "op1"


def test_host_by_step_follows_the_host_column_like_live_by_step() -> None:
    from simulator import simulate_plan
    from simulator.derive import PlanContext, PlanParams, derive_plan
    from tests.simulator.builders import training_chain

    g = training_chain()
    plan = derive_plan(PlanContext.build(g), PlanParams())
    mem = simulate_plan(compile_program(g), g, plan).memory
    n = len(mem.order.ops)
    host = mem.trace.host_by_step(n)
    for step in range(n):
        at = [h for s, h in zip(mem.trace.step, mem.trace.host) if s == step]
        before = [h for s, h in zip(mem.trace.step, mem.trace.host) if s < step]
        assert host[step] == (max(at) if at else (before[-1] if before else 0))
    assert host.max() == mem.host_peak_bytes


def _every_step(program: Program) -> Program:
    return replace(program, visits=list(range(len(program.steps))))


@settings(max_examples=200, deadline=None)
@given(random_graphs())
def test_walking_only_the_visited_steps_walks_like_every_step(g: Graph) -> None:
    """The walk skips the steps where nothing is placed, freed or swapped: its trace is the
    one a walk of every step makes."""
    program = compile_program(g)
    assert simulate_memory(program).trace.rows == simulate_memory(_every_step(program)).trace.rows


def test_added_visits_merges_new_steps_in_order_once() -> None:
    assert added_visits([1, 4, 9], [9, 2, 2, 12]) == [1, 2, 4, 9, 12]
    visits = [0, 3]
    assert added_visits(visits, [3]) is visits


def _variable_step(consumed_late: bool) -> Graph:
    """A variable read, its read consumed before or after an assign-add of a gradient, and an
    assignment that adopts a value dying there."""
    g = Graph("variable")
    v = add(g, "v", [], 1024, type="VarHandleOp", kind=TensorKind.VARIABLE)
    w = add(g, "w", [], 1024, type="VarHandleOp", kind=TensorKind.VARIABLE)
    r = add(g, "read", v, 1024, type="ReadVariableOp", forwards={0: 0})
    grad = add(g, "grad", [] if consumed_late else r, 1024)
    add(g, "update", v + grad, [], type="AssignAddVariableOp", assigns="update")
    value = add(g, "value", grad, 1024)
    add(g, "assign", w + value, [], type="AssignVariableOp", assigns="adopt", control=["update"])
    if consumed_late:
        out = add(g, "late", r, 256, control=["update"])
        g.mark_outputs(out)
    return g


def test_assignments_name_the_variable_the_value_and_the_pending_reads() -> None:
    """An assign-add while its variable's read is still to be consumed releases the old buffer
    only after that consumer; one after the read was consumed, at once (-1). The adopting
    assignment names its value."""
    for late in (True, False):
        g = _variable_step(late)
        program = compile_program(g)
        pos = program.order.position
        update, assign = program.assignments
        assert (update.step, update.held, update.value) == (pos["update"], 0, -1)
        assert update.release == (pos["late"] if late else -1)
        value = program.tid["value:0"]
        assert assign == Assignment(pos["assign"], 1, value, -1)
        moves = simulate_memory(program).moves
        assert [m.buffer for m in moves] == [-1, value]


@settings(max_examples=120, deadline=None)
@given(random_graphs(), st.data())
def test_a_program_compiled_like_another_simulates_as_one_compiled_afresh(
    g: Graph, data: st.DataObject
) -> None:
    """Order edges change the order, not what an op places: a program compiled `like` the
    base graph's (each op's outputs and scratch taken over) walks as one compiled afresh."""
    from simulator import BFCModel
    from simulator.order import categorized_order
    from simulator.replay import with_allocator

    ops = list(categorized_order(g).ops)
    for name in data.draw(st.lists(st.sampled_from(ops), max_size=3)):
        g.ops[name].scratch = data.draw(st.integers(1, 1 << 14))
    pairs = data.draw(
        st.lists(st.tuples(st.integers(0, len(ops) - 1), st.integers(0, len(ops) - 1)), max_size=4)
    )
    edged = g.with_control_edges(
        tuple((ops[min(i, j)], ops[max(i, j)]) for i, j in pairs if i != j)
    )
    fresh = simulate_memory(compile_program(edged))
    like = simulate_memory(compile_program(edged, like=compile_program(g)))
    assert (like.live_peak_bytes, like.peak_step) == (fresh.live_peak_bytes, fresh.peak_step)
    n = len(fresh.order.ops)
    assert (like.trace.live_by_step(n, 0) == fresh.trace.live_by_step(n, 0)).all()
    assert (
        with_allocator(like, BFCModel()).peak_bytes == with_allocator(fresh, BFCModel()).peak_bytes
    )


def test_a_scratch_buffer_compiled_like_another_dies_at_its_ops_new_step() -> None:
    g = Graph("moved")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 1024)
    c = add(g, "c", add(g, "b", x, 1024), 1024)
    g.mark_outputs(add(g, "d", a + c, 256))
    g.ops["a"].scratch = 1 << 20
    edged = g.with_control_edges((("c", "a"),))  # a, and its scratch, now run after c
    like = compile_program(edged, like=compile_program(g))
    fresh = compile_program(edged)
    assert like.order.position["a"] > compile_program(g).order.position["a"]
    assert simulate_memory(like).trace.rows == simulate_memory(fresh).trace.rows


def test_fewer_collections_raises_the_young_threshold_and_restores_it() -> None:
    import gc

    from simulator.memory import SEARCH_GC_THRESHOLD, fewer_collections

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with fewer_collections():
            assert gc.get_threshold() == (SEARCH_GC_THRESHOLD, 10, 10)
            with fewer_collections():  # nested: unchanged, and the outer one restores
                assert gc.get_threshold()[0] == SEARCH_GC_THRESHOLD
            assert gc.get_threshold()[0] == SEARCH_GC_THRESHOLD
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 10, 10)  # a process that asked for fewer already keeps it
        with fewer_collections():
            assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


def test_a_loops_carried_value_takes_over_the_buffer_of_its_value_before() -> None:
    # x -> zeros -> loop (a sum it carries, and a list it fills) -> y: the sum's final value
    # replaces its initial one, iteration by iteration; the list has other bytes, and keeps
    # its own buffer
    def step(carried: dict[int, int]) -> Graph:
        g = Graph("loop")
        x = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
        zeros = add(g, "zeros", x, [1 << 20, 0])
        loop = add(g, "loop", zeros, [1 << 20, 4 << 20])
        g.ops["loop"] = replace(g.ops["loop"], calls=("body",), repeats=9, carried=carried)
        g.mark_outputs(add(g, "y", loop, 0))
        return g

    plain, taken = step({}), step({0: 0, 1: 1})
    assert run(plain).live_peak_bytes - run(taken).live_peak_bytes == 1 << 20
    assert lower_bound_bytes(plain) - lower_bound_bytes(taken) == 1 << 20
