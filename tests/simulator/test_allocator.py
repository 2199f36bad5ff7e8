import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import (
    BFCModel,
    EventKind,
    OutOfMemory,
)


def test_small_request_splits_a_fresh_region() -> None:
    bfc = BFCModel()
    bfc.allocate(100)
    assert bfc.in_use == 256


def test_request_below_half_a_chunk_takes_the_whole_chunk() -> None:
    # measured on TensorFlow 2.21's CPU BFC: 256 B, then 1.57 MB -> 2096896 B in use
    bfc = BFCModel()
    bfc.allocate(4)
    bfc.allocate(128 * 32 * 32 * 3 * 4)
    assert bfc.in_use == (2 << 20)


def test_a_loops_list_holds_only_its_bytes_where_one_tensor_holds_the_chunk() -> None:
    # a list is many element buffers, each in a chunk of its size: 1.57 MB of them in a fresh
    # 2 MiB region leave the rest free, where one 1.57 MB tensor holds all of it
    rows = [(int(EventKind.ALLOC), 0, 0, 4, 0, 0), (int(EventKind.ALLOC), 0, 1, 1572864, 0, 0)]
    one, listed = BFCModel(), BFCModel()
    listed.lists = frozenset({1})
    one.replay(rows, [0, 0])
    listed.replay(rows, [0, 0])
    assert (one.in_use, listed.in_use) == (2 << 20, 256 + 1572864)


def test_regions_double_and_free_chunks_coalesce() -> None:
    bfc = BFCModel()
    a = bfc.allocate(1 << 20)
    b = bfc.allocate(1 << 20)
    assert bfc.allocated_regions == (2 << 20)
    bfc.release(a)
    bfc.release(b)
    assert bfc.in_use == 0
    assert bfc.free == [(2 << 20, 0)]
    assert bfc.peak == (2 << 20)


def test_a_memory_limit_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="memory limit 0 B"):
        BFCModel(0)
    with pytest.raises(ValueError, match="32 PiB"):
        BFCModel(1 << 56)


def test_out_of_memory_names_the_request() -> None:
    bfc = BFCModel(1 << 20, allow_growth=False)
    with pytest.raises(OutOfMemory, match="2097152 B"):
        bfc.allocate(2 << 20)


def _state(bfc: BFCModel) -> tuple[object, ...]:
    regions = (bfc.region_bytes, bfc.allocated_regions, bfc._next_base)
    return bfc.in_use, bfc.peak, bfc.free, regions


def _one_by_one(sizes: list[int], limit: int, growth: bool) -> BFCModel | None:
    bfc = BFCModel(limit, allow_growth=growth)
    try:
        for n in sizes:
            bfc.allocate(n)
    except OutOfMemory:
        return None
    return bfc


@st.composite
def _sizes(draw: st.DrawFn, small: int, n: int) -> list[int]:
    """Up to `n` sizes below `small`, and up to two above 128 MiB (where BFC splits a chunk
    even when the request is more than half of it) among them."""
    sizes = draw(st.lists(st.integers(0, small), max_size=n))
    for big in draw(st.lists(st.integers(129 << 20, 200 << 20), max_size=2)):
        sizes.insert(draw(st.integers(0, len(sizes))), big)
    return sizes


@settings(max_examples=300, deadline=None)
@given(
    _sizes(3 << 20, 60),
    _sizes(6 << 20, 30),
    st.integers(8 << 20, 2 << 30) | st.integers(257 << 20, 400 << 20),
    st.booleans(),
)
def test_hold_places_like_one_by_one_allocation(
    held: list[int], later: list[int], limit: int, growth: bool
) -> None:
    """Held tensors merged into one chunk per region leave the allocator where allocating them
    one by one does, and every later allocation and release lands at the same address."""
    reference = _one_by_one(held, limit, growth)
    bfc = BFCModel(limit, allow_growth=growth)
    if reference is None:
        with pytest.raises(OutOfMemory):
            bfc.hold(held)
        return
    bfc.hold(held)
    assert _state(bfc) == _state(reference)
    addrs: list[tuple[int, int]] = []
    for i, n in enumerate(later):
        if i % 3 == 2 and addrs:
            a, b = addrs.pop(0)
            bfc.release(a)
            reference.release(b)
            continue
        try:
            b = reference.allocate(n)
        except OutOfMemory:
            with pytest.raises(OutOfMemory):
                bfc.allocate(n)
            continue
        addrs.append((bfc.allocate(n), b))
        assert addrs[-1][0] == b
        assert _state(bfc) == _state(reference)


def test_replay_places_swapped_in_copies_and_passes_over_host_events() -> None:
    alloc, free, out = int(EventKind.ALLOC), int(EventKind.FREE), int(EventKind.SWAP_OUT)
    swap_in, host_free = int(EventKind.SWAP_IN), int(EventKind.HOST_FREE)
    mib = 1 << 20
    rows = [
        (alloc, 0, 0, mib, mib, 0),
        (out, 1, 0, mib, mib, mib),
        (free, 1, 0, mib, 0, mib),
        (swap_in, 2, 1, mib, mib, mib),
        (host_free, 2, 0, mib, mib, 0),
        (free, 3, 1, mib, 0, 0),
    ]
    bfc = BFCModel()
    bfc.replay(rows, [0, 0])
    assert (bfc.in_use, bfc.peak, bfc.free) == (0, mib, [(2 * mib, 0)])


def test_out_of_memory_in_a_replay_keeps_the_state_before_it() -> None:
    bfc = BFCModel(4 << 20, allow_growth=False)
    with pytest.raises(OutOfMemory, match="8388608 B"):
        bfc.replay([(0, 0, 0, 1 << 20, 0, 0), (0, 1, 1, 8 << 20, 0, 0)], [0, 0])  # two ALLOCs
    assert (bfc.in_use, bfc.peak) == (1 << 20, 1 << 20)
