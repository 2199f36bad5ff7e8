import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import (
    BFCModel,
    EventKind,
    Graph,
    OutOfMemory,
    Request,
    SimResult,
    TensorKind,
    replay_history,
    replay_peak,
    simulate,
)
from simulator.trace import DEVICE_ALLOCS
from tests.simulator.builders import add, random_graphs


def _two_passes(r: SimResult, limit: int) -> tuple[int, int, BFCModel]:
    """Peaks of a warm-up and a measured step replayed explicitly, and the model after them."""
    model = BFCModel(limit)
    for n in r.resident_sizes:
        model.allocate(n)
    peaks = []
    for _ in range(2):
        model.reset_peak()
        model.replay(r.trace.rows, [0] * r.trace.n_tensors)
        peaks.append(model.peak)
    return peaks[0], peaks[1], model


@settings(max_examples=150, deadline=None)
@given(
    random_graphs(max_bytes=6 << 20),
    st.integers(4 << 20, 96 << 20) | st.just(1 << 50),
    st.booleans(),
)
def test_replay_peak_is_the_measured_step_after_a_warm_up(
    g: Graph, limit: int, growth: bool
) -> None:
    """replay_peak replays the step once more only when the warm-up's regions fill the limit;
    otherwise the measured step provably repeats the warm-up, and the peaks agree."""
    r = simulate(g)
    try:
        if growth:
            warm_up, measured, model = _two_passes(r, limit)
            assert warm_up == measured or model.memory_limit - model.allocated_regions < 256
        else:
            explicit = BFCModel(limit, allow_growth=False)
            for n in r.resident_sizes:
                explicit.allocate(n)
            explicit.replay(r.trace.rows, [0] * r.trace.n_tensors)
            measured = explicit.peak
    except OutOfMemory:
        with pytest.raises(OutOfMemory):
            replay_peak(r.trace, list(r.resident_sizes), BFCModel(limit, allow_growth=growth))
        return
    model = BFCModel(limit, allow_growth=growth)
    assert replay_peak(r.trace, list(r.resident_sizes), model) == measured


def test_a_region_cut_short_by_the_limit_changes_the_measured_step() -> None:
    """Within 7 MiB, the warm-up puts 3 MiB in a 4 MiB region (taken whole) and 2 MiB in the
    last 3 MiB (cut short by the limit): 7 MiB. The measured step finds the 3 MiB region free
    and splits the 4 MiB one for the 2 MiB tensor: 5 MiB."""
    g = Graph("cut")
    x = add(g, "x", [], 0, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 3 << 20)
    b = add(g, "b", a, 2 << 20)
    add(g, "c", a + b, 0)
    r = simulate(g)
    warm_up, measured, _ = _two_passes(r, 7 << 20)
    assert (warm_up, measured) == (7 << 20, 5 << 20)
    assert replay_peak(r.trace, list(r.resident_sizes), BFCModel(7 << 20)) == 5 << 20


def test_replaying_a_history_counts_the_peak_from_its_start_request() -> None:
    # a real allocator's addresses are arbitrary; the model places each request itself
    history = [
        Request(True, 0x7F00, 3 << 20),  # before the measured part: a whole 4 MiB region
        Request(False, 0x7F00),
        Request(True, 0x9000, 1 << 20),  # measured from here
        Request(True, 0x7F00, 1 << 20),
        Request(False, 0x9000),
    ]
    assert replay_history(history) == 4 << 20  # the 3 MiB request holds the unsplit region
    assert replay_history(history, start=2) == 2 << 20  # two 1 MiB chunks split off it


def test_replaying_a_history_refuses_a_release_it_never_saw_allocated() -> None:
    with pytest.raises(ValueError, match="request 1 releases 0xbeef"):
        replay_history([Request(True, 0x10, 8), Request(False, 0xBEEF)])


def test_replaying_a_history_from_a_start_past_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="start 1 is not one of the 1 requests"):
        replay_history([Request(True, 0x10, 8)], start=1)


_KIB = 1 << 10


def _adopting_step() -> Graph:
    """A 512 KiB variable; a 512 KiB value it adopts; then a 1.25 MiB tensor."""
    g = Graph("adopt")
    v = add(g, "v", [], 512 * _KIB, type="VarHandleOp", kind=TensorKind.VARIABLE)
    a = add(g, "a", [], 512 * _KIB)
    add(g, "assign", v + a, [], type="AssignVariableOp", assigns="adopt")
    g.mark_outputs(add(g, "b", [], 1280 * _KIB, control=["assign"]))
    return g


def test_an_adopted_value_moves_the_variable_and_the_next_step_starts_there() -> None:
    """In the first 2 MiB region the variable holds [0, 512K) and the value the split-off
    [512K, 1M). Without the move, the value's chunk coalesces back and the 1.25 MiB tensor takes
    the 1.5 MiB rest whole: 2 MiB in use. Adopting it frees [0, 512K) instead: no free chunk
    holds 1.25 MiB, which splits a new 4 MiB region (1.75 MiB in use). The measured step then
    finds [0, 512K) for the value, moves the variable back, and the free [512K, 2M) is taken
    whole again (2 MiB)."""
    r = simulate(_adopting_step())
    resident = list(r.resident_sizes)
    assert len(r.moves) == 1
    assert replay_peak(r.trace, resident) == 2 << 20  # no moves
    model = BFCModel()
    assert replay_peak(r.trace, resident, model, warmup=False, moves=r.moves) == 1792 * _KIB
    assert model.used == {512 * _KIB // 256: 512 * _KIB // 256}  # the variable, moved
    assert (0, 512 * _KIB) in [(addr, size) for size, addr in model.free]
    assert replay_peak(r.trace, resident, moves=r.moves) == 2 << 20
    assert r.peak_bytes == 2 << 20  # simulate replays the measured step with the moves


def test_an_update_while_a_read_is_pending_copies_the_variable() -> None:
    """The assign-add runs while the variable's read still has a consumer: the variable goes to
    a new 512 KiB buffer (in use: old, gradient, new), and the old one is freed after that
    consumer, leaving the variable alone in use."""
    g = Graph("copy")
    v = add(g, "v", [], 512 * _KIB, type="VarHandleOp", kind=TensorKind.VARIABLE)
    read = add(g, "read", v, 512 * _KIB, type="ReadVariableOp", forwards={0: 0})
    grad = add(g, "grad", [], 256 * _KIB)
    add(g, "update", v + grad, [], assigns="update", control=["read"])
    g.mark_outputs(add(g, "late", read, 256, control=["update"]))
    r = simulate(g)
    resident = list(r.resident_sizes)
    assert replay_peak(r.trace, resident) == 768 * _KIB
    model = BFCModel()
    assert replay_peak(r.trace, resident, model, moves=r.moves) == 1280 * _KIB
    assert model.in_use == 512 * _KIB


def _reference_moving_peak(r: SimResult, passes: int) -> int:
    """The moves replayed call by call from one sorted list of events: per step, its op's
    allocations, its copies, its frees and swap-ins, then the releases a read held."""
    free = int(EventKind.FREE)
    rows = r.trace.rows
    freed = {(row[1], row[2]) for row in rows if row[0] == free}
    adopting = {(m.step, m.buffer): m for m in r.moves if (m.step, m.buffer) in freed}
    events: list[tuple[int, int, int, str, int]] = []  # step, phase, index, what, whose
    for i, row in enumerate(rows):
        events.append((row[1], 0 if row[0] in (0, int(EventKind.SWAP_OUT)) else 2, i, "row", i))
    for k, m in enumerate(r.moves):
        if m.release >= 0:
            if (m.step, m.buffer) not in adopting:
                events.append((m.step, 1, k, "copy", m.held))
            events.append((m.release, 3, k, "release", m.held))
    events.sort()
    model = BFCModel()
    held = [model.allocate(n) for n in r.resident_sizes]
    for _ in range(passes):
        model.reset_peak()
        where: dict[int, int] = {}
        waiting: dict[int, list[int]] = {}
        for step, _, _, what, whose in events:
            if what == "copy":
                waiting.setdefault(whose, []).append(held[whose])
                held[whose] = model.allocate(r.resident_sizes[whose])
            elif what == "release":
                for addr in waiting.pop(whose, []):
                    model.release(addr)
            else:
                kind, _, tensor, nbytes, _, _ = rows[whose]
                move = adopting.get((step, tensor)) if kind == free else None
                if kind in DEVICE_ALLOCS:
                    where[tensor] = model.allocate(nbytes)
                elif move is None:
                    model.release(where.pop(tensor))
                else:
                    old, held[move.held] = held[move.held], where.pop(tensor)
                    if move.release >= 0:
                        waiting.setdefault(move.held, []).append(old)
                    else:
                        model.release(old)
    return model.peak


@st.composite
def _graphs_with_writes(draw: st.DrawFn) -> Graph:
    """A random graph with variables, each read once and written by adopting assignments and
    updates from values of its size (some read again later), the read consumed anywhere."""
    g = draw(random_graphs())
    tensors = [n for n, t in g.tensors.items() if not t.kind.resident]
    for j in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 1 << 16))
        v = add(g, f"var{j}", [], size, type="VarHandleOp", kind=TensorKind.VARIABLE)
        read = add(g, f"read{j}", v, size, type="ReadVariableOp", forwards={0: 0})
        for k in range(draw(st.integers(1, 3))):
            ins = draw(st.lists(st.sampled_from(tensors), max_size=2, unique=True))
            value = add(g, f"value{j}_{k}", ins, size)
            mode = draw(st.sampled_from(["adopt", "update"]))
            add(g, f"write{j}_{k}", v + value, [], assigns=mode)
            tensors += value
        later = draw(st.lists(st.sampled_from(tensors), max_size=1))
        add(g, f"reader{j}", read + later, draw(st.integers(0, 4096)))
    return g


@settings(max_examples=150, deadline=None)
@given(_graphs_with_writes(), st.booleans())
def test_moves_replay_as_one_sorted_list_of_calls_does(g: Graph, warmup: bool) -> None:
    r = simulate(g)
    assert r.moves
    resident = list(r.resident_sizes)
    replayed = replay_peak(r.trace, resident, BFCModel(), warmup=warmup, moves=r.moves)
    assert replayed == _reference_moving_peak(r, 2 if warmup else 1)
