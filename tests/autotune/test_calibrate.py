"""`autotune calibrate` on this CPU: a profile from two batches that prices the step at others,
and its use as the device of simulate, fit and verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.autotune.cli_helpers import cli_json, run_cli

pytestmark = pytest.mark.tf


def test_a_profile_from_batches_4_and_8_prices_batch_32_on_each_ops_line() -> None:
    """Each op of the step at batch 32 is priced from its own two measured points, on the line
    through them: at batch 8 the price is what was measured there, and at 32 it grows as the
    line does. How close that comes to a measured step time is the time-model benchmark's
    figure (`python -m autotune.benchmarks.time_model --quick`): a wall-clock ratio on a
    shared 2-core machine is noise, not a test."""
    import autotune
    from autotune.api import capture
    from autotune.calibration import op_elements
    from autotune.planfile import graph_positions
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
    small, big = at(8).graph, at(32).graph
    at_8, at_32 = cal.costs(small), cal.costs(big)
    assert at_32.measured == len(big.ops) and not at_32.by_type + at_32.estimated
    names_8 = {pos: n for n, pos in graph_positions(small).items()}
    names_32 = {pos: n for n, pos in graph_positions(big).items()}
    rising = {pos: p for pos, p in cal.ops.items()
              if p.seconds[1] > p.seconds[0] and p.elements[1] > p.elements[0]}  # fmt: skip
    assert rising
    for pos, p in rising.items():
        assert at_8.seconds[names_8[pos]] == pytest.approx(p.seconds[1])
        (e4, e8), (s4, s8) = p.elements, p.seconds
        e32 = op_elements(big, names_32[pos])
        assert e32 > e8
        slope = (at_32.seconds[names_32[pos]] - s8) / (e32 - e8)
        assert slope == pytest.approx((s8 - s4) / (e8 - e4))
    falling = {pos: p for pos, p in cal.ops.items() if p.seconds[1] < p.seconds[0]}
    for pos, p in falling.items():  # noise, not a line: the mean at every size
        mean = sum(p.seconds) / 2
        assert at_8.seconds[names_8[pos]] == at_32.seconds[names_32[pos]] == pytest.approx(mean)
    assert sum(at_32.seconds.values()) > sum(at_8.seconds.values())


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


def test_a_profile_that_lacks_the_steps_ops_says_so_and_from_which_tensorflow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A profile of another model prices none of this step's ops itself: Grappler's estimate
    for the profile's GPU does, and the tool says how many, and that the profile was taken
    with another TensorFlow."""
    import tensorflow as tf

    from autotune.calibration import Calibration, calibrated_device
    from rewriter.capture import capture_function
    from rewriter.costs import grappler_costs, step_costs
    from simulator import get_preset

    @tf.function
    def step(x):  # type: ignore[no-untyped-def]
        return tf.reduce_sum(tf.nn.relu(x @ tf.ones([64, 64])))

    cap = capture_function(step, tf.TensorSpec([256, 64], tf.float32))
    v100 = get_preset("v100-16gb-nvlink2")
    compute = {"kind": "GPU", "sm_count": v100.sm_count, "clock_mhz": v100.clock_mhz,
               "memory_bandwidth_bytes_per_s": v100.memory_bandwidth_bytes_per_s}  # fmt: skip
    cal = Calibration("GPU:0", "Tesla V100", "2.0.0", "another", (8, 16), "", "", {},
                      12e9, 12e9, 10e9, (0.1, 0.2), compute, 16 << 30)  # fmt: skip
    with caplog.at_level("WARNING", logger="autotune"):
        costs = step_costs(cap, calibrated_device(cal))
    assert costs == grappler_costs(cap.concrete_function, calibrated_device(cal))[0]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"0 ops from their own calibration, {len(cap.graph.ops)} from Grappler's" in said
    assert "taken with TensorFlow 2.0.0" in said


def test_the_two_sizes_are_profiled_in_turn_and_each_op_takes_its_median(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ROUNDS` rounds, each profiling the smaller size then the larger: a slow spell of the
    machine falls on both sizes, and an op's time (and the step's) at a size is its median
    over the rounds, so one slow round moves neither."""
    from autotune.run import calibrate

    calls: list[str] = []
    slow = {("a", 2)}  # the third profile of size a: a slow spell

    def profiled(captured: str, steps: int) -> tuple[dict[str, float], float]:
        k = calls.count(captured)
        calls.append(captured)
        scale = 10.0 if (captured, k) in slow else 1.0
        base = 1.0 if captured == "a" else 2.0
        return {"op": base * scale, "only_in_a": 0.5} if captured == "a" else {"op": base}, base

    monkeypatch.setattr(calibrate, "ROUNDS", 5)
    monkeypatch.setattr(calibrate, "_op_seconds", profiled)
    times, walls = calibrate._rounds(["a", "b"], (8, 16), 3, None)  # type: ignore[list-item]
    assert calls == ["a", "b"] * 5
    assert times == [{"op": 1.0, "only_in_a": 0.5}, {"op": 2.0}]
    assert walls == [1.0, 2.0]
