"""`autotune calibrate` on this CPU: a profile from two batches that prices the step at others,
and its use as the device of simulate, fit and verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.autotune.cli_helpers import cli_json, run_cli

pytestmark = pytest.mark.tf


def test_a_profile_from_batches_4_and_8_predicts_batch_32() -> None:
    """Measured and predicted step times at batch 32 agree within a factor that CPU noise on
    a shared machine cannot break, and the prediction grows with the batch as a line does."""
    import autotune
    from autotune.api import capture
    from autotune.run.calibrate import step_seconds
    from autotune.run.measure import example_tensors
    from autotune.zoo import get_entry

    def at(batch: int):  # type: ignore[no-untyped-def]
        zm = get_entry("tiny-cnn").build()
        return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=batch)

    zm = get_entry("tiny-cnn").build()
    cal = autotune.calibrate(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=8)
    assert cal.sizes == (4, 8) and cal.device == "CPU:0" and cal.tensorflow
    assert 0 < cal.duplex_bytes_per_s <= min(cal.d2h_bytes_per_s, cal.h2d_bytes_per_s)
    timed = [p for p in cal.ops.values() if p.seconds[1] > 0]
    assert any(p.type == "Conv2DBackpropFilter" for p in timed)
    big = at(32)
    costs = cal.costs(big.graph)
    assert costs.measured == len(big.graph.ops) and not costs.by_type + costs.estimated
    predicted = sum(costs.seconds.values())
    assert predicted > 2.5 * sum(cal.costs(at(8).graph).seconds.values())
    measured = step_seconds(big.concrete_function, example_tensors(big.specs), 3)
    assert 0.5 < predicted / measured < 2.0, (predicted, measured)


def test_the_cli_calibrates_and_its_profile_is_the_device_of_simulate_and_verify(
    tmp_path: Path,
) -> None:
    profile = str(tmp_path / "profile.json")
    made = cli_json("calibrate", "--model", "tiny-cnn", "--batch-size", "8", "--steps", "2",
                    "--out", profile)  # fmt: skip
    assert made["profile"] == profile and made["sizes"] == [4, 8]
    assert 0 < made["ops_timed"] < made["ops"] and made["d2h_bytes_per_s"] > 0
    assert json.loads(Path(profile).read_text())["device"] == "CPU:0"

    model = ("--model", "tiny-cnn", "--batch-size", "16")
    sim = cli_json("simulate", *model, "--device", profile, "--gpu-memory", "1GiB")
    assert sim["step_seconds"] > 0 and sim["device"].startswith("calibrated-")
    assert sim["op_times"].endswith("ops from their own calibration")
    ver = cli_json("verify", *model, "--n-tensors", "2", "--device", profile, "--steps", "2")
    assert ver["predicted_step_seconds"] > 0 and ver["time_model"] == sim["device"]
    assert ver["step_seconds"] > 0
    plain = cli_json("verify", *model, "--n-tensors", "2", "--steps", "2")
    assert plain["predicted_step_seconds"] is None  # a GPU preset says nothing of this CPU
    measured = cli_json("measure", *model, "--repeats", "2")
    times = measured["steps_seconds"]
    assert len(times) == 2 and measured["step_seconds"] == pytest.approx(sum(times) / 2)

    out = run_cli("fit", *model, "--device", profile)
    assert out.returncode == 2 and "give --gpu-memory" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--device", "nosuch"], "unknown device 'nosuch'"),
        (["--device", "missing.json"], "cannot read calibration profile missing.json"),
    ],
)
def test_a_bad_device_is_one_line(args: list[str], needle: str) -> None:
    out = run_cli("simulate", "--model", "tiny-cnn", "--batch-size", "2", *args)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def test_calibrate_refuses_a_batch_it_cannot_halve() -> None:
    out = run_cli("calibrate", "--model", "tiny-cnn", "--batch-size", "1")
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and lines == [lines[0]] and "--batch-size 2 or more" in lines[0]
