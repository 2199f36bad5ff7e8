"""`autotune simulate` with swap parameters and device presets (tiny models, CPU)."""

import pytest

from tests.autotune.cli_helpers import cli_json, run_cli

pytestmark = pytest.mark.tf

KEYS = (
    "host_peak_bytes",
    "step_seconds",
    "baseline_step_seconds",
    "overhead",
    "lower_bound_bytes",
    "swapped_tensors",
    "peak_bytes",
)


# the original tool's default plan on the tiny 3D U-Net
SWAP_ALL = ("simulate", "--model", "tiny-unet3d", "--batch-size", "4", "--n-tensors", "-1")


def test_default_plan_on_a_preset_reports_memory_time_and_bound() -> None:
    out = cli_json(*SWAP_ALL, "--device", "v100-16gb-pcie3")
    for key in KEYS:
        assert out[key] is not None, key
    assert out["swapped_tensors"] > 0 and out["host_peak_bytes"] > 0
    assert out["step_seconds"] >= out["baseline_step_seconds"] > 0
    assert out["overhead"] == pytest.approx(out["step_seconds"] / out["baseline_step_seconds"])
    assert out["persistent_bytes"] < out["lower_bound_bytes"] <= out["baseline_peak_bytes"]
    assert out["device"] == "v100-16gb-pcie3"


def test_n_tensors_zero_is_the_no_swap_simulation() -> None:
    plain = cli_json("simulate", "--model", "tiny-cnn", "--batch-size", "8")
    none = cli_json("simulate", "--model", "tiny-cnn", "--batch-size", "8", "--n-tensors", "0")
    assert none["peak_bytes"] == plain["peak_bytes"] == none["baseline_peak_bytes"]
    assert none["swapped_tensors"] == 0 and none["host_peak_bytes"] == 0


def test_slower_link_costs_more_time() -> None:
    args = (*SWAP_ALL, "--device", "v100-16gb-nvlink2")
    fast = cli_json(*args)
    slow = cli_json(*args, "--link-bandwidth", "1GB")
    assert slow["step_seconds"] > fast["step_seconds"]
    assert slow["baseline_step_seconds"] == fast["baseline_step_seconds"]


def test_python_api_takes_plan_options_and_a_device() -> None:
    import autotune
    from autotune.zoo import get_entry

    zm = get_entry("tiny-cnn").build()
    sim = autotune.simulate(
        zm.model,
        loss=zm.loss,
        optimizer=zm.optimizer,
        batch_size=8,
        n_tensors=2,
        lb=2,
        ub=5,
        device="a100-40gb-pcie4",
    )
    assert sim.swapped_tensors == 2 and len(sim.plan.swaps) == 2
    assert sim.evaluation.params.lb == 2 and sim.overhead is not None
    assert sim.to_dict()["params"]["ub"] == 5


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--device", "tpu-v9"], "unknown device 'tpu-v9'"),
        (["--lb", "0"], ">= 1"),
        (["--lb", "5", "--ub", "2"], "lb <= ub"),
        (["--n-tensors", "-3"], ">= -1"),
        (["--gpu-memory", "12 parsecs", "--device", "v100-16gb-pcie3"], "cannot read size"),
        (["--gpu-memory", "8GiB"], "name one"),
    ],
)
def test_bad_plan_or_device_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    out = run_cli("simulate", "--model", "tiny-cnn", "--batch-size", "2", *args)
    assert out.returncode == 2, out.stderr
    lines = [x for x in out.stderr.splitlines() if x.strip() and not x.startswith("WARNING: All")]
    assert len(lines) == 1 and needle in lines[0], out.stderr
