"""Running the console scripts as pip's launcher runs them (``from saleval.cli import
<name>``, called with the command line), in a subprocess, for the tests that drive a
stage from outside (``tests/test_cli.py``, ``tests/test_sweeps.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from saleval import paths

ROOT = paths.project_root()
#: console scripts that are tools, not stages (no row of the stage table)
TOOLS = {"saleval-catch-up": "saleval.pipeline.tracker.catch_up:main"}
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def script_code(stage: str, then: str = "") -> str:
    """``python -c`` code that runs ``saleval-<stage>`` as its console script does, then
    ``then``, and exits with the stage's code."""
    module, attr = SCRIPTS[f"saleval-{stage}"].split(":")
    return f"import sys\nfrom {module} import {attr}\ncode = {attr}()\n{then}\nsys.exit(code)"


def script(
    stage: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    then: str = "",
) -> subprocess.CompletedProcess[str]:
    """``saleval-<stage> args...`` through the function pyproject.toml names; ``then``: code
    the process runs after the stage returns, before it exits (what it had loaded)."""
    return subprocess.run(
        [sys.executable, "-c", script_code(stage, then), *args],
        capture_output=True,
        text=True,
        env=environment(env),
        timeout=timeout,
        cwd=ROOT,
    )


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This interpreter's import path, no HYDRA_FULL_ERROR unless ``extra`` sets it."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path), **(extra or {})}
