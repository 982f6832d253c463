"""Running the project's own programs from tests, as a user would."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

REPO_ROOT: Final = Path(__file__).resolve().parents[1]


def run_module(
    *args: str, what: str, timeout_s: float = 300, cleanup_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ARGS`` from the repository root and wait for it. Past ``timeout_s`` it
    gets SIGTERM (on which our long programs stop their nodes and servers) and the test
    fails, naming ``what`` and showing the output."""
    command = [sys.executable, "-m", *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=cleanup_s)
            pytest.fail(f"{what} took over {timeout_s} s:\n{stdout}{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
