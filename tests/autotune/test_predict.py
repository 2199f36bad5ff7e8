"""The peaks verify sets against its measurement, simulated."""

from dataclasses import replace

from autotune.run.predict import predicted_peak, reads_regrouped, resident_bytes
from simulator import BFCModel, SwapPlan, compile_program, simulate_plan
from tests.simulator.builders import chain


def test_the_prediction_counts_the_steps_variables_as_the_measurement_does() -> None:
    """A 5 MiB variable placed in a fresh 8 MiB region of the CPU's growing allocator holds
    the whole region (BFC splits a chunk only at twice the request); the measurement counts
    the variable's own bytes, and so must the prediction compared with it."""
    g = chain(2, 1 << 20)
    g.tensors["x:0"] = replace(g.tensors["x:0"], nbytes=5 << 20)  # the held input
    allocator = BFCModel()
    whole = simulate_plan(compile_program(g), g, SwapPlan(), allocator=allocator).memory
    step = allocator.peak_above_base  # what the step itself allocated: op1's and op2's outputs
    assert step == 2 << 20 and whole.peak_bytes >= (8 << 20) + step  # the chunk, not 5 MiB
    assert predicted_peak(g, SwapPlan(), on_cpu=True) == resident_bytes(g) + step == (7 << 20)


def test_a_plan_is_simulated_as_run_only_where_grappler_regroups_a_swap_ins_reader() -> None:
    """x is swapped and read back by a product (a regrouped one where Grappler rewrites it)
    and by a convolution's gradient; a plan that brings it back to the product reads
    regrouped, one that brings it back to the gradient alone does not."""
    from simulator import Graph, Swap, SwapIn
    from tests.simulator.builders import add

    g = Graph()
    add(g, "x", [], 1024)
    add(g, "f", ["x:0"], 1024)
    add(g, "mul", ["f:0", "x:0"], 1024, type="Mul")
    add(g, "grad", ["mul:0", "x:0"], 1024, type="Conv2DBackpropInput")
    to_mul = SwapPlan(swaps=(Swap("x:0", 1024, (SwapIn("f", ("mul", "grad")),)),))
    to_grad = SwapPlan(swaps=(Swap("x:0", 1024, (SwapIn("mul", ("grad",)),)),))
    assert not reads_regrouped(g, to_mul)  # Grappler left the product as it is
    g.rewritten = frozenset({"mul", "grad"})
    assert reads_regrouped(g, to_mul)
    assert not reads_regrouped(g, to_grad)  # a gradient is no sum or product
