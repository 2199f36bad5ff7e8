import contextlib
import multiprocessing
import threading
from pathlib import Path

import optuna
import pytest

from autotune.search.studies import StorageError, open_study, queue_lock, study_name
from autotune.search.trials import Refine


def _open(url: str) -> int:
    return len(open_study(url, "race", seed=0).trials)


def test_workers_opening_a_new_database_together_all_get_the_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert pool.map(_open, [url] * 4) == [0, 0, 0, 0]


def test_a_study_reopens_with_its_trials(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", seed=0)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert len(open_study(url, "s", seed=0).trials) == 3


@pytest.mark.parametrize("url", ["sqlite:////no/such/dir/x.db", "nosuchdb://x", "not a url"])
def test_unusable_storage_is_one_clear_error(url: str) -> None:
    with pytest.raises(StorageError, match="cannot open study storage"):
        open_study(url, "s", seed=0)


def test_study_names_follow_model_batch_device_and_budget() -> None:
    assert (
        study_name("path/to/my model.py:build", 64, "v100", 123)
        == "my_model.py_build-b64-v100-123B"
    )


def test_sqlite_transactions_take_the_write_lock_when_they_begin(tmp_path: Path) -> None:
    # what keeps two workers from claiming the same enqueued trial: a transaction of one holds
    # the lock from its BEGIN, so another cannot even begin (pysqlite alone would begin lazily)
    import sqlite3

    from autotune.search.studies import _storage

    db = tmp_path / "lock.db"
    engine = _storage(f"sqlite:///{db}").engine
    other = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    locked = pytest.raises(sqlite3.OperationalError, match="locked")
    with engine.connect() as conn, conn.begin(), locked:
        other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")  # free again once the transaction ended
    other.execute("ROLLBACK")
    other.close()


def _proposals(study, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
    return [t.params["x"] for t in study.trials]


def test_the_same_seed_proposes_the_same_plans_with_or_without_a_database(tmp_path: Path) -> None:
    from autotune.search.core import in_memory_study

    memory = _proposals(in_memory_study("tpe", 5), 12)
    stored = _proposals(open_study(f"sqlite:///{tmp_path / 'a.db'}", "s", seed=5), 12)
    again = _proposals(open_study(f"sqlite:///{tmp_path / 'b.db'}", "s", seed=5), 12)
    assert memory == stored == again
    assert memory != _proposals(in_memory_study("tpe", 6), 12)


def test_a_resumed_or_shared_study_does_not_repeat_its_proposals(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = _proposals(open_study(url, "s", seed=0), 4)
    second = _proposals(open_study(url, "s", seed=0), 4)  # another worker, or a resumed run
    assert second[:4] == first and len(set(second)) == 8


class _SlowSpace:
    """A space whose moves take until the other worker has computed its own (or 2 s)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def neighbours(self, params: dict[str, float], _swapped: object) -> list[dict[str, float]]:
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait(timeout=2)
        return [{"x": params["x"] + d} for d in (0.1, 0.2, 0.3, 0.4)]


def _finished(study, x: float) -> None:  # type: ignore[no-untyped-def]
    trial = optuna.trial.create_trial(
        params={"x": x},
        distributions={"x": optuna.distributions.FloatDistribution(0, 10)},
        value=x,
        user_attrs={"constraint": [-1.0], "peak_bytes": 1},
    )
    study.add_trial(trial)


def test_workers_that_refine_at_once_queue_only_the_trials_left(tmp_path: Path) -> None:
    # the two workers of a shared study both finish a trial, both see nothing queued and
    # both compute their moves at once: together they still queue no more than are left
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = open_study(url, "shared", seed=0)
    for x in range(8):
        _finished(first, float(x))
    workers = [open_study(url, "shared", seed=0) for _ in range(2)]
    barrier = threading.Barrier(2)
    refine = Refine(_SlowSpace(barrier), after=4, total=11, lock=queue_lock(url))  # type: ignore[arg-type]
    threads = [threading.Thread(target=refine, args=(w, None)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    waiting = first.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 3  # 11 - 8: one worker queued them, the other saw them queued


def test_only_a_sqlite_file_gets_a_queue_lock(tmp_path: Path) -> None:
    assert queue_lock("sqlite:///:memory:") is contextlib.nullcontext
    assert queue_lock("postgresql://u@h/db") is contextlib.nullcontext
    with queue_lock(f"sqlite:///{tmp_path / 's.db'}")():
        assert (tmp_path / "s.db.queue.lock").exists()


class _LineSpace:
    """Moves one unit along y; on past two trials, twice the step between them."""

    def neighbours(self, params: dict[str, float], _swapped: object) -> list[dict[str, float]]:
        x, y = params["x"], params["y"]
        return [{"x": x, "y": y - 1}, {"x": x, "y": y + 1}]

    def beyond(self, a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b[k] + 2 * (b[k] - a[k]) for k in b}


def _tried(study, x: float, y: float, value: float, queued: bool = True) -> None:  # type: ignore[no-untyped-def]
    dist = optuna.distributions.FloatDistribution(-10, 10)
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": x, "y": y},
            distributions={"x": dist, "y": dist},
            value=value,
            user_attrs={"constraint": [-1.0], "peak_bytes": 1},
            system_attrs={"fixed_params": {"x": x, "y": y}} if queued else {},
        )
    )


def test_refining_goes_on_along_its_best_move_then_failed_moves_then_past_its_ties() -> None:
    study = optuna.create_study()
    _tried(study, 5, 5, 10.0, queued=False)
    _tried(study, 5, 4, 12.0)  # y down did worse
    _tried(study, 6, 5, 9.0)  # x up made the best
    _tried(study, 6, 3, 9.0)  # from it, y down changed nothing
    Refine(_LineSpace(), after=1, total=20)(study, None)  # type: ignore[arg-type]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    queued = [t.system_attrs["fixed_params"] for t in waiting]
    # on along x (the move that made the best), y up, y down (it did worse last time), then
    # on past the tie two moves along y
    assert [(q["x"], q["y"]) for q in queued] == [(8, 5), (6, 6), (6, 4), (6, -1)]
