import subprocess
import sys
from pathlib import Path

#: a worker that answers each number it is sent with the next one
NEXT = (
    "import pickle, sys\n"
    "from autotune.search.workers import child_streams, messages\n"
    "stream, out = child_streams()\n"
    "for x in messages(stream):\n"
    "    print('noise')\n"  # printed: goes to standard error, not into the answers
    "    pickle.dump(x + 1, out); out.flush()\n"
)

#: a user's script that does not guard its body with `if __name__ == "__main__":`
SCRIPT = f"""
import queue
from autotune.search.workers import Worker
print("body", flush=True)
got = queue.Queue()
worker = Worker.start({NEXT!r}, __import__("pickle").dumps(7), got.put, quiet=True)
worker.send(41)
print("answers", got.get(timeout=60), got.get(timeout=60), flush=True)
worker.close()
print("after close", got.get(timeout=60), flush=True)
"""


def test_a_worker_answers_without_running_the_users_script_again(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    root = Path(__file__).parents[2]
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(root), "PATH": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # the script's body ran once; the worker's answers came in order, then its end (None)
    assert out.stdout.split("\n") == ["body", "answers 8 42", "after close None", ""]


def test_a_terminals_ctrl_c_does_not_reach_a_worker() -> None:
    import os
    import pickle
    import queue

    from autotune.search.workers import Worker

    got: queue.Queue[object] = queue.Queue()
    worker = Worker.start(NEXT, pickle.dumps(1), got.put, quiet=True)
    try:
        assert got.get(timeout=60) == 2
        # its own session, so not in the terminal's foreground process group
        assert os.getsid(worker.process.pid) == worker.process.pid != os.getsid(0)
    finally:
        worker.close()
    assert got.get(timeout=60) is None
