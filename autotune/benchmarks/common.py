"""What the benchmarks share: running the CLI in a fresh process, writing a result's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["cli_json", "write_result"]


def cli_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `autotune ARGS --json` in a fresh process (with `env` added to this one's) and
    return the JSON it printed last."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    out = subprocess.run(
        [sys.executable, "-m", "autotune.cli.main", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"autotune {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def write_result(out: Path, name: str, lines: list[str], report: Any) -> None:
    """Print the Markdown `lines` and write them to `out/NAME.md`, `report` to `out/NAME.json`."""
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
