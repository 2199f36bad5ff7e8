"""The examples run as a user runs them."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_keras_fit_example_trains_with_the_callback_and_prints_its_peaks() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "keras_fit.py")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SwapCallback: tuned at batch 64" in out.stdout
    swapped = re.search(r"swapped: (\d+) tensors at batch 64", out.stdout)
    assert swapped and int(swapped.group(1)) > 0
    peaks = re.findall(
        r"(tuned|original) +predicted peak ([\d.]+) MiB.*measured ([\d.]+) MiB", out.stdout
    )
    assert [p[0] for p in peaks] == ["tuned", "original"]
    (_, _, tuned), (_, _, original) = peaks
    assert float(tuned) < float(original)  # the tuned step measured less than the original
