"""A user's schedule set, read for ``carillon simulate``: JSON or a crontab, into the simulator.

Nothing here decides what is valid: a JSON entry goes through the API's own rules (decoded
into :class:`~engine.api.schemas.ScheduleSpec` as ``POST /v1/schedules`` decodes its body,
then :func:`engine.api.schedule_input.schedule_from_spec`), and a crontab through
:func:`engine.core.crontab.parse_crontab`, with its rejection reasons. What this module adds
is the simulator's own limits, each refused with its reason rather than simulated wrongly:

* a seconds field, and cron syntax the oracle does not model (``L``, ``W``, ``#``, ``?``, a
  range that wraps around): the oracle (:mod:`simulations.oracle`) models five fields;
* the overlap policy ``buffer_one``, which the fire checkers do not model.

Macros and ``H`` are resolved first, by the engine (``H`` is a hash of the schedule id, an
engine definition rather than calendar arithmetic), and the *resolved* expression is what
both the simulated nodes and the oracle see, so they fire at the same instants as the user's
schedule would. Every other field the simulator honours (zone, DST policies, catch-up policy
and window, overlap ``allow``/``skip``); the task type and payload are replaced by the
simulated handler's.

An invalid set is refused whole (as a batch is): :class:`~engine.errors.InvalidField` names
every bad entry and its reason. Disabled schedules (``"enabled": false``) are not simulated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import msgspec

from engine.api import schedule_input
from engine.api.schemas import ScheduleSpec
from engine.cli.import_crontab import read_text
from engine.core.cron import parse_cron
from engine.core.crontab import parse_crontab
from engine.errors import InvalidField
from engine.model import OverlapPolicy, Schedule
from simulations import oracle
from simulations.workload import SimSchedule

INPUT_BYTES_MAX: Final = 8 * 1024 * 1024
"""Largest JSON schedule file read (a crontab has its own limit, ``CRONTAB_BYTES_MAX``)."""
TENANT_DEFAULT: Final = "default"
"""The tenant of an entry without ``tenant_id`` (as for an admin token)."""
CRONTAB_TASK_TYPE: Final = "crontab"
"""Stands in for the task type a crontab line does not name (the handler is replaced)."""
ERRORS_SHOWN: Final = 10
_READ_ONLY: Final = frozenset(Schedule.__struct_fields__) - frozenset(
    ScheduleSpec.__struct_fields__
)
"""Fields the API returns but does not accept (``version``, ``next_run_at`` ...): ignored, so
the output of ``carillon schedule list --output json`` can be simulated as it is."""


@dataclass(frozen=True)
class UserSchedule:
    sim: SimSchedule
    """What runs: the expression resolved (macros expanded, ``H`` replaced)."""
    source_expr: str
    """The expression as written."""
    origin: str
    """Where it came from: ``entry 3`` (JSON, 1-based) or ``line 7`` (crontab)."""


@dataclass(frozen=True)
class UserSet:
    path: str
    format: str
    """``json`` or ``crontab`` (after ``auto`` was decided)."""
    schedules: tuple[UserSchedule, ...]
    disabled: tuple[str, ...]
    """Ids of entries with ``"enabled": false``: valid, not simulated."""


def load(path: str, *, input_format: str, tz: str, now: datetime) -> UserSet:
    """Read and validate the schedule set in ``path`` (``-``: standard input)."""
    name = display_name(path)
    text = read_text(path)
    fmt = input_format if input_format != "auto" else detect_format(path, text)
    if fmt == "json":
        specs, errors = _json_specs(name, text)
    else:
        specs, errors = _crontab_specs(text, tz)
    total = len(specs) + len(errors)
    schedules: list[UserSchedule] = []
    disabled: list[str] = []
    seen: dict[str, str] = {}
    for origin, spec, default_id in specs:
        try:
            sim = _checked(spec, default_id, now)
        except ValueError as exc:  # every ValidationError, as the batch route catches them
            errors.append(f"{origin}: {exc}")
            continue
        if sim.schedule_id in seen:
            errors.append(
                f"{origin}: schedule_id {sim.schedule_id!r} is also {seen[sim.schedule_id]}'s"
            )
            continue
        seen[sim.schedule_id] = origin
        if spec.enabled:
            schedules.append(UserSchedule(sim, spec.cron_expr, origin))
        else:
            disabled.append(sim.schedule_id)
    if errors:
        raise InvalidField(_errors_line(name, sorted(errors, key=_position), total))
    if not schedules:
        what = "only disabled schedules" if disabled else "no schedules"
        raise InvalidField(f"{name} holds {what}: nothing to simulate")
    return UserSet(path, fmt, tuple(schedules), tuple(disabled))


def _position(error: str) -> int:
    """The entry or line number an error message starts with (to list them in file order)."""
    return int(error.split(":", 1)[0].split()[-1])


def detect_format(path: str, text: str) -> str:
    """``json`` for a ``.json`` file or text opening with ``[`` or ``{`` (no crontab line
    can), else ``crontab``."""
    if path.lower().endswith(".json") or text.lstrip()[:1] in ("[", "{"):
        return "json"
    return "crontab"


def _errors_line(name: str, errors: list[str], total: int) -> str:
    """One line naming every bad entry (up to :data:`ERRORS_SHOWN`) and its reason."""
    shown = "; ".join(errors[:ERRORS_SHOWN])
    if len(errors) == 1:
        return f"{name}: {shown} (nothing was simulated)"
    more = f"; and {len(errors) - ERRORS_SHOWN} more" if len(errors) > ERRORS_SHOWN else ""
    return (
        f"{name}: {len(errors)} of {total} entries are invalid (nothing was simulated): "
        f"{shown}{more}"
    )


# --- reading ---------------------------------------------------------------------------------

_Spec = tuple[str, ScheduleSpec, str]
"""``(origin, spec, schedule id if the spec names none)``."""


def _json_specs(name: str, text: str) -> tuple[list[_Spec], list[str]]:
    if len(text) > INPUT_BYTES_MAX:
        raise InvalidField(f"{name} is larger than {INPUT_BYTES_MAX} bytes")
    try:
        text.encode("utf-8")  # read_text keeps bytes that are not UTF-8 as lone surrogates
    except UnicodeEncodeError:
        raise InvalidField(f"{name} is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidField(
            f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise InvalidField(f"{name} nests arrays or objects too deeply") from None
    items = _items(document)
    if items is None:
        raise InvalidField(
            f'{name}: expected a list of schedules, or {{"items": [...]}} as `carillon '
            'schedule list --output json` prints, or {"schedules": [...]} as a batch'
        )
    specs: list[_Spec] = []
    errors: list[str] = []
    for number, item in enumerate(items, start=1):
        origin = f"entry {number}"
        if not isinstance(item, dict):
            errors.append(f"{origin}: expected a JSON object, got {type(item).__name__}")
            continue
        body = {name: value for name, value in item.items() if name not in _READ_ONLY}
        try:
            spec = msgspec.convert(body, ScheduleSpec)
        except msgspec.ValidationError as exc:
            errors.append(f"{origin}: does not fit the schedule body: {exc}")
            continue
        specs.append((origin, spec, f"entry-{number}"))
    return specs, errors


def _items(document: Any) -> list[Any] | None:
    if isinstance(document, list):
        return document
    if isinstance(document, dict) and len(document.keys() & {"items", "schedules"}) == 1:
        items = document.get("items", document.get("schedules"))
        return items if isinstance(items, list) else None
    return None


def _crontab_specs(text: str, tz: str) -> tuple[list[_Spec], list[str]]:
    parsed = parse_crontab(text, default_timezone=tz)
    errors = [f"line {line.line_no}: {line.reason}" for line in parsed.rejected]
    specs: list[_Spec] = [
        (
            f"line {entry.line_no}",
            ScheduleSpec(
                cron_expr=entry.cron_expr,
                task_type=CRONTAB_TASK_TYPE,
                schedule_id=entry.schedule_id,
                timezone=entry.timezone,
                payload=entry.payload,
            ),
            entry.schedule_id,
        )
        for entry in parsed.entries
    ]
    return specs, errors


# --- checking --------------------------------------------------------------------------------


def _checked(spec: ScheduleSpec, default_id: str, now: datetime) -> SimSchedule:
    """The API's rules, then the simulator's limits; raises ``ValidationError``."""
    schedule = schedule_input.schedule_from_spec(
        spec,
        schedule_id=spec.schedule_id or default_id,
        tenant_id=spec.tenant_id or TENANT_DEFAULT,
        now=now,
    )
    cron = parse_cron(schedule.cron_expr, hash_key=schedule.schedule_id)
    if cron.has_seconds:
        raise InvalidField(
            f"{schedule.cron_expr!r} has a seconds field, which the simulator does not model "
            "(its oracle models five-field expressions)"
        )
    try:
        oracle.CronOracle(cron.expression)
    except (ValueError, KeyError):
        raise InvalidField(
            f"{schedule.cron_expr!r} is valid, but uses syntax the simulator's oracle does not "
            "model (L, W, #, ? or a range that wraps around); write it with plain numbers, "
            "ranges, steps and lists to simulate it"
        ) from None
    if schedule.overlap is OverlapPolicy.BUFFER_ONE:
        raise InvalidField(
            "overlap 'buffer_one' is not modelled by the simulator; simulate it as 'allow' "
            "or 'skip'"
        )
    return SimSchedule(
        schedule_id=schedule.schedule_id,
        tenant_id=schedule.tenant_id,
        cron_expr=cron.expression,
        timezone=schedule.timezone,
        dst_gap=str(schedule.dst_gap),
        dst_overlap=str(schedule.dst_overlap),
        catch_up=str(schedule.catch_up),
        catch_up_window_s=schedule.catch_up_window_s,
        overlap=None if schedule.overlap is None else str(schedule.overlap),
    )


def display_name(path: str) -> str:
    """``path`` as messages name it (``-`` is standard input)."""
    return "standard input" if path == "-" else path
