"""A plan tuned in one process and applied in a fresh one, with no search."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.autotune.cli_helpers import cli_json

pytestmark = pytest.mark.tf

APPLY = """
import json, sys
import autotune
from autotune.zoo import get_entry
from simulator import InvalidPlan
path = sys.argv[1]
zm = get_entry("tiny-cnn").build()
kw = {"loss": zm.loss, "optimizer": zm.optimizer}
same = autotune.rewrite(zm.model, batch_size=256, plan=path, **kw)
other = autotune.rewrite(zm.model, batch_size=128, plan=path, **kw)
t = get_entry("tiny-transformer").build()
try:
    autotune.rewrite(t.model, loss=t.loss, optimizer=t.optimizer, batch_size=4, plan=path)
    refused = ""
except InvalidPlan as err:
    refused = str(err)
print(json.dumps({
    "same": same.plan.to_dict(), "other": other.plan.to_dict(), "refused": refused,
    "searched": "optuna" in sys.modules,
}))
"""


def test_a_plan_file_applies_in_a_fresh_process_without_a_search(tmp_path: Path) -> None:
    args = ("--model", "tiny-cnn", "--gpu-memory", "90MiB", "--quiet", "--trials", "6")
    out = cli_json("fit", *args, "--batch-size", "256", "--out", str(tmp_path))
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["batch_size"] == 256 and saved["format"] == 1
    assert set(saved["versions"]) == {"tf-swap-autotune", "tensorflow"}
    assert len(saved["graph_fingerprint"]) == 16 and saved["params"] == out["params"]
    run = subprocess.run(
        [sys.executable, "-c", APPLY, str(tmp_path / "plan.json")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert not got["searched"]
    assert got["same"]["swaps"] == saved["swaps"] and got["same"]["swaps"]
    assert got["same"]["order_edges"] == saved["order_edges"]
    # at batch 128 the same parameters derive the plan there: the same tensors, half the bytes
    halves = {s["tensor"]: s["nbytes"] // 2 for s in saved["swaps"]}
    assert {s["tensor"]: s["nbytes"] for s in got["other"]["swaps"]} == halves
    assert "saved for another graph" in got["refused"]


SHIFTED = """
import json, sys
import numpy as np
import autotune
from autotune.planfile import graph_positions
from autotune.run.measure import example_tensors
from autotune.zoo import get_entry
get_entry("tiny-transformer").build()  # takes names: this process's layers are named otherwise
a, b = get_entry("tiny-cnn").build(), get_entry("tiny-cnn").build()
kw = {"batch_size": 256}
original = autotune.capture(a.model, loss=a.loss, optimizer=a.optimizer, **kw)
tuned = autotune.rewrite(b.model, loss=b.loss, optimizer=b.optimizer, plan=sys.argv[1], **kw)
where = graph_positions(autotune.capture(b.model, loss=b.loss, optimizer=b.optimizer, **kw).graph)
inputs = example_tensors(original.specs, seed=7)
same = bool(np.array_equal(original.concrete_function(*inputs).numpy(), tuned(*inputs).numpy()))
state = zip([*a.model.weights, *a.optimizer.variables], [*b.model.weights, *b.optimizer.variables])
same = same and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in state)
swaps = tuned.plan.to_dict()["swaps"]
print(json.dumps({"swaps": swaps, "at": [where[s["tensor"]] for s in swaps], "same": same}))
"""


def test_a_plan_file_applies_to_the_model_built_under_other_layer_names(tmp_path: Path) -> None:
    # a notebook saves the plan, a script builds the model after others: conv2d_9, not conv2d
    args = ("--model", "tiny-cnn", "--gpu-memory", "90MiB", "--quiet", "--trials", "6")
    cli_json("fit", *args, "--batch-size", "256", "--out", str(tmp_path))
    saved = json.loads((tmp_path / "plan.json").read_text())
    run = subprocess.run(
        [sys.executable, "-c", SHIFTED, str(tmp_path / "plan.json")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    theirs = saved["swaps"]
    assert theirs and {s["tensor"] for s in got["swaps"]}.isdisjoint(s["tensor"] for s in theirs)
    assert got["at"] == [saved["positions"][s["tensor"]] for s in theirs]
    assert [s["nbytes"] for s in got["swaps"]] == [s["nbytes"] for s in theirs]
    assert got["same"]  # and the renamed step trains bitwise like the original


def test_a_file_that_is_no_plan_is_one_clear_error(tmp_path: Path) -> None:
    from autotune.planfile import load_plan
    from simulator import InvalidPlan

    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(InvalidPlan, match="not a plan file"):
        load_plan(bad)
    with pytest.raises(InvalidPlan, match="cannot read plan file"):
        load_plan(tmp_path / "missing.json")


def test_a_plan_saved_in_this_process_applies_to_the_model_built_again(tmp_path: Path) -> None:
    import autotune
    from autotune.zoo import get_entry
    from simulator import InvalidPlan

    first = get_entry("tiny-cnn").build()
    kw = {"loss": first.loss, "optimizer": first.optimizer, "batch_size": 256}
    tuned = autotune.fit(first.model, gpu_memory="90MiB", trials=6, out=tmp_path, **kw)
    path = tuned.save_plan(tmp_path / "plan.json")
    again = get_entry("tiny-cnn").build()  # the same model, its layers named conv2d_N now
    kw = {"loss": again.loss, "optimizer": again.optimizer, "batch_size": 256}
    step = autotune.rewrite(again.model, plan=path, **kw)
    assert [s.nbytes for s in step.plan.swaps] == [s.nbytes for s in tuned.plan.swaps]
    assert {s.tensor for s in step.plan.swaps}.isdisjoint(s.tensor for s in tuned.plan.swaps)
    other = get_entry("tiny-transformer").build()
    with pytest.raises(InvalidPlan, match="saved for another graph"):
        autotune.rewrite(other.model, loss=other.loss, optimizer=other.optimizer, batch_size=4,
                         plan=path)  # fmt: skip
