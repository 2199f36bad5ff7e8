import pytest

from simulator import BFCModel, OutOfMemory


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


def test_out_of_memory_names_the_request() -> None:
    bfc = BFCModel(1 << 20, allow_growth=False)
    with pytest.raises(OutOfMemory, match="2097152 B"):
        bfc.allocate(2 << 20)
