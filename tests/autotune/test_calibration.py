"""The calibration profile: each op's line through its two points, matching the profile to a
graph, the fallbacks for ops it lacks, and the file (no TensorFlow)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.calibration import (
    Calibration,
    OpPoints,
    calibrated_device,
    load_calibration,
    op_elements,
    resolve_device,
)
from autotune.planfile import graph_positions, structure_digest
from simulator import Graph, Link
from simulator.errors import UserError
from tests.simulator.builders import add


def _graph(batch: int, prefix: str = "") -> Graph:
    """x -> conv -> relu -> loss, sizes proportional to `batch` (op names under `prefix`)."""
    g = Graph("g")
    x = add(g, f"{prefix}x", [], 64 * batch, type="Placeholder")
    c = add(g, f"{prefix}conv", x, 256 * batch, type="Conv2D")
    r = add(g, f"{prefix}relu", c, 256 * batch, type="Relu")
    loss = add(g, f"{prefix}loss", r, 4, type="Sum")
    g.mark_outputs(loss)
    return g


def _calibration(seconds: dict[str, tuple[float, float]], **kw: object) -> Calibration:
    """A profile of `_graph` at sizes 4 and 8 with the given seconds per op."""
    small, big = _graph(4), _graph(8)
    where = graph_positions(big)
    ops = {
        where[name]: OpPoints(
            name,
            op.type,
            (op_elements(small, name), op_elements(big, name)),
            seconds.get(name, (0.0, 0.0)),
        )
        for name, op in big.ops.items()
    }
    fields = dict(
        device="CPU:0",
        device_name="Test CPU",
        tensorflow="2.21.0",
        model="g",
        sizes=(4, 8),
        fingerprint=big.fingerprint(),
        structure=structure_digest(big, where),
        ops=ops,
        d2h_bytes_per_s=5e9,
        h2d_bytes_per_s=8e9,
        duplex_bytes_per_s=3e9,
        step_seconds=(0.01, 0.02),
    )
    fields.update(kw)
    return Calibration(**fields)  # type: ignore[arg-type]


def test_an_op_takes_the_line_through_its_two_points_in_elements() -> None:
    p = OpPoints("conv", "Conv2D", (100, 200), (0.002, 0.003))
    assert p.at(200) == pytest.approx(0.003)
    assert p.at(1000) == pytest.approx(0.002 + 0.001 * 900 / 100)
    assert p.at(10) == pytest.approx(0.002)  # never below the smaller point


def test_a_falling_or_flat_op_takes_the_mean_of_its_points() -> None:
    assert OpPoints("a", "Sum", (100, 200), (0.004, 0.002)).at(800) == pytest.approx(0.003)
    assert OpPoints("b", "ApplyAdam", (50, 50), (0.001, 0.003)).at(50) == pytest.approx(0.002)


def test_a_graph_at_another_batch_is_priced_by_the_lines_of_its_own_ops() -> None:
    cal = _calibration({"conv": (0.004, 0.008), "relu": (0.001, 0.002), "loss": (1e-5, 1e-5)})
    costs = cal.costs(_graph(32))
    assert costs.measured == 4 and costs.by_type == costs.estimated == costs.unpriced == 0
    assert costs.seconds["conv"] == pytest.approx(0.032)  # 8x the elements of batch 4
    assert costs.seconds["relu"] == pytest.approx(0.008)
    assert costs.seconds["loss"] == pytest.approx(1e-5)
    assert costs.note == "4 ops from their own calibration"


def test_a_graph_that_differs_only_in_its_names_is_matched_by_position() -> None:
    cal = _calibration({"conv": (0.004, 0.008)})
    costs = cal.costs(_graph(16, prefix="model_2/"))
    assert costs.measured == 4
    assert costs.seconds["model_2/conv"] == pytest.approx(0.016)


def test_ops_the_profile_lacks_take_their_types_rate_then_the_estimate() -> None:
    cal = _calibration({"conv": (0.004, 0.008), "relu": (0.001, 0.002)})
    g = _graph(8)
    extra_in = add(g, "extra_relu", ["relu:0"], 256 * 8, type="Relu")
    add(g, "softmax", extra_in, 256 * 8, type="Softmax")
    calls = []
    costs = cal.costs(g, lambda: calls.append(1) or {"softmax": 0.5})
    rate = 0.002 / op_elements(_graph(8), "relu")
    assert costs.seconds["extra_relu"] == pytest.approx(rate * op_elements(g, "extra_relu"))
    assert costs.seconds["softmax"] == 0.5 and calls == [1]
    assert (costs.measured, costs.by_type, costs.estimated) == (4, 1, 1)
    assert "1 from the rate of their op type" in costs.note
    assert "1 from Grappler's estimate" in costs.note
    without = cal.costs(g)
    assert without.seconds["softmax"] == 0.0 and without.unpriced == 1
    assert "1 unpriced" in without.note


def test_an_op_whose_cpu_kernel_switches_algorithm_is_said() -> None:
    cal = _calibration({"conv": (0.004, 0.008)})
    conv = next(k for k, p in cal.ops.items() if p.name == "conv")
    cal.ops[conv] = replace(cal.ops[conv], scratch=(False, False))
    g = _graph(64)
    assert cal.costs(g).switched == 0
    g.ops["conv"].cpu_scratch = 1 << 20  # the column-buffer algorithm at this size
    costs = cal.costs(g)
    assert costs.switched == costs.switched_unprobed == 1
    assert "1 of them run another kernel" in costs.note and "calibrate nearer" in costs.note
    assert costs.seconds["conv"] == pytest.approx(cal.ops[conv].at(op_elements(g, "conv")))


def test_a_switched_op_is_priced_on_the_line_of_its_other_algorithm_when_probed() -> None:
    cal = _calibration({"conv": (0.004, 0.008)})
    conv = next(k for k, p in cal.ops.items() if p.name == "conv")
    e8 = cal.ops[conv].elements[1]
    other = ((8 * e8, 16 * e8), (0.010, 0.018))  # a third of the calibrated rate per element
    cal.ops[conv] = replace(cal.ops[conv], scratch=(False, False), other=other)
    g = _graph(64)
    g.ops["conv"].cpu_scratch = 1 << 20
    costs = cal.costs(g)
    assert costs.switched == 1 and costs.switched_unprobed == 0
    assert "calibrate nearer" not in costs.note
    assert costs.seconds["conv"] == pytest.approx(
        0.010 + 0.008 * (op_elements(g, "conv") - 8 * e8) / (8 * e8)
    )
    g.ops["conv"].cpu_scratch = 0  # the calibrated algorithm again: its own line
    assert cal.costs(g).seconds["conv"] == pytest.approx(0.064)
    assert cal.costs(g).switched == 0


def test_the_profile_round_trips_through_its_file(tmp_path: Path) -> None:
    cal = _calibration({"conv": (0.004, 0.008)}, memory_bytes=16 << 30)
    conv = next(k for k, p in cal.ops.items() if p.name == "conv")
    cal.ops[conv] = replace(cal.ops[conv], scratch=(False, True), other=((9, 18), (0.1, 0.2)))
    path = cal.save(tmp_path / "sub" / "profile.json")
    assert load_calibration(path) == cal
    assert json.loads(path.read_text())["format"] == "autotune-calibration/1"


def test_a_calibrated_device_carries_the_measured_link_and_memory(tmp_path: Path) -> None:
    cal = _calibration({}, memory_bytes=8 << 30)
    dev = resolve_device(str(cal.save(tmp_path / "p.json")))
    assert (dev.d2h_bytes_per_s, dev.h2d_bytes_per_s) == (5e9, 8e9)
    assert dev.link == Link(5e9, 8e9, both=3e9) and dev.link.shared  # measured both ways at once
    assert dev.sharing_link(2).link == Link(2.5e9, 4e9, both=1.5e9)
    assert dev.with_overrides(link_bytes_per_s=1e9).link == Link(1e9, 1e9)
    assert dev.memory_bytes == 8 << 30 and dev.calibration == cal and dev.kind == "GPU"
    assert dev.name.startswith("calibrated-test-cpu-")
    assert calibrated_device(_calibration({})).memory_bytes == 0  # unknown: given by the user
    assert resolve_device("v100-16gb-pcie3").calibration is None


@pytest.mark.parametrize(
    "text,needle",
    [
        (None, "cannot read calibration profile"),
        ("{", "is not a calibration profile"),
        ('{"format": 1}', "not a calibration profile (format 1)"),
        ('{"format": "autotune-calibration/1"}', "is not a calibration profile"),
    ],
)
def test_a_bad_profile_is_one_clear_error(tmp_path: Path, text: str | None, needle: str) -> None:
    path = tmp_path / "p.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=None) as err:
        load_calibration(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
