"""Shared helpers for benchmarks: machine description, statistics, docs/benchmarks.md sections."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Figures written by the scripts in `benchmarks/` (`make bench`). Each section is replaced by
its script on every full run; medians, minima and maxima are over the stated number of runs,
measured side by side in one process, on a shared 2-core machine (expect +-25% noise).
"""


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def summary(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(samples), min(samples), max(samples)


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of docs/benchmarks.md."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)
