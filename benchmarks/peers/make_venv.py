"""Create the peers' own environment, ``.bench-peers/venv``, from the pinned requirements.

The peers run in a virtualenv of their own, so nothing of theirs reaches the project's
``.venv`` and nothing of Carillon's reaches them. Idempotent: a stamp in the environment
records the hash of the requirements it was installed from, and a changed file reinstalls
from scratch. Needs PyPI (``pip install``); every failure is a :class:`PeerUnavailable`
whose message says which step failed and why.

Usage: python benchmarks/peers/make_venv.py   (prints the peer interpreter's path)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
VENV: Final = ROOT / ".bench-peers" / "venv"
REQUIREMENTS: Final = Path(__file__).with_name("requirements-apscheduler.txt")
STAMP: Final = VENV / ".installed-stamp"
STEP_TIMEOUT_S: Final = 600.0


class PeerUnavailable(Exception):
    """The peer's environment could not be made; the message says why."""


def pinned_version(package: str) -> str:
    """The exact version ``package`` is pinned to in the requirements file."""
    for line in REQUIREMENTS.read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name.lower() == package.lower():
            return version
    raise PeerUnavailable(f"{package} is not pinned in {REQUIREMENTS.name}")


def _step(what: str, command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PeerUnavailable(f"{what} failed: {error}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        last = next((line for line in reversed(lines) if line.strip()), "no output")
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {last.strip()}")


def ensure_venv() -> Path:
    """The peer environment's interpreter, creating or refreshing the environment first."""
    python = VENV / "bin" / "python"
    try:
        digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
        if python.exists() and STAMP.exists() and STAMP.read_text().strip() == digest:
            return python
        VENV.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PeerUnavailable(f"reading {REQUIREMENTS.name} or {VENV} failed: {error}") from None
    print(f"creating {VENV.relative_to(ROOT)} from {REQUIREMENTS.name} ...", file=sys.stderr)
    _step("creating the virtualenv", [sys.executable, "-m", "venv", "--clear", str(VENV)])
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    _step("pip install", [*pip, "install", "--requirement", str(REQUIREMENTS)])
    _step("pip check", [*pip, "check"])
    STAMP.write_text(digest + "\n")
    return python


def main() -> int:
    try:
        print(ensure_venv())
    except PeerUnavailable as error:
        print(f"peer environment unavailable: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
