"""The peaks verify sets against its measurement, simulated."""

from dataclasses import replace

from autotune.run.predict import predicted_peak, resident_bytes
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
