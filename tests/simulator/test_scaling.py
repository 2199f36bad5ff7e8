from dataclasses import replace

import pytest

from simulator import Graph, TensorKind, compile_program, simulate_memory
from simulator.scaling import BatchFamily, ScalingError, affine_costs
from tests.simulator.builders import add


def step_at(batch: int, *, extra: bool = False, handle: str = "w") -> Graph:
    """A tiny training step whose activations grow with the batch and weights do not."""
    g = Graph("step")
    x = add(g, "x", [], batch * 48, type="Placeholder", kind=TensorKind.INPUT)
    kind = "Placeholder" if "/" in handle else "VarHandleOp"
    w = add(g, handle, [], 4096, type=kind, kind=TensorKind.VARIABLE)
    h = add(g, "h", x + w, batch * 256 + 64)
    y = add(g, "y", h, batch * 16)
    gh = add(g, "gradient_tape/h", y + h, batch * 256 + 64)
    gw = add(g, "gradient_tape/w", gh + x, 4096, control=["y"])
    if extra:
        gw = add(g, "extra", gw, 4096)
    g.mark_outputs(gw)
    return g


def sizes(g: Graph) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {n: (t.nbytes, t.shape) for n, t in g.tensors.items()}


@pytest.mark.parametrize("batch", [2, 5, 7, 1000])
def test_family_reproduces_every_size_at_other_batches(batch: int) -> None:
    family = BatchFamily.fit(step_at(2), 2, step_at(3), 3)
    g = family.at(batch)
    g.lint()
    assert sizes(g) == sizes(step_at(batch))
    assert list(g.ops) == list(step_at(batch).ops)
    assert g.outputs == step_at(batch).outputs
    real = step_at(batch)  # linked as Graph.add_op links a graph built op by op
    assert {n: (t.producer, t.consumers) for n, t in g.tensors.items()} == {
        n: (t.producer, t.consumers) for n, t in real.tensors.items()
    }
    assert g.control_consumers == real.control_consumers == {"y": ["gradient_tape/w"]}


def test_family_graph_simulates_like_the_real_one() -> None:
    family = BatchFamily.fit(step_at(4), 4, step_at(9), 9)
    got = simulate_memory(compile_program(family.at(33)))
    want = simulate_memory(compile_program(step_at(33)))
    assert got.peak_bytes == want.peak_bytes
    assert got.trace.rows == want.trace.rows


def test_captures_that_differ_in_structure_are_refused() -> None:
    with pytest.raises(ScalingError, match="different ops"):
        BatchFamily.fit(step_at(2), 2, step_at(3, extra=True), 3)


def test_placeholders_named_by_tensorflows_counter_are_matched_by_place() -> None:
    """A variable a nested function captured is a placeholder named scope/<uid>, the uid
    different in every capture (ConvNeXt's depthwise kernels)."""
    family = BatchFamily.fit(step_at(2, handle="conv/3632"), 2, step_at(3, handle="conv/15211"), 3)
    g = family.at(6)
    assert sizes(g) == sizes(step_at(6, handle="conv/3632"))
    assert g.tensors["h:0"].consumers == ["y", "gradient_tape/h"]


def test_counter_names_of_other_scopes_are_refused() -> None:
    with pytest.raises(ScalingError, match="different ops"):
        BatchFamily.fit(step_at(2, handle="conv/3632"), 2, step_at(3, handle="dense/15211"), 3)


def test_sizes_that_are_not_whole_steps_per_sample_are_refused() -> None:
    odd = step_at(4)
    odd.tensors["h:0"].nbytes += 1
    with pytest.raises(ScalingError, match="size of h:0"):
        BatchFamily.fit(step_at(2), 2, odd, 4)


@pytest.mark.parametrize("a,b", [(1, 3), (3, 3)])
def test_batch_one_and_equal_batches_are_refused(a: int, b: int) -> None:
    with pytest.raises(ScalingError, match="at least 2"):
        BatchFamily.fit(step_at(a), a, step_at(b), b)


def test_batch_one_is_outside_the_family() -> None:
    with pytest.raises(ScalingError, match="batch 1"):
        BatchFamily.fit(step_at(2), 2, step_at(3), 3).at(1)


def test_costs_follow_the_line_and_never_drop_below_the_measured() -> None:
    got = affine_costs({"a": 1.0, "b": 2.0}, 16, {"a": 2.0, "b": 2.0}, 32, 64)
    assert got == {"a": pytest.approx(4.0), "b": pytest.approx(2.0)}
    shrinking = affine_costs({"a": 2.0}, 16, {"a": 1.0}, 32, 64)
    assert shrinking["a"] == pytest.approx(1.0)


def looped_at(batch: int) -> Graph:
    """step_at with h a loop that holds, for iterations running ahead, a weight-sized part
    (a weight gradient per iteration) less a batch-sized one (list elements it pops): the
    most over its iterations, clipped at 0 where the pops win."""
    g = step_at(batch)
    ahead = max(0, 8 * 4096 - batch * 512)
    g.ops["h"] = replace(g.ops["h"], calls=("body",), repeats=8, scratch=ahead + batch * 64,
                         ahead=ahead)  # fmt: skip
    return g


def test_a_loop_running_ahead_is_not_an_affine_family() -> None:
    # a line through 2 and 8 would give the loop -96 KiB of run-ahead at 300
    with pytest.raises(ScalingError, match="loop 'h' holds values for the iterations"):
        BatchFamily.fit(looped_at(2), 2, looped_at(8), 8)
