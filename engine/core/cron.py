"""Parsing and validation of cron expressions.

Accepted syntax (croniter does the field parsing; this module normalises and checks):

* five fields ``minute hour day-of-month month day-of-week`` with names (``MON``, ``JAN``),
  ranges, lists and steps; when both day fields are restricted a day matches if *either*
  does (the Vixie rule);
* six fields with **seconds first** (Quartz / Spring order);
* the macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``;
* the Jenkins ``H`` token in the second, minute and hour fields (``H``, ``H/15``,
  ``H(0-29)``, ``H(0-29)/10``), replaced by numbers derived from a stable hash of the
  schedule id, so that thousands of ``H * * * *`` schedules spread over the hour instead of
  all firing at minute 0, and each one always fires at the same minute.

Invariants: a :class:`CronSpec` is only ever built from an expression that croniter accepts
and that fires at least once in any ten-year window; its ``expression`` contains no ``H``.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import datetime
from typing import Final, NoReturn

import msgspec
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from engine.core.hashing import stable_hash
from engine.errors import InvalidCronExpression, ScheduleNeverFires, ValidationError

_HashItem = tuple[int, int, int | None] | frozenset[int]
"""A parsed item of an ``H`` field: ``(first, last, step)`` for an H form, else fixed values."""

MAX_EXPRESSION_LENGTH: Final = 256
PARSE_CACHE_ENTRIES: Final = 8192
RESOLVED_CACHE_ENTRIES: Final = 16_384
"""Resolved ``H`` expressions remembered by (expression, residues); least recently used goes.
A million schedules over a few ``H`` templates resolve to a few thousand distinct ones."""
NEVER_FIRES_HORIZON_YEARS: Final = 10
"""Leap days repeat at most every 8 years, so any expression that fires does so within 10."""

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELDS_5: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FIELDS_6: Final = ("second", *_FIELDS_5)
_RANGES: Final = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 31),
    "month": (1, 12),
    "day-of-week": (0, 7),
}
_HASHABLE: Final = frozenset({"second", "minute", "hour"})
_H_ITEM: Final = re.compile(r"^H(?:\((\d+)-(\d+)\))?(?:/(\d+))?$")
_H_TOKEN: Final = re.compile(r"(?<![A-Z])H(?![A-Z])")
"""An ``H`` that is not part of a name such as ``THU``."""
_VALIDATION_START: Final = datetime(2001, 1, 1)  # noqa: DTZ001 - a wall-clock time


class CronSpec(msgspec.Struct, frozen=True):
    """A validated cron expression, ready to iterate.

    ``expression`` is what croniter evaluates (macros expanded, ``H`` resolved);
    ``has_seconds`` says whether it has the leading seconds field; ``fixed_time`` is true
    when neither the minute nor the hour field contains ``*`` (the cronie rule that decides
    the ``auto`` DST policy).
    """

    source: str
    expression: str
    has_seconds: bool
    fixed_time: bool
    uses_hash: bool


def parse_cron(source: str, *, hash_key: str | None = None) -> CronSpec:
    """Validate ``source`` and return its :class:`CronSpec`.

    ``hash_key`` (normally the schedule id) is required when the expression uses ``H``.
    Raises :class:`InvalidCronExpression` or :class:`ScheduleNeverFires` with a message a
    person can act on. Validation costs hundreds of microseconds, so it is cached by
    expression; ``H`` is resolved per schedule first (cheap), and the *resolved* expression is
    what is cached, so a million ``H * * * *`` schedules share sixty parsed expressions.
    """
    if not uses_hash(source):
        return _parse_cached(source)
    try:
        spec = _parse_cached(resolve_hash(source, hash_key))
    except ValidationError as exc:
        raise type(exc)(f"{exc} (resolved from {source!r})") from None
    return msgspec.structs.replace(spec, source=source, uses_hash=True)


def resolve_hash(source: str, hash_key: str | None) -> str:
    """``source`` with each ``H`` replaced by ``hash_key``'s numbers (``source`` itself when it
    has none): the expression :func:`parse_cron` validates. Cheap -- no validation of the
    result -- so a cache of parsed expressions can be looked up with it first. Raises
    :class:`InvalidCronExpression` for an ``H`` it cannot place or a missing ``hash_key``."""
    if not uses_hash(source):
        return source
    _, hashed = _hash_template(source)  # a malformed H is refused before a missing key
    if hash_key is None:
        raise InvalidCronExpression(
            f"{source!r} uses H, which is derived from the schedule id; give the schedule id"
        )
    # Only the seed's residue modulo the field's period reaches _apply_hash, so the resolved
    # text is shared by every schedule with the same residues: build it once per residues.
    if len(hashed) == 1:  # the common case, without building a list
        _, name, _, period = hashed[0]
        return _resolve_residues(source, stable_hash(f"{hash_key}/{name}") % period)
    return _resolve_residues(
        source, *[stable_hash(f"{hash_key}/{name}") % period for _, name, _, period in hashed]
    )


@functools.lru_cache(maxsize=RESOLVED_CACHE_ENTRIES)
def _resolve_residues(source: str, *residues: int) -> str:
    """``source`` (an ``H`` expression) with each ``H`` field replaced by the numbers of its
    residue; one shared string per (source, residues), so the timetable cache hashes it once."""
    fields, hashed = _hash_template(source)
    resolved = list(fields)
    for (index, _, items, _), residue in zip(hashed, residues, strict=True):
        resolved[index] = _apply_hash(items, residue)
    return " ".join(resolved)


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def _hash_template(
    source: str,
) -> tuple[list[str], list[tuple[int, str, tuple[_HashItem, ...], int]]]:
    """The fields of an ``H`` expression and, for each ``H`` field, its parsed items and its
    *period*: the least common multiple of the moduli :func:`_apply_hash` reduces the seed by,
    so that ``_apply_hash(items, seed % period) == _apply_hash(items, seed)``.

    Parsed once per expression; per schedule only the hash and the arithmetic remain.
    """
    names, fields = _fields_of(source)
    hashed = []
    for index, (name, field) in enumerate(zip(names, fields, strict=True)):
        if not _H_TOKEN.search(field.upper()):
            continue
        if name not in _HASHABLE:
            raise InvalidCronExpression(
                f"the {name} field {field!r} uses H, which is supported only in the second, "
                "minute and hour fields"
            )
        items = _hash_items(name, field, source)
        hashed.append((index, name, items, _period(items)))
    return fields, hashed


def _period(items: tuple[_HashItem, ...]) -> int:
    """The least common multiple of the moduli :func:`_apply_hash` applies to the seed."""
    moduli = []
    for item in items:
        if isinstance(item, tuple):
            first, last, step = item
            width = last - first + 1
            moduli.append(width if step is None else min(step, width))
    return math.lcm(*moduli)


def _apply_hash(items: tuple[_HashItem, ...], seed: int) -> str:
    """Turn parsed ``H`` items into the field's numbers for one schedule's ``seed``."""
    if len(items) == 1 and isinstance(items[0], tuple) and items[0][2] is None:
        first, last, _ = items[0]
        return str(first + seed % (last - first + 1))  # the common case: plain ``H``
    values: set[int] = set()
    for item in items:
        if isinstance(item, frozenset):
            values.update(item)
            continue
        first, last, step = item
        width = last - first + 1
        if step is None:
            values.add(first + seed % width)
        else:
            values.update(range(first + seed % min(step, width), last + 1, step))
    return ",".join(str(value) for value in sorted(values))


def _fields_of(source: str) -> tuple[tuple[str, ...], list[str]]:
    """Normalise, expand a macro, and split into named fields (5 or 6)."""
    text = " ".join(source.split())
    if not text:
        raise InvalidCronExpression("the cron expression is empty")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise InvalidCronExpression(
            f"the cron expression is {len(text)} characters long; the limit is "
            f"{MAX_EXPRESSION_LENGTH}"
        )
    if text.startswith("@"):
        text = _expand_macro(text)
    fields = text.split(" ")
    if len(fields) == 5:
        return _FIELDS_5, fields
    if len(fields) == 6:
        return _FIELDS_6, fields
    raise InvalidCronExpression(
        f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with "
        f"seconds first, got {len(fields)} in {source!r}"
    )


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def _parse_cached(source: str) -> CronSpec:
    """Parse an expression without ``H`` (H in a non-time field is refused here)."""
    names, fields = _fields_of(source)
    for name, field in zip(names, fields, strict=True):
        _refuse_hash(name, field)
    by_name = dict(zip(names, fields, strict=True))
    fixed_time = "*" not in by_name["minute"] and "*" not in by_name["hour"]
    expression = " ".join(fields)
    has_seconds = len(fields) == 6
    _check_fields_and_fires(expression, names, fields, has_seconds, source)
    return CronSpec(
        source=source,
        expression=expression,
        has_seconds=has_seconds,
        fixed_time=fixed_time,
        uses_hash=False,
    )


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def uses_hash(source: str) -> bool:
    """Whether ``source`` uses ``H`` (so its instants depend on the schedule id).

    Only the second, minute and hour fields may hold ``H``; names in the day fields (``THU``)
    do not count.
    """
    fields = source.split()
    if not fields or fields[0].startswith("@"):
        return False
    time_fields = fields[:3] if len(fields) == 6 else fields[:2]
    return any(_H_TOKEN.search(field.upper()) for field in time_fields)


def _expand_macro(text: str) -> str:
    macro = text.lower()
    if macro == "@reboot":
        raise InvalidCronExpression(
            "@reboot is not supported: Carillon schedules fire at instants, not at process start"
        )
    try:
        return MACROS[macro]
    except KeyError:
        known = " ".join(sorted(MACROS))
        raise InvalidCronExpression(f"unknown macro {text!r}; known macros: {known}") from None


def _refuse_hash(name: str, field: str) -> None:
    """Refuse ``H`` in an expression parsed without a schedule id's numbers."""
    if not _H_TOKEN.search(field.upper()):
        return
    if name not in _HASHABLE:
        raise InvalidCronExpression(
            f"the {name} field {field!r} uses H, which is supported only in the second, "
            "minute and hour fields"
        )
    raise InvalidCronExpression(f"the {name} field {field!r} uses H; give the schedule id")


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def _hash_items(name: str, field: str, source: str) -> tuple[_HashItem, ...]:
    """Parse an ``H`` field once; only the hash differs between schedules."""
    low, high = _RANGES[name]
    items: list[_HashItem] = []
    for item in field.upper().split(","):
        match = _H_ITEM.match(item)
        if match is None:
            if "H" in item:
                raise InvalidCronExpression(
                    f"the {name} field item {item!r} is not a valid H form; use H, H/n, "
                    "H(a-b) or H(a-b)/n"
                )
            items.append(frozenset(_plain_values(name, item, source)))
            continue
        first = int(match[1]) if match[1] is not None else low
        last = int(match[2]) if match[2] is not None else high
        if not low <= first <= last <= high:
            raise InvalidCronExpression(
                f"the {name} field {field!r} has range {first}-{last}; it must lie within "
                f"{low}-{high} and start before it ends"
            )
        step = None if match[3] is None else int(match[3])
        if step is not None and step < 1:
            raise InvalidCronExpression(f"the {name} field {field!r} has a step of 0")
        items.append((first, last, step))
    return tuple(items)


def _plain_values(name: str, item: str, source: str) -> list[int]:
    """Expand a non-H list item that sits beside H items (``H,30``) into numbers."""
    low, high = _RANGES[name]
    template = ["*"] * 5
    index = {"second": 0, "minute": 0, "hour": 1}[name]
    template[index] = item
    try:
        expanded = croniter.expand(" ".join(template))[0][index]
    except CroniterError as exc:
        raise InvalidCronExpression(f"the {name} field item {item!r} is invalid: {exc}") from None
    if expanded == ["*"]:
        return list(range(low, high + 1))
    return [int(value) for value in expanded]


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def iterator_for(expression: str, has_seconds: bool) -> croniter:
    """The one croniter of a (validated) expression, shared by every timetable using it.

    Sharing is safe because an iterator is only used synchronously -- ``set_current`` then
    ``get_next`` calls with no await in between -- and never from two threads.
    """
    return croniter(
        expression,
        _VALIDATION_START,
        ret_type=datetime,
        max_years_between_matches=NEVER_FIRES_HORIZON_YEARS,
        second_at_beginning=has_seconds,
    )


def _check_fields_and_fires(
    expression: str, names: tuple[str, ...], fields: list[str], has_seconds: bool, source: str
) -> None:
    try:
        iterator = iterator_for(expression, has_seconds)
    except CroniterError:
        _raise_for_bad_field(names, fields, has_seconds, source)
    try:
        iterator.set_current(_VALIDATION_START, force=True)
        iterator.get_next()
    except (CroniterBadDateError, CroniterBadCronError):
        raise ScheduleNeverFires(
            f"{source!r} never fires: no date matches it in {NEVER_FIRES_HORIZON_YEARS} years "
            "(check the day-of-month against the month, e.g. 30 February)"
        ) from None


def _raise_for_bad_field(
    names: tuple[str, ...], fields: list[str], has_seconds: bool, source: str
) -> NoReturn:
    """Find the offending field so the message can name it."""
    for name, field in zip(names, fields, strict=True):
        template = ["*"] * len(names)
        template[names.index(name)] = field
        try:
            croniter.expand(" ".join(template), second_at_beginning=has_seconds)
        except CroniterError:
            low, high = _RANGES[name]
            hint = {"month": " or JAN-DEC", "day-of-week": " (0 and 7 are Sunday) or SUN-SAT"}
            raise InvalidCronExpression(
                f"the {name} field {field!r} in {source!r} is invalid; allowed values are "
                f"{low}-{high}{hint.get(name, '')}, with lists (a,b), ranges (a-b) and steps (*/n)"
            ) from None
    raise InvalidCronExpression(f"the cron expression {source!r} is invalid")
