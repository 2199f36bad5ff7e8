"""Worker processes for the search: fresh interpreters fed over pipes.

A worker runs `python -c <command>` (a function of this package), reads pickled objects from
its standard input and writes pickled objects to its standard output. It is not a
`multiprocessing` child: those are started by importing the parent's `__main__` again, which
in a user's script that does not guard its body runs the whole script a second time (and a
`fit` in it then hung while starting its own worker). This process feeds a worker from a
writer thread (a large first object does not block it while the worker starts) and hands what
it writes back, one object at a time, to a callback from a reader thread; None once it has
ended.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["Worker", "child_streams", "messages"]


class Worker:
    """One worker process, the thread that writes to it and the one that reads from it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self._out: queue.Queue[bytes | None] = queue.Queue()

    @classmethod
    def start(
        cls, command: str, first: bytes, on_message: Callable[[Any], None], *, quiet: bool
    ) -> Worker:
        """Run `python -c command`, send it `first` (pickled), and call `on_message` with each
        object it writes, then with None once it has ended. `quiet`: its standard error is
        dropped (else it goes where this process's does). OSError if no interpreter starts."""
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
        process = subprocess.Popen(
            [sys.executable, "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,  # a Ctrl-C at the terminal is this process's to handle
        )
        worker = cls(process)
        worker.send_bytes(first)
        threading.Thread(target=worker._write, daemon=True).start()
        threading.Thread(target=worker._read, args=(on_message,), daemon=True).start()
        return worker

    def send(self, obj: Any) -> None:
        self.send_bytes(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, data: bytes) -> None:
        self._out.put(data)

    def close(self) -> None:
        """End it now: what it is doing is not needed any more."""
        self._out.put(None)
        self.process.terminate()
        self.process.wait()

    def _write(self) -> None:
        """Send what is put on the queue, in order; None closes the pipe."""
        stdin = self.process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):  # it ended: its reader reports that
            while (data := self._out.get()) is not None:
                stdin.write(data)
                stdin.flush()
        with contextlib.suppress(OSError):
            stdin.close()

    def _read(self, on_message: Callable[[Any], None]) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            for message in messages(stdout):
                on_message(message)
        finally:
            on_message(None)


def messages(stream: IO[bytes]) -> Iterator[Any]:
    """The pickled objects on `stream`, until it ends (or breaks off)."""
    while True:
        try:
            yield pickle.load(stream)
        except Exception:  # noqa: BLE001 (ended, broke off, or sent what cannot be read)
            return


def child_streams() -> tuple[IO[bytes], IO[bytes]]:
    """In a worker: the stream it reads and the one it writes its answers to. Anything printed
    goes to standard error instead, and a Ctrl-C is left to the process that started it (it
    runs in a session of its own, so the terminal's does not reach it; this is for a signal
    sent to it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return sys.stdin.buffer, out
