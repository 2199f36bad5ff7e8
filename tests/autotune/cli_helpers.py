"""Run the `autotune` command line in a fresh process, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def cli_json(*args: str) -> dict[str, Any]:
    out = run_cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])
