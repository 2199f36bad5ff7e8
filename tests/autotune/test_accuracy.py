"""Predicted against measured peak on the CPU's BFC allocator, each case in a fresh process.

Two checks. Separating the memory model from the order TensorFlow happens to choose: the
simulation of the graph TensorFlow ran (after Grappler) in the order recorded from one profiled
step, against the peak measured in that very step. And the prediction `autotune simulate` makes
without running the step (executor orders drawn as TensorFlow's differ between processes)
against the median of a step measured in three other processes.
"""

import statistics
from pathlib import Path

import pytest

from tests.autotune.cli_helpers import cli_json
from tests.cpu import cpu_flags

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# The tiny CNN runs at batch 96 (48 in the benchmark), away from two knife edges. At 32 it needs
# 14.00 MiB, all but 3 KiB of the 14 MiB the CPU allocator's first three regions hold (2, 4 and
# 8 MiB), so whether a fourth region is needed, and the measured peak (13.98 to 14.51 or 16.18
# to 16.26 MiB), depends on where earlier steps left the variables' buffers. At 128 it needs
# 51.8 of the 62 MiB of the first five regions, and 3 of 14 processes took 58.0 to 60.1 MiB
# (a variable's buffer moved into the last region, splitting it): the simulation with the
# variables' moves predicted those three jumps (64.1, 62.1, 64.1 MiB) but overshoots them and
# once predicted a jump that did not happen (56.0 against 51.5), without the moves it missed
# them (-10.6 to -13.6 %). At 48 the step needs 22.9 of 30 MiB; at 96, 46.3 of 62 (10
# processes: 45.9 to 47.5 MiB, each predicted within 1 %). The tiny 3-D U-Net runs at batch 4,
# not 2: its 2 MiB step at batch 2 was predicted 10-13 % high in recorded orders of two of
# three processes in two runs (one TensorFlow order of a step that fills the allocator's
# first region), where six processes at batches 3 and 4 were all predicted within 4 %.


#: One batch per model: the others (tiny-cnn 48 and 128, tiny-unet3d 2 and 8, tiny-transformer
#: 16) are measured by `autotune.benchmarks.simulator_accuracy`, whose quick run is part of
#: `test_bench` (docs/accuracy.md).
SMALL = [("tiny-cnn", 96), ("tiny-unet3d", 4), ("tiny-transformer", 64)]


@pytest.mark.parametrize("model,batch", SMALL)
def test_recorded_order_predicts_the_same_step_within_10_percent(model: str, batch: int) -> None:
    """Each of three processes predicts its own recorded step; the median error counts. One
    process is one draw of TensorFlow's order and allocator layout: tiny-transformer 16 erred
    by -11.4 % in one of five processes here (2.54 predicted, 2.87 MiB measured; the other
    four -8.3 to +2.0 %)."""
    errors, what = [], []
    for _ in range(3):
        sim = cli_json(
            "simulate", "--model", model, "--batch-size", str(batch), "--schedule", "recorded"
        )
        errors.append(sim["peak_bytes"] / sim["profiled_peak_bytes"] - 1)
        what.append(
            f"predicted {sim['peak_bytes']} B, measured {sim['profiled_peak_bytes']} B "
            f"({errors[-1]:+.1%})"
        )
    summary = f"{model} batch {batch}: " + "; ".join(what)
    print(summary)
    assert abs(statistics.median(errors)) <= 0.10, summary


@pytest.mark.parametrize("model,batch", SMALL)
def test_measured_peak_within_10_percent_of_the_predicted_peaks(model: str, batch: int) -> None:
    """TensorFlow's executor order, and with it the peak, differs between processes (on a
    oneDNN CPU the 3-D U-Net measured 1.77 to 2.41 MiB at batch 2), so a measurement is one
    draw of it. The prediction draws orders too (`order_peaks`, their median the prediction;
    without oneDNN, where no order was seen to vary, it emulates one):
    the median of three processes must lie within 10 % of the middle 80 % of the drawn
    orders' peaks (and of the prediction). Where the orders agree, that is within 10 % of the
    prediction; a single emulated order (the earlier model: 2.31 MiB for the U-Net at batch 2,
    measured 1.87) fails it."""
    sim = cli_json("simulate", "--model", model, "--batch-size", str(batch))
    peaks = [
        cli_json("measure", "--model", model, "--batch-size", str(batch))["peak_bytes"]
        for _ in range(3)
    ]
    measured = statistics.median(peaks)
    drawn = sim["order_peaks"]
    assert bool(drawn) == sim["cpu_kernels"]["onednn"]  # drawn where the order varies
    deciles = statistics.quantiles(drawn, n=10) if drawn else [sim["peak_bytes"]]
    low, high = min(deciles[0], sim["peak_bytes"]), max(deciles[-1], sim["peak_bytes"])
    what = (
        f"{model} batch {batch}: measured {peaks}, predicted {sim['peak_bytes']} "
        f"({measured / sim['peak_bytes'] - 1:+.1%} off), middle orders {low} to {high}"
    )
    print(what)
    assert sim["schedule"] == "executor"
    assert 0.9 * low <= measured <= 1.1 * high, what


POLICY_MODEL = """
import keras
from autotune.zoo import get_entry


def build():
    keras.mixed_precision.set_global_policy({policy!r})
    zm = get_entry("tiny-cnn").build()
    zm.model.compile(loss=zm.loss, optimizer=zm.optimizer)
    return zm.model
"""


#: Without AVX512-FP16 oneDNN has no float16 kernels: TensorFlow then runs float16 convolutions
#: with its own kernels, whose buffers the simulator does not model (on an AMD EPYC without
#: it, tiny-cnn at batch 96 measured 55.7 MB against 26.7 MB predicted; not investigated).
NO_HALF_KERNELS = pytest.mark.xfail(
    "avx512_fp16" not in cpu_flags(),
    reason="this CPU has no AVX512-FP16: float16 kernels outside oneDNN are not modelled",
    strict=False,
)


@pytest.mark.parametrize("policy", [pytest.param("mixed_float16", marks=NO_HALF_KERNELS),
                                    "mixed_bfloat16"])  # fmt: skip
def test_a_cnn_is_predicted_within_10_percent_under_each_precision_policy(
    policy: str, tmp_path: Path
) -> None:
    """The tiny CNN at batch 96 from the user's own model file, under each mixed Keras policy
    (float32: `test_measured_peak_within_10_percent_of_the_predicted_peaks`): the prediction
    without a run against the median of three processes. On a oneDNN CPU the
    graph pass merges the filter and bias gradients and gives max poolings a workspace for
    half and bfloat16 as for float32; modelling that for float32 only over-predicted
    mixed_bfloat16 by 25 % and mixed_float16 by 19 % here (32.6 and 29.5 MiB predicted,
    25.4 and 24.8 measured)."""
    path = tmp_path / "model.py"
    path.write_text(POLICY_MODEL.format(policy=policy))
    spec = f"{path}:build"
    sim = cli_json("simulate", "--model", spec, "--batch-size", "96")
    peaks = [
        cli_json("measure", "--model", spec, "--batch-size", "96")["peak_bytes"] for _ in range(3)
    ]
    measured = statistics.median(peaks)
    what = f"{policy}: predicted {sim['peak_bytes']} B, measured {peaks}"
    print(what)
    assert abs(sim["peak_bytes"] / measured - 1) <= 0.10, what
