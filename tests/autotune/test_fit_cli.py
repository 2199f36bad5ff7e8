"""`autotune fit` as a user runs it: output, report files, bad input, resume, two workers."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.autotune.cli_helpers import cli_json, run_cli

pytestmark = pytest.mark.tf

TINY = ("--model", "tiny-cnn", "--gpu-memory", "90MiB", "--quiet")


def tf_log(line: str) -> bool:
    """TensorFlow's own C++ start-up log lines (printed before its logging is set up)."""
    return bool(re.match(r"[IWE]\d{4} ", line)) or line.startswith("WARNING: All log messages")


def one_line_error(out: subprocess.CompletedProcess[str], needle: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip() and not tf_log(line)]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_fit_json_and_report_files(tmp_path: Path) -> None:
    out = cli_json("fit", *TINY, "--batch-size", "256", "--trials", "10", "--out", str(tmp_path))
    for key in ("batch_size", "params", "predicted_peak_bytes", "predicted_overhead"):
        assert out[key] is not None
    assert out["tuning_seconds"] > 0 and out["batch_size"] == 256
    assert out["predicted_peak_bytes"] <= out["budget_bytes"] < out["baseline_peak_bytes"]
    assert out["baseline_step_seconds"] <= out["time_bound_seconds"]
    assert out["time_bound_seconds"] <= out["predicted_step_seconds"]
    # a cheap chain makes nothing of tiny-cnn's again
    assert out["recomputed_tensors"] == 0 == out["recompute_seconds"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["params"] == out["params"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["swaps"]) == out["swapped_tensors"] > 0
    assert plan["order_edges"] == out["order_edges"]  # none, or the ones the study chose
    assert out["order_edges"] == [] or out["params"]["serialize"] is True
    assert (tmp_path / "study.db").exists() and (tmp_path / "trials.csv").exists()
    report = (tmp_path / "report.md").read_text()
    assert "## Largest tensors live at the peak (op " in report
    table = report.split("## Largest tensors live at the peak")[1].split("##")[0]
    assert "| original " in table or "| swap-in " in table
    edges = report.split("## Order edges")[-1]  # after the tables and plots, when there are any
    assert not out["order_edges"] or "## Order edges" in report
    for before, after in out["order_edges"]:
        assert f"- `{after}` waits for `{before}`" in edges


def test_verify_runs_the_tuned_step_and_reports_what_it_measured(tmp_path: Path) -> None:
    args = ("fit", *TINY, "--batch-size", "256", "--trials", "6", "--verify")
    out = cli_json(*args, "--out", str(tmp_path))
    v = out["verification"]
    assert v["device"] == "emulated" and v["params"] == out["params"]
    assert 0 < v["measured_peak_bytes"] < v["baseline_measured_peak_bytes"]
    assert v["swap_ops_executed"] == v["swap_ops"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["verification"] == v
    text = run_cli(*[a for a in args if a != "--quiet"], "--out", str(tmp_path / "again"))
    assert text.returncode == 0, text.stderr
    assert "verified: the tuned and the original step run on the emulated device" in text.stdout
    assert "% (predicted against measured, tuned)" in text.stdout
    report = (tmp_path / "report.md").read_text()
    assert "Measured on the emulated device against predicted" in report
    # the table prints MiB rounded to 2 decimals in tabulate's default "g" format (75.9, not 75.90)
    assert f" {round(v['measured_peak_bytes'] / 2**20, 2):g} |" in report


def test_max_batch_json_has_every_baseline(tmp_path: Path) -> None:
    out = cli_json("fit", *TINY, "--max-batch", "--trials", "8", "--out", str(tmp_path))
    assert out["max_batch_tuned"] == out["batch_size"] > out["max_batch_no_swap"] > 0
    assert set(out["baselines"]) == {
        "no swapping", "recompute only", "original defaults", "original auto-tuner",
        "random search",
    }  # fmt: skip
    for b in out["baselines"].values():
        assert b["max_batch"] >= 0 and "overhead" in b


def test_max_cube_finds_the_largest_edge_and_tunes_there(tmp_path: Path) -> None:
    from autotune.api import build_engine, capture
    from autotune.zoo import get_entry
    from simulator import get_preset
    from simulator.derive import PlanParams

    args = ("--model", "tiny-unet3d", "--gpu-memory", "40MiB", "--trials", "4", "--quiet")
    out = cli_json("fit", *args, "--max-cube", "--out", str(tmp_path))
    entry = get_entry("tiny-unet3d")
    assert out["cube"] == out["max_cube_tuned"] > out["max_cube_no_swap"] > 0
    assert out["max_cube_tuned"] % entry.cube_step == 0 and out["batch_size"] == 1
    assert out["predicted_peak_bytes"] <= out["budget_bytes"]
    assert "max_batch_tuned" not in out and out["max_batch_limited_by"]
    # one step above the no-swap edge, the step does not fit without swapping
    zm = entry.build(cube=out["max_cube_no_swap"] + entry.cube_step)
    cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=1)
    engine = build_engine(cap, get_preset(out["device"]))
    assert engine.evaluate(PlanParams(n_tensors=0)).peak_bytes > out["budget_bytes"]


def test_table_output_and_a_model_from_the_users_file(tmp_path: Path) -> None:
    src = tmp_path / "mymodel.py"
    src.write_text(
        "import keras\n"
        "def build():\n"
        "    inp = keras.Input((16, 16, 3))\n"
        "    x = inp\n"
        "    for _ in range(4):\n"
        "        x = keras.layers.Conv2D(8, 3, padding='same', activation='relu')(x)\n"
        "    x = keras.layers.GlobalAveragePooling2D()(x)\n"
        "    m = keras.Model(inp, keras.layers.Dense(4)(x))\n"
        "    m.compile(loss='sparse_categorical_crossentropy', optimizer='sgd')\n"
        "    return m\n"
    )
    out = run_cli(
        "fit", "--model", f"{src}:build", "--batch-size", "64", "--gpu-memory", "16GiB",
        "--out", str(tmp_path / "out"), "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "fits without swapping" in out.stdout and "lower bound" in out.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "nope", "--batch-size", "8"], "unknown model 'nope'"),
        (["--model", "tiny-cnn", "--batch-size", "8", "--device", "tpu"], "unknown device 'tpu'"),
        (["--model", "tiny-cnn", "--batch-size", "8", "--trials", "0"], "positive integer"),
        (["--model", "tiny-cnn", "--batch-size", "8", "--trials", "-2"], "positive integer"),
        (["--model", "tiny-cnn"], "--batch-size B or --max-batch"),
        (["--model", "tiny-cnn", "--max-cube"], "needs a volumetric zoo model"),
        (["--model", "tiny-unet3d", "--max-cube", "--cube", "16"], "give neither"),
        (["--model", "tiny-cnn", "--batch-size", "8", "--recompute", "often"], "invalid choice"),
        (["--model", "tiny-cnn", "--batch-size", "8", "--gpu-memory", "lots"], "size"),
        (["--model", "nofile.py:build", "--batch-size", "8"], "does not exist"),
        (["--model", "tiny-cnn", "--batch-size", "9", "--replicas", "2"], "split evenly"),
        (
            ["--model", "tiny-cnn", "--batch-size", "256", "--gpu-memory", "1MiB"],
            "smallest device memory that could ever fit is",
        ),
        (
            ["--model", "tiny-cnn", "--batch-size", "256", "--gpu-memory", "80MiB",
             "--storage", "sqlite:////nonexistent/dir/study.db"],
            "cannot open study storage",
        ),
        (
            ["--model", "tiny-cnn", "--batch-size", "256", "--gpu-memory", "80MiB",
             "--storage", "nosuchdb://x"],
            "cannot open study storage",
        ),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    one_line_error(run_cli("fit", *args, "--out", str(tmp_path), "--quiet"), needle)


def complete_trials(db: Path) -> list[tuple[int, str]]:
    """(number, parameters) of the finished trials stored in the study file."""
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as con:
        try:
            rows = con.execute(
                "SELECT t.number, group_concat(p.param_name || '=' || p.param_value) "
                "FROM trials t JOIN trial_params p ON p.trial_id = t.trial_id "
                "WHERE t.state = 'COMPLETE' GROUP BY t.trial_id ORDER BY t.number"
            ).fetchall()
        except sqlite3.OperationalError:
            return []
    return [(int(n), str(p)) for n, p in rows]


def states(db: Path) -> list[str]:
    with sqlite3.connect(db, timeout=30) as con:
        return [s for (s,) in con.execute("SELECT state FROM trials")]


def start_fit(out: Path, trials: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = ["fit", *TINY, "--batch-size", "256", "--trials", str(trials), "--out", str(out)]
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.cli.main", *args, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_trials(db: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while len(complete_trials(db)) < n:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_interrupted_study_resumes_with_its_trials_kept(tmp_path: Path) -> None:
    db = tmp_path / "study.db"
    first = start_fit(tmp_path, 2000)
    wait_for_trials(db, 4, first)
    first.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130 and "resume" in err and "Traceback" not in err, err
    assert "stopping after this trial" in err  # not raised inside the database's driver
    kept = complete_trials(db)
    second = start_fit(tmp_path, 2000)
    wait_for_trials(db, len(kept) + 3, second)
    second.kill()  # no chance to clean up
    second.wait(timeout=60)
    survived = complete_trials(db)
    assert survived[: len(kept)] == kept and len(survived) >= len(kept) + 3
    total = len(survived) + 5
    done = run_cli(*start_fit_args(tmp_path, total), "--json")
    assert done.returncode == 0, done.stderr
    final = complete_trials(db)
    assert len(final) == total and final[: len(survived)] == survived
    assert json.loads(done.stdout.splitlines()[-1])["trials"] >= total


def start_fit_args(out: Path, trials: int) -> list[str]:
    return ["fit", *TINY, "--batch-size", "256", "--trials", str(trials), "--out", str(out)]


def test_two_workers_on_one_study_finish_the_trials_together(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    extra = ("--storage", f"sqlite:///{db}", "--study", "shared")
    workers = [start_fit(tmp_path / f"w{i}", 30, *extra) for i in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=600)
        assert w.returncode == 0, err
    done = complete_trials(db)
    assert 30 <= len(done) <= 31  # each stops once 30 are done; one may finish a last trial
    assert [n for n, _ in done] == list(range(len(done)))  # none lost, none duplicated
    assert set(states(db)) == {"COMPLETE"}


def test_fit_max_batch_keeps_the_host_peak_within_host_memory(tmp_path: Path) -> None:
    # swap only: recomputes (convolutions too) free memory without the host's
    args = ("fit", *TINY, "--max-batch", "--trials", "8", "--recompute", "none")
    free = cli_json(*args, "--out", str(tmp_path / "free"))
    assert free["host_memory_bytes"] is None  # no GPU here: no default limit, but reported
    assert free["predicted_host_peak_bytes"] > 0
    assert "device memory" in free["max_batch_limited_by"]
    host = free["predicted_host_peak_bytes"] // 2
    out = cli_json(*args, "--host-memory", str(host), "--out", str(tmp_path / "limited"))
    assert out["host_memory_bytes"] == host
    assert out["predicted_host_peak_bytes"] <= host
    assert out["max_batch_limited_by"] == "host memory"
    assert out["max_batch_tuned"] < free["max_batch_tuned"]
    text = run_cli(*args, "--host-memory", str(host), "--out", str(tmp_path / "limited")).stdout
    assert "host peak" in text and "limited by   host memory" in text


def test_replicas_tune_their_share_of_the_batch_and_of_the_host(tmp_path: Path) -> None:
    # four GPUs of one machine: each tunes the step alone with a quarter of the host memory
    base = ("fit", *TINY, "--max-batch", "--trials", "8", "--recompute", "none")
    free = cli_json(*base, "--out", str(tmp_path / "free"))
    host = free["predicted_host_peak_bytes"] * 2  # the machine's: half a peak per replica
    four = cli_json(*base, "--replicas", "4", "--host-memory", str(host), "--out", str(tmp_path))
    assert four["host_memory_bytes"] == host // 4 and four["machine_host_memory_bytes"] == host
    assert four["max_batch_limited_by"] == "host memory"  # its quarter, not the machine's
    assert four["max_batch_tuned"] < free["max_batch_tuned"]
    assert four["global_max_batch_tuned"] == 4 * four["max_batch_tuned"]
    assert four["global_batch_size"] == 4 * four["batch_size"]
    assert four["machine_host_peak_bytes"] == 4 * four["predicted_host_peak_bytes"] <= host
    text = run_cli(*base, "--replicas", "4", "--host-memory", str(host), "--out", str(tmp_path))
    assert f"replicas     4: batch {four['batch_size']} each" in text.stdout
    assert "for 4 replicas of" in text.stdout


def test_fit_refuses_a_host_memory_that_is_no_size() -> None:
    one_line_error(run_cli("fit", *TINY, "--max-batch", "--host-memory", "lots"), "host-memory")


def test_the_same_seed_gives_the_same_plan_with_a_storage_url(tmp_path: Path) -> None:
    args = ("fit", *TINY, "--batch-size", "256", "--trials", "12", "--seed", "4")
    plain = cli_json(*args, "--out", str(tmp_path / "plain"))
    stored = [
        cli_json(
            *args, "--out", str(tmp_path / f"s{i}"), "--storage", f"sqlite:///{tmp_path}/{i}.db"
        )
        for i in range(2)
    ]
    assert plain["params"] == stored[0]["params"] == stored[1]["params"]
