"""Reading manifest files (YAML, TOML, JSON) with the file and line of every item.

A manifest file is one mapping with up to four keys: ``manifest_set`` (the set's name),
``schedules``, ``task_types`` and ``tenants`` (lists of objects, as the API's single-object
routes take them). ``docs/manifests.md`` shows each format. Every item gets a ``source``
(``path:line``) that the server names in its errors. Lines come from the parsers: YAML
node marks (PyYAML), JSON object offsets (the stdlib's pure-Python scanner), and for TOML
-- whose stdlib parser gives none -- the ``[[schedules]]`` headers when every item of the
list is written as one; otherwise the item's index alone.

A directory is read whole: its ``*.yaml``, ``*.yml``, ``*.toml`` and ``*.json`` files in
name order, not recursively.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from engine.errors import InvalidField

KINDS: Final = ("schedules", "task_types", "tenants")
SUFFIXES: Final = (".yaml", ".yml", ".toml", ".json")
FILE_BYTES_MAX: Final = 8 * 1024 * 1024
"""The API's body limit for a whole set: a larger file could never be applied."""


@dataclass
class ManifestSet:
    """Every file's items merged, each with its ``source``."""

    name: str | None = None
    items: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {kind: [] for kind in KINDS}
    )


def load(paths: list[Path], set_name: str | None = None) -> ManifestSet:
    """The set the files (or directories) hold; ``InvalidField`` naming the file (and line)
    for anything unreadable, and when the files name different sets."""
    merged = ManifestSet(set_name)
    for path in _files(paths):
        document, lines = _parse(path)
        if not isinstance(document, dict):
            raise InvalidField(f"{path}: a manifest is a mapping of {', '.join(KINDS)}")
        unknown = sorted(set(document) - {"manifest_set", *KINDS})
        if unknown:
            raise InvalidField(
                f"{path}: unknown key(s) {', '.join(map(repr, unknown))}; a manifest holds "
                f"manifest_set, {', '.join(KINDS)}"
            )
        named = document.get("manifest_set")
        if named is not None:
            if not isinstance(named, str):
                raise InvalidField(f"{path}: manifest_set must be a string")
            if merged.name is not None and merged.name != named:
                raise InvalidField(
                    f"{path}: manifest_set {named!r} differs from {merged.name!r}; one apply "
                    "takes one set"
                )
            merged.name = named
        for kind in KINDS:
            items = document.get(kind, [])
            if not isinstance(items, list):
                raise InvalidField(f"{path}: {kind} must be a list")
            for index, item in enumerate(items):
                if not isinstance(item, dict):
                    raise InvalidField(f"{_source(path, lines, kind, index)}: not a mapping")
                merged.items[kind].append({**item, "source": _source(path, lines, kind, index)})
    if merged.name is None:
        raise InvalidField("no manifest set named: add manifest_set to a file, or pass --set")
    return merged


def _files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES)
            if not found:
                raise InvalidField(f"{path}: no {', '.join(SUFFIXES)} files in it")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidField(f"{path}: no such file or directory")
    return files


Lines = dict[tuple[str, int], int]
"""(kind, index) -> line number (1-based), where the parser gives one."""


def _source(path: Path, lines: Lines, kind: str, index: int) -> str:
    line = lines.get((kind, index))
    return f"{path}:{line}" if line is not None else f"{path} {kind}[{index}]"


def _parse(path: Path) -> tuple[Any, Lines]:
    try:
        if path.stat().st_size > FILE_BYTES_MAX:
            raise InvalidField(f"{path}: larger than {FILE_BYTES_MAX} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidField(f"{path}: cannot read it: {exc}") from None
    suffix = path.suffix
    if suffix in (".yaml", ".yml"):
        return _yaml(path, text)
    if suffix == ".toml":
        return _toml(path, text)
    if suffix == ".json":
        return _json(path, text)
    raise InvalidField(f"{path}: not a manifest (use {', '.join(SUFFIXES)})")


def _yaml(path: Path, text: str) -> tuple[Any, Lines]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        document = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InvalidField(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    lines: Lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(value, yaml.SequenceNode) and key.value in KINDS:
                for index, item in enumerate(value.value):
                    lines[(key.value, index)] = item.start_mark.line + 1
    return document, lines


class _Located(dict[str, Any]):
    """A JSON object that knows the line it starts on."""

    line: int = 0


def _json(path: Path, text: str) -> tuple[Any, Lines]:
    # The stdlib documents no hook with positions; its pure-Python scanner calls the
    # decoder's parse_object with the text and the offset of each object, which is one.
    decoder: Any = json.JSONDecoder()
    plain: Any = getattr(json.decoder, "JSONObject")  # noqa: B009 - untyped in typeshed

    def parse_object(state: tuple[str, int], *args: Any) -> tuple[Any, int]:
        source, end = state
        value, after = plain(state, *args)
        located = _Located(value)
        located.line = source.count("\n", 0, end) + 1
        return located, after

    decoder.parse_object = parse_object
    decoder.scan_once = getattr(json.scanner, "py_make_scanner")(decoder)  # noqa: B009
    try:
        document = decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidField(f"{path}: not valid JSON: {exc}") from None
    lines: Lines = {}
    if isinstance(document, dict):
        for kind in KINDS:
            items = document.get(kind)
            if isinstance(items, list):
                for index, item in enumerate(items):
                    if isinstance(item, _Located):
                        lines[(kind, index)] = item.line
    return document, lines


def _toml(path: Path, text: str) -> tuple[Any, Lines]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidField(f"{path}: not valid TOML: {exc}") from None
    lines: Lines = {}
    for kind in KINDS:
        items = document.get(kind)
        header = re.compile(rf"^[ \t]*\[\[[ \t]*{kind}[ \t]*\]\]", re.MULTILINE)
        starts = [text.count("\n", 0, match.start()) + 1 for match in header.finditer(text)]
        if isinstance(items, list) and len(starts) == len(items):
            lines.update({(kind, index): line for index, line in enumerate(starts)})
    return document, lines
