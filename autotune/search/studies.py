"""Tuning studies that survive: kept in an Optuna database, resumed where they stopped.

By default a study lives in `study.db` (SQLite) in the output folder; any Optuna database URL
(PostgreSQL, MySQL, SQLite elsewhere) works too, so several workers or machines can share one
study. Every finished trial is committed as it ends, so an interrupted run loses at most the
trials that were running, and running the same command again finishes the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from autotune.search.core import quiet_optuna, sampler
from simulator.errors import UserError

__all__ = ["StorageError", "default_storage", "open_study", "queue_lock", "study_name"]


class StorageError(UserError):
    """The study storage cannot be opened or the study in it does not match."""


def default_storage(out: Path) -> str:
    """The SQLite URL of the study file in `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / 'study.db').resolve()}"


def study_name(
    model: str,
    batch: int | str,
    device: str,
    budget_bytes: int,
    host_bytes: int | None = None,
    recompute: str = "search",
) -> str:
    """A name that changes whenever the search space (a fixed `recompute` mode narrows it) or
    the budget (device or host) does."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name)
    host = f"-host{host_bytes}B" if host_bytes is not None else ""
    mode = f"-recompute-{recompute}" if recompute != "search" else ""
    return f"{base}-b{batch}-{device}-{budget_bytes}B{host}{mode}"


#: Workers that open a new database together race to create its tables; the loser of the race
#: sees a constraint error once the winner is done, and opening again then succeeds.
OPEN_ATTEMPTS = 5


def _storage(url: str) -> Any:
    import sqlalchemy.exc

    attempt = 0
    while True:
        try:
            return _rdb(url)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            attempt += 1
            if attempt == OPEN_ATTEMPTS or not _raced(err):
                raise _cannot_open(url, err) from None
            time.sleep(0.5 * attempt)
        except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as err:
            raise _cannot_open(url, err) from None


def _rdb(url: str) -> Any:
    import optuna

    sqlite = url.startswith("sqlite")
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else {}
    )
    if sqlite:
        _immediate_transactions(storage.engine)
    return storage


def _immediate_transactions(engine: Any) -> None:
    """Make every SQLite transaction take the write lock when it begins (BEGIN IMMEDIATE).

    SQLite ignores SELECT ... FOR UPDATE, so two workers can both read an enqueued trial as
    waiting and both claim it; the second then fails to record it ("Cannot tell a COMPLETE
    trial", optuna/optuna#4002). Taking the lock at BEGIN serializes the claim. SQLAlchemy's
    recipe for pysqlite: its own BEGIN is turned off and ours issued instead.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners were set are not reused


def _raced(err: Exception) -> bool:
    """A constraint or lock error from creating the tables another worker is creating."""
    text = str(err).lower()
    return "unique constraint" in text or "already exists" in text or "locked" in text


def _cannot_open(url: str, err: Exception) -> StorageError:
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return StorageError(f"cannot open study storage {url!r}: {first}")


def open_study(url: str, name: str, *, seed: int, objectives: int = 1) -> Any:
    """Create the study `name` in `url`, or load it to resume; TPE seeded with `seed` and each
    trial's number (see `autotune.search.sampler`): the same plans as a study kept in memory,
    and workers that share the storage explore different plans, since the database
    numbers their trials. A stored study with another number of objectives is refused."""
    import optuna

    storage = _storage(url)
    directions: list[Any] = ["minimize"] * objectives
    try:
        with quiet_optuna():
            study = optuna.create_study(
                storage=storage,
                study_name=name,
                directions=directions,
                sampler=sampler("tpe", seed, objectives),
                load_if_exists=True,
            )
    except ValueError as err:
        raise StorageError(f"study {name!r} in {url!r} does not match: {err}") from None
    return study


def queue_lock(url: str) -> Callable[[], AbstractContextManager[Any]]:
    """What workers sharing the study in `url` hold while they check what is queued and queue
    more (`autotune.search.trials.run_study`). Two that did both at once would each queue the
    trials that are left, and the surplus would wait in the finished study.

    For a SQLite file, a lock on a file beside it (its workers share a machine). Other
    databases get none: their workers may rarely leave a queued trial, run when resumed.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return contextlib.nullcontext
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return contextlib.nullcontext
    return functools.partial(_locked, Path(f"{parsed.database}.queue.lock"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
