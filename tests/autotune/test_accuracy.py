"""Predicted against measured peak on the CPU's BFC allocator, each measured in a fresh process."""

import pytest

from tests.autotune.cli_helpers import cli_json

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# Known gap, kept visible: TensorFlow's executor runs these graphs in another order than the
# categorized one and holds activations longer, so the level-order simulation under-predicts
# them by about 10-30 % (and their measured peaks vary by up to 25 % between processes).
_ORDER_GAP = pytest.mark.xfail(
    strict=False,
    reason="level order differs from TensorFlow's executor order: under-predicts by 10-30 %",
)

CASES = [
    ("tiny-cnn", 32),
    ("tiny-cnn", 128),
    pytest.param("tiny-unet3d", 2, marks=_ORDER_GAP),
    pytest.param("tiny-unet3d", 8, marks=_ORDER_GAP),
    pytest.param("tiny-transformer", 16, marks=_ORDER_GAP),
    pytest.param("tiny-transformer", 64, marks=_ORDER_GAP),
]


@pytest.mark.parametrize("model,batch", CASES)
def test_predicted_peak_within_10_percent_of_measured(model: str, batch: int) -> None:
    sim = cli_json("simulate", "--model", model, "--batch-size", str(batch))
    meas = cli_json("measure", "--model", model, "--batch-size", str(batch))
    error = sim["peak_bytes"] / meas["peak_bytes"] - 1
    assert abs(error) <= 0.10, (
        f"{model} batch {batch}: predicted {sim['peak_bytes']} B, "
        f"measured {meas['peak_bytes']} B ({error:+.1%})"
    )
