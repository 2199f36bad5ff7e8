"""The heaps: the walk's events cost live bytes under one policy and whole chunks under BFC."""

from hypothesis import given, settings

from simulator import (
    BFCHeap,
    BFCModel,
    EventKind,
    Graph,
    LiveBytes,
    compile_program,
    round_up,
    simulate,
    simulate_memory,
)
from simulator.trace import Row
from tests.simulator.builders import chain, random_graphs


def test_round_up_to_the_granularity() -> None:
    assert [round_up(n) for n in (0, 1, 256, 257)] == [0, 256, 256, 512]
    assert round_up(5, 4) == 8


def test_live_bytes_keeps_the_peak_and_records_each_event() -> None:
    rows: list[Row] = []
    heap = LiveBytes(100, rows.append)
    heap.alloc(1, 0, 50)
    heap.alloc(2, 1, 30)
    heap.free(3, 0, 50)
    heap.host_event(int(EventKind.SWAP_OUT), 3, 1, 30, 1)
    heap.alloc(4, 2, 40, int(EventKind.SWAP_IN))
    assert (heap.peak, heap.peak_step, heap.live) == (180, 2, 170)
    assert heap.host_peak == 30
    assert [r[4] for r in rows] == [150, 180, 130, 130, 170]
    assert rows[-1][0] == int(EventKind.SWAP_IN)


def test_bfc_heap_counts_whole_chunks_where_live_bytes_do_not() -> None:
    # a 1.5 MiB request in a fresh 2 MiB region keeps all of it: BFC splits only at twice
    size = 3 << 19
    heap = BFCHeap(BFCModel(), 2, [])
    heap.alloc(0, 0, size)
    assert heap.peak == 2 << 20
    heap.free(1, 0, size)
    heap.alloc(2, 1, 256)
    assert heap.model.in_use == 256


def test_bfc_heap_moves_a_variable_and_releases_its_old_buffer() -> None:
    heap = BFCHeap(BFCModel(), 1, [4096])
    before = heap.model.in_use
    heap.move(0, -1, pending=True)  # a copy while a read of the old value is pending
    assert heap.model.in_use == before + 4096
    heap.release_moved(0)
    assert heap.model.in_use == before
    heap.alloc(0, 0, 4096)
    heap.move(0, 0, pending=False)  # the variable adopts buffer 0; its old one is released
    assert heap.model.in_use == before


def test_the_result_keeps_both_peaks() -> None:
    walked = simulate_memory(compile_program(chain(1, 3 << 19)))
    assert walked.allocator_peak_bytes is None
    assert walked.peak_bytes == walked.live_peak_bytes
    replayed = simulate(chain(1, 3 << 19))
    assert replayed.live_peak_bytes == walked.live_peak_bytes
    assert replayed.allocator_peak_bytes == replayed.peak_bytes > replayed.live_peak_bytes


@settings(max_examples=100, deadline=None)
@given(random_graphs())
def test_the_allocator_peak_is_never_below_the_live_peak(g: Graph) -> None:
    r = simulate(g)
    assert r.allocator_peak_bytes is not None
    assert r.allocator_peak_bytes >= r.live_peak_bytes
