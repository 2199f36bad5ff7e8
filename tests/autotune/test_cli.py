import pytest

from autotune.search.core import DEFAULT_SAFETY_RATIO
from autotune.zoo import ZOO
from tests.autotune.cli_helpers import cli_json, run_cli


def _one_line_error(out, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_models_lists_the_zoo() -> None:
    assert set(cli_json("models")) == set(ZOO) >= {"resnet50", "unet3d-isensee2017", "gpt2-small"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["simulate", "--model", "nope", "--batch-size", "2"], "unknown model 'nope'"),
        (["simulate", "--model", "tiny-cnn", "--batch-size", "0"], "positive integer"),
        (["simulate", "--model", "tiny-cnn", "--batch-size", "two"], "positive integer"),
        (["measure", "--model", "tiny-cnn"], "--batch-size"),
        (
            ["measure", "--model", "tiny-cnn", "--batch-size", "2", "--warmup-steps", "0"],
            "positive integer",
        ),
        (["simulate", "--model", "tiny-cnn", "--batch-size", "2", "--cube", "8"], "no cube"),
        (["frobnicate"], "invalid choice"),
        (
            ["simulate", "--model", "tiny-cnn", "--batch-size", "2", "--prefetch", "1GiB"],
            "--prefetch needs --device",
        ),
        (
            ["simulate", "--model", "tiny-cnn", "--batch-size", "2", "--recompute-heavy", "1"],
            "--recompute-heavy needs --device",
        ),
        (
            ["simulate", "--model", "tiny-cnn", "--batch-size", "2", "--recompute-heavy", "-1"],
            "at least 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    _one_line_error(run_cli(*args), needle)


@pytest.mark.tf
def test_an_error_after_a_progress_bar_starts_its_own_line() -> None:
    out = run_cli("fit", "--model", "tiny-cnn", "--batch-size", "8", "--gpu-memory", "1KiB")
    assert out.returncode == 2 and "preparing" in out.stderr  # the bar was drawn
    last = out.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("autotune: error: budget 931 B (0.91 of 1.00 KiB (1024 B)) is below")


@pytest.mark.tf
def test_simulate_json_has_the_promised_keys() -> None:
    out = cli_json("simulate", "--model", "tiny-cnn", "--batch-size", "4")
    for key in ("peak_bytes", "persistent_bytes", "ops", "levels", "simulate_seconds"):
        assert key in out
    assert out["peak_bytes"] > out["persistent_bytes"] > 0
    assert out["levels"] < out["ops"]
    largest = [t["bytes"] for t in out["largest_at_peak"]]
    assert 0 < len(largest) <= 10 and largest == sorted(largest, reverse=True)
    assert out["persistent_bytes"] + sum(largest) <= out["live_peak_bytes"]


@pytest.mark.tf
def test_simulate_json_bounds_the_time_of_a_plan_that_fits() -> None:
    args = ("simulate", "--model", "tiny-cnn", "--batch-size", "256")
    plan = ("--ub", "1", "--sync-out", "--device", "v100-16gb-nvlink2", "--gpu-memory", "95MiB",
            "--link-bandwidth", "1GB")  # fmt: skip
    out = cli_json(*args, *plan)
    assert out["peak_bytes"] <= DEFAULT_SAFETY_RATIO * (95 << 20) < out["baseline_peak_bytes"]
    assert out["baseline_step_seconds"] < out["time_bound_seconds"] <= out["step_seconds"]
    assert cli_json(*args)["time_bound_seconds"] is None  # no device, no time model
    early = cli_json(*args, *plan, "--prefetch", "87MiB")
    assert early["params"]["prefetch_bytes"] == 87 << 20
    assert early["time_bound_seconds"] <= early["step_seconds"]
    late = cli_json(*args, *plan, "--backward-swaps", "--limit", "87MiB")
    assert late["params"]["backward_swaps"] and late["params"]["limit"] == 87 << 20
    assert late["peak_bytes"] <= DEFAULT_SAFETY_RATIO * (95 << 20)
    cheap = cli_json(*args, *plan, "--recompute", "cheap", "--recompute-ops", "8")
    heavy = cli_json(*args, *plan, "--recompute", "cheap", "--recompute-ops", "8",
                     "--recompute-heavy", "1")  # fmt: skip
    assert heavy["params"]["recompute_heavy"] == 1.0
    assert heavy["recomputed_tensors"] > cheap["recomputed_tensors"]  # the convolutions' outputs
    assert heavy["recompute_seconds"] > cheap["recompute_seconds"]
    assert heavy["time_bound_seconds"] <= heavy["step_seconds"]


@pytest.mark.tf
def test_simulate_prints_units() -> None:
    out = run_cli("simulate", "--model", "tiny-cnn", "--batch-size", "4")
    assert out.returncode == 0, out.stderr
    assert "MiB" in out.stdout and " B)" in out.stdout and "level" in out.stdout
    assert "InitializeLog" not in out.stderr and "oneDNN" not in out.stderr  # TF's start-up
    # which peak this is: the step as this CPU runs it, not the order fit plans a GPU in
    assert "(BFC allocator model, executor order)" in out.stdout
    assert "to size a GPU budget, simulate with --device" in out.stdout
    out = run_cli("simulate", "--model", "tiny-cnn", "--batch-size", "4", "--device",
                  "v100-16gb-nvlink2")  # fmt: skip
    assert "(BFC allocator model, categorized order)" in out.stdout


_WITHOUT_TENSORFLOW = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("No module named 'tensorflow'")
sys.meta_path.insert(0, Block())
from autotune.cli.main import main
sys.exit(main(["simulate", "--model", "tiny-cnn", "--batch-size", "2"]))
"""


def test_without_tensorflow_the_cli_says_how_to_install_it() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TENSORFLOW], capture_output=True, text=True, timeout=120
    )
    _one_line_error(out, "pip install -e '.[cpu]'")


@pytest.mark.tf
def test_simulate_serialize_reports_its_order_edges_and_a_lower_peak() -> None:
    args = ("simulate", "--model", "tiny-transformer", "--batch-size", "4", "--ub", "1")
    plain = cli_json(*args, "--sync-out")
    serial = cli_json(*args, "--sync-out", "--serialize")
    assert plain["order_edges"] == [] and serial["order_edges"]
    assert serial["params"]["serialize"] is True
    assert serial["peak_bytes"] < plain["peak_bytes"]
    out = run_cli(*args, "--sync-out", "--serialize")
    assert f"{len(serial['order_edges'])} order edge" in out.stdout
    before, after = serial["order_edges"][0]
    assert f"{after} waits for {before}" in out.stdout


@pytest.mark.tf
def test_a_recorded_schedule_refuses_order_edges() -> None:
    args = ["--schedule", "recorded", "--n-tensors", "0", "--serialize"]
    out = run_cli("simulate", "--model", "tiny-cnn", "--batch-size", "2", *args)
    _one_line_error(out, "categorized order")


def test_an_error_raised_while_handling_ctrl_c_still_reads_as_an_interrupt() -> None:
    from autotune.cli.main import _caused_by_interrupt

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("database is locked")  # noqa: B904
    except RuntimeError as err:
        assert _caused_by_interrupt(err)
    assert not _caused_by_interrupt(RuntimeError("database is locked"))


def test_an_error_raised_after_ctrl_c_ends_as_the_interrupt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C inside a study's database transaction surfaces as the driver's or Optuna's
    error, whose chain need not hold the KeyboardInterrupt (seen: Optuna's "Should not
    reach." after SQLite's "cannot start a transaction within a transaction")."""
    import signal

    import autotune.cli.main as cli
    from autotune.search.core import INTERRUPTED

    def interrupted_in_a_transaction(_args: object) -> int:
        INTERRUPTED.set()
        raise AssertionError("Should not reach.")

    monkeypatch.setattr(cli, "cmd_models", interrupted_in_a_transaction)
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["models"]) == 130
    finally:
        INTERRUPTED.clear()
        signal.signal(signal.SIGINT, handler)
    err = capsys.readouterr().err
    assert "resume" in err and "Traceback" not in err


def test_a_ctrl_c_in_a_garbage_collector_callback_prints_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen in CI: the Ctrl-C landed in SQLAlchemy's weakref callback (`_collection_gced`),
    where Python prints it as "Exception ignored" with a traceback; the study then stopped at
    its next trial."""
    import logging
    import signal
    import sys
    import weakref

    import autotune.cli.main as cli
    from autotune.search.core import INTERRUPTED

    class Held:
        pass

    def ctrl_c_in_a_callback(_args: object) -> int:
        held = Held()
        ref = weakref.ref(held, lambda _: cli._on_ctrl_c(signal.SIGINT, None))
        del held  # the callback runs here, and its KeyboardInterrupt cannot unwind
        assert ref() is None and INTERRUPTED.is_set()
        raise KeyboardInterrupt  # as the study's next trial does

    monkeypatch.setattr(cli, "cmd_models", ctrl_c_in_a_callback)
    handler, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    sys.unraisablehook = sys.__unraisablehook__  # Python's own, not pytest's
    try:
        assert cli.main(["models"]) == 130
    finally:
        INTERRUPTED.clear()
        logging.disable(logging.NOTSET)
        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = hook
    err = capsys.readouterr().err
    assert "resume" in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_after_ctrl_c_libraries_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Seen in CI: a Ctrl-C while the study's trials were read made SQLAlchemy log "Error
    closing cursor" with a traceback to stderr (logging's last-resort handler)."""
    import logging

    from autotune.cli.main import _on_ctrl_c
    from autotune.search.core import INTERRUPTED

    pool = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
    try:
        try:
            _on_ctrl_c(2, None)
        except KeyboardInterrupt:
            try:
                raise RuntimeError("Cannot operate on a closed database.")
            except RuntimeError:
                pool.error("Error closing cursor", exc_info=True)
    finally:
        INTERRUPTED.clear()
        logging.disable(logging.NOTSET)
    assert not caplog.records
    pool.error("logged")  # the test's own check that the record would have been caught
    assert [r.getMessage() for r in caplog.records] == ["logged"]


def test_a_bug_in_the_tool_is_reported_as_one_and_not_as_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import autotune.cli.main as cli

    def broken(_args: object) -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    monkeypatch.setattr(cli, "cmd_models", broken)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err
    assert "internal error: KeyError: 'missing' (at test_cli.py:" in err
    assert "--debug" in err and "Traceback" not in err
    with pytest.raises(KeyError):
        cli.main(["--debug", "models"])


def test_bad_input_raised_deep_inside_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import autotune.cli.main as cli
    from simulator.errors import UserError

    def refuses(_args: object) -> int:
        raise UserError("lb must not exceed ub\nsecond line")

    monkeypatch.setattr(cli, "cmd_models", refuses)
    assert cli.main(["models"]) == 2
    assert capsys.readouterr().err == "autotune: error: lb must not exceed ub\n"


@pytest.mark.tf
def test_an_error_in_the_users_model_file_is_theirs_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "mine.py"
    model.write_text("def build():\n    return 1 / 0\n")
    out = run_cli("fit", "--model", f"{model}:build", "--batch-size", "2", "--out", str(tmp_path))
    _one_line_error(out, "your code raised ZeroDivisionError: division by zero")


def test_every_plan_parameter_is_an_option_read_into_its_field() -> None:
    import argparse

    from autotune.cli.main import build_parser
    from autotune.cli.options import plan_params
    from simulator.params import PARAMS, PlanParams

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("simulate", "verify"):
        options = sub.choices[command]._option_string_actions
        assert all(p.option in options for p in PARAMS), command
    given = "--prefetch 1GiB --no-postpone-waits --sync-out --include-types Relu,Conv2D"
    given += " --recompute-heavy 0.5 --lb 2 --ub 3 --recompute cheap --limit 2KiB"
    args = parser.parse_args(["simulate", "--model", "m", "--batch-size", "2", *given.split()])
    assert plan_params(args) == PlanParams(
        prefetch_bytes=2**30, postpone_waits=False, sync_out=True, include_types=("Relu", "Conv2D"),
        recompute_heavy=0.5, lb=2, ub=3, recompute="cheap", limit=2048,
    )  # fmt: skip
    bare = parser.parse_args(["simulate", "--model", "m", "--batch-size", "2"])
    assert plan_params(bare) is None
