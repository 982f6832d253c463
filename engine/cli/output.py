"""How commands print: aligned tables, ``name: value`` blocks, notes on stderr.

Tables go to stdout, one row a line, columns separated by two spaces and padded to the
widest cell; a cell never holds a line break (:func:`one_line`), so ``awk`` and ``cut`` keep
working. Notes that are not the answer (more pages, skipped ids) go to stderr as
``carillon: ...`` lines, so a script reading stdout never sees them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

NONE: Final = "-"
"""How an absent value is shown in a table."""


def one_line(text: str, width: int | None = None) -> str:
    """``text`` with every run of blanks (line breaks too) as one space, cut to ``width``
    characters with an ellipsis."""
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def cell(value: Any) -> str:
    """A JSON value as a table cell: ``-`` for null, ``%g`` for floats."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return one_line(str(value))


def print_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print ``rows`` under ``header``, each column as wide as its widest cell."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def print_fields(fields: Mapping[str, Any]) -> None:
    """Print ``name: value`` lines, values as :func:`cell` shows them (dicts and lists as
    compact JSON)."""
    for name, value in fields.items():
        text = json.dumps(value) if isinstance(value, dict | list) else cell(value)
        print(f"{name}: {text}")


def note(message: str) -> None:
    """A remark beside the answer, on stderr."""
    print(f"carillon: {message}", file=sys.stderr)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 schedule``, ``2 schedules``."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
