"""References that cannot drift: every repository path, doc section and status the code and
docs name must exist and agree (issue #28, item 4).

``docs/`` is the single source of design truth, in this repository. These checks read the
tree as text (no database, no imports) and fail with the file, the line and the missing
target:

- a repository path (``engine/...``, ``docs/...``, ``tests/...``, ``migrations/0001_...``)
  or a relative markdown link that names nothing;
- a doc section that is not there: a link ``docs/x.md#anchor`` (GitHub's heading slugs) or
  the prose form ``docs/x.md``, "Heading";
- a citation of a design file that is not part of this repository;
- a row of README.md's status table whose state differs from the status line of a doc it
  names (the convention: a line ``Status: **works**`` -- or ``partly``, ``in progress``,
  ``planned`` -- right under each such doc's title).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED_DIRS = ("engine", "simulations", "benchmarks", "tests", "docs")
SCANNED_FILES = ("README.md", "Makefile", "pyproject.toml")

ALLOWED = {
    # setuptools' package-data globs are relative to their package (engine/ledger/postgres/).
    ("pyproject.toml", "migrations/*.sql"),
}
"""(file, path) pairs that name no repository path from the root or the file's folder."""

NOT_SCANNED = {
    # A log of past changes names files as they were then (deleted benchmarks, old
    # migration names); it is history, not a description of the tree.
    "docs/changelog.md",
    # This module quotes broken references on purpose, as the fixtures of its own checks.
    "tests/test_references.py",
    # A profile recorded by `make bench-profile`: its frames name the files (and lines) of
    # the tree it was recorded on. A measurement of a past run, not a description of the tree.
    "docs/img/bench-burst-flame.svg",
}

ROOTS = ("engine", "simulations", "benchmarks", "tests", "docs", ".ci", "scripts", "migrations")
"""First components that make a word a repository path. The top-level folders, plus two that
are not (or no longer) there but are natural to write: ``scripts/`` and ``migrations/`` (the
latter is used, relative to ``engine/ledger/postgres/``, by the Postgres ledger's comments)."""

PATH = re.compile(
    r"(?<![\w./:@~$-])(?P<path>(?:" + "|".join(re.escape(r) for r in ROOTS) + r")/[\w.*/-]*)"
)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
SECTION = re.compile(
    r"(?P<doc>[\w./-]*\.md)(?:#[\w-]*)?`{0,2}\)?,?[\s#]*\(?(?:section\s+)?[\"“](?P<title>[\w`][^\"”\n]{0,99})[\"”]"
)
FOREIGN_DESIGN_FILES = re.compile(r"\b(?:ARCHITECTURE|STYLE)(?:\.md|\s+§)")
"""Design files of another repository, which readers of this one cannot open."""

STATES = ("works", "partly", "in progress", "planned")
STATUS_LINE = re.compile(r"^Status: \*\*(?P<state>[a-z ]+)\*\*")
STATUS_LINE_MAX = 8
"""A doc's status line is among the first lines, under its title."""


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


def scanned_files() -> Iterator[Path]:
    for name in SCANNED_FILES:
        yield ROOT / name
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError):
        return None


def texts() -> Iterator[tuple[str, str]]:
    for path in scanned_files():
        name = relative(path)
        text = text_of(path)
        if name not in NOT_SCANNED and text is not None:
            yield name, text


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def resolve(cited: str, citing: str) -> Path | None:
    """The file or folder a cited path names: from the repository's root, or from the citing
    file's folder or one above it (``migrations/0004_api.sql`` in the Postgres ledger)."""
    cited = cited.rstrip(".,")
    # `NNNN_name.sql` is a pattern, not a name: any file of the folder with that suffix.
    pattern = re.sub(r"[^/]*N{4}[^/]*?(\.\w+)?$", r"*\1", cited).rstrip("/")
    folder = (ROOT / citing).parent
    bases = [ROOT, *[p for p in [folder, *folder.parents] if p.is_relative_to(ROOT)]]
    for base in bases:
        if any(ch in pattern for ch in "*?["):
            found = sorted(base.glob(pattern))
            if found:
                return found[0]
        elif (base / pattern).exists():
            return base / pattern
    return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(text: str) -> list[str]:
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(match.group(1))
    return found


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    result: set[str] = set()
    for heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def plain(title: str) -> str:
    return " ".join(title.replace("`", "").replace("*", "").split()).casefold()


def has_heading(text: str, title: str) -> bool:
    """A quoted title names a heading exactly, or its lead (the part before a colon, a comma
    or a parenthesis: "For users" is "For users: `carillon simulate`")."""
    wanted = plain(title)
    for heading in map(plain, headings(text)):
        if heading == wanted or re.match(re.escape(wanted) + r"\s*[:,(]", heading):
            return True
    return False


def path_problems(name: str, text: str) -> Iterator[Problem]:
    for match in PATH.finditer(text):
        cited = match.group("path")
        if (name, cited) not in ALLOWED and resolve(cited, name) is None:
            yield Problem(
                name, line_of(text, match.start()), f"names `{cited}`, which does not exist"
            )


def link_problems(name: str, text: str) -> Iterator[Problem]:
    if not name.endswith(".md"):
        return
    for match in LINK.finditer(text):
        target = match.group("target").strip("<>")
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        line = line_of(text, match.start())
        doc = (ROOT / name).parent / file_part if file_part else ROOT / name
        if not doc.exists():
            yield Problem(name, line, f"links to `{target}`, which does not exist")
        elif anchor and doc.suffix == ".md" and anchor not in anchors(doc.read_text()):
            yield Problem(name, line, f"links to `{target}`: no heading has the anchor #{anchor}")


def section_problems(name: str, text: str) -> Iterator[Problem]:
    for match in SECTION.finditer(text):
        cited, title = match.group("doc"), match.group("title")
        doc = resolve(cited, name) if "/" in cited else (ROOT / name).parent / cited
        if doc is None or not doc.is_file():
            continue  # the missing file is reported by path_problems / link_problems
        if not has_heading(doc.read_text(), title):
            yield Problem(
                name, line_of(text, match.start()), f'cites `{cited}`, "{title}": no such heading'
            )


def foreign_problems(name: str, text: str) -> Iterator[Problem]:
    for match in FOREIGN_DESIGN_FILES.finditer(text):
        yield Problem(
            name,
            line_of(text, match.start()),
            f"cites {match.group()!r}, which is not in this repository (docs/ holds the design)",
        )


def status_of(text: str) -> tuple[str | None, int]:
    for number, line in enumerate(text.splitlines()[:STATUS_LINE_MAX], start=1):
        if match := STATUS_LINE.match(line):
            return match.group("state"), number
    return None, 0


def readme_state(cell: str) -> str | None:
    cell = cell.strip().lstrip("*")
    return next((state for state in STATES if cell.startswith(state)), None)


def status_problems(readme: str, docs: dict[str, str]) -> Iterator[Problem]:
    """Each row of README.md's status table names its docs in the capability cell; each of
    those docs carries the row's state in its status line."""
    rows = 0
    for number, line in enumerate(readme.splitlines(), start=1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or cells[0] in ("capability", "---"):
            continue
        rows += 1
        capability, cell = cells
        state = readme_state(cell)
        if state is None:
            yield Problem("README.md", number, f"state {cell[:30]!r} is none of {STATES}")
            continue
        named: list[str] = re.findall(r"`(docs/[\w./-]+\.md)`", capability)
        if not named:
            yield Problem("README.md", number, "the row names no doc (`docs/....md`) to check")
        for doc in named:
            if doc not in docs:
                continue  # reported by path_problems
            doc_state, _ = status_of(docs[doc])
            if doc_state is None:
                yield Problem(
                    doc, 1, f"no `Status: **{state}**` line under the title (README.md:{number})"
                )
            elif doc_state != state:
                yield Problem(
                    doc, 1, f"status {doc_state!r}, but README.md:{number} says {state!r}"
                )
    if rows == 0:
        yield Problem("README.md", 1, "no status table (| capability | state |) found")


def report(problems: list[Problem]) -> str:
    return "\n".join(map(str, problems))


# --- the tree ---------------------------------------------------------------------------------


def test_every_path_named_exists() -> None:
    problems = [p for name, text in texts() for p in path_problems(name, text)]
    assert not problems, report(problems)


def test_every_markdown_link_and_anchor_exists() -> None:
    problems = [p for name, text in texts() for p in link_problems(name, text)]
    assert not problems, report(problems)


def test_every_cited_section_exists() -> None:
    problems = [p for name, text in texts() for p in section_problems(name, text)]
    assert not problems, report(problems)


def test_no_design_file_from_outside_this_repository_is_cited() -> None:
    problems = [p for name, text in texts() for p in foreign_problems(name, text)]
    assert not problems, report(problems)


def test_readme_status_table_matches_the_docs_status_lines() -> None:
    docs = {relative(p): p.read_text() for p in (ROOT / "docs").rglob("*.md")}
    problems = list(status_problems((ROOT / "README.md").read_text(), docs))
    assert not problems, report(problems)


# --- the checks catch what they are for (the examples) --------------------------------


def test_a_missing_path_is_reported_with_file_and_line() -> None:
    text = "run it\n# (scripts/ensure-chromium) and `engine/actors/no_such.py`\n"
    problems = [str(p) for p in path_problems("pyproject.toml", text)]
    assert problems == [
        "pyproject.toml:2: names `scripts/ensure-chromium`, which does not exist",
        "pyproject.toml:2: names `engine/actors/no_such.py`, which does not exist",
    ]


def test_paths_resolve_from_the_root_or_the_citing_folder() -> None:
    text = "`engine/actors/workers.py` (migrations/0001_initial.sql), docs/img/bench-*.png.\n"
    assert list(path_problems("engine/ledger/postgres/sql.py", text)) == []
    assert [p.message for p in path_problems("docs/ledger.md", text)] == [
        "names `migrations/0001_initial.sql`, which does not exist"
    ]
    assert list(path_problems("x.py", "https://example.com/docs/nothing.md /v1/tests/x")) == []


def test_a_missing_section_is_reported() -> None:
    text = 'see `docs/ledger.md`, "Dead rows after a burst", and\n(`docs/api.md`, "Limits").\n'
    assert [str(p) for p in section_problems("docs/x.md", text)] == [
        'docs/x.md:1: cites `docs/ledger.md`, "Dead rows after a burst": no such heading'
    ]
    python = '# why (docs/ledger.md,\n# "Dead row versions after a burst")\n'
    assert list(section_problems("engine/x.py", python)) == []


def test_a_heading_lead_names_the_heading() -> None:
    text = "# T\n\n## For users: `carillon simulate`\n"
    assert has_heading(text, "For users")
    assert not has_heading(text, "For")


def test_a_broken_anchor_is_reported() -> None:
    good = "[figures](benchmarks.md#ledger-throughput-benchmarksbench_ledgerpy)"
    bad = "[speed](ledger.md#how-fast)"
    problems = [str(p) for p in link_problems("docs/x.md", f"{good}\n{bad}\n")]
    assert problems == [
        "docs/x.md:2: links to `ledger.md#how-fast`: no heading has the anchor #how-fast"
    ]


def test_a_citation_of_a_foreign_design_file_is_reported() -> None:
    text = '"""Why (ARCHITECTURE' + '.md §4)."""\n# see STYLE' + ".md\n# (ARCHITECTURE" + " §9)\n"
    assert [p.line for p in foreign_problems("engine/x.py", text)] == [1, 2, 3]


def test_a_readme_row_that_disagrees_with_its_doc_is_reported() -> None:
    readme = (
        "| capability | state |\n|---|---|\n"
        "| Simulation (`docs/simulation.md`) | in progress |\n"
        "| Leases (`docs/leases.md`) | **works** |\n"
        "| Regions | **works** |\n"
    )
    docs = {
        "docs/simulation.md": "# Simulation\n\nStatus: **works** (`simulations/`)\n",
        "docs/leases.md": "# Leases\n\nStatus: implemented\n",
    }
    assert [str(p) for p in status_problems(readme, docs)] == [
        "docs/simulation.md:1: status 'works', but README.md:3 says 'in progress'",
        "docs/leases.md:1: no `Status: **works**` line under the title (README.md:4)",
        "README.md:5: the row names no doc (`docs/....md`) to check",
    ]
