"""Reading a user crontab (the ``crontab -l`` format) into schedules to import.

:func:`parse_crontab` is the pure core of ``carillon import-crontab``: text in, a
:class:`CrontabImport` out. Every line ends up either as a :class:`CrontabEntry` or as a
:class:`RejectedLine` whose reason a person can act on; nothing is dropped silently except
blank lines and comments. It follows Vixie cron / cronie, with the differences marked
*(differs)*:

* **Lines.** Lines end at ``\\n``; a ``\\r`` before it (Windows) is dropped, and a last line
  without a newline is read like the others (*differs*: cron ignores it). Trailing blanks
  are dropped unless a backslash escapes the last one, so an editor trimming them does not
  change a schedule id.
* **Comments.** A line whose first non-blank character is ``#`` is a comment. A ``#`` later
  in an entry is part of the command; in an assignment it is part of the value.
* **Assignments.** ``NAME=value`` or ``NAME = value`` sets a variable for the lines *below*
  it. One pair of single or double quotes around the value is removed; nothing is expanded
  (``PATH=$PATH:/opt/bin`` is taken literally, as cron does). *(differs)* Names must be
  letters, digits and ``_`` not starting with a digit, and at most
  :data:`ENV_VARIABLES_MAX` names may be set; other lines are rejected.
* **Time zone.** ``CRON_TZ=Zone`` and ``TZ=Zone`` set the zone of the entries below them;
  ``CRON_TZ`` wins when both are set, and an empty value unsets the variable (the
  ``default_timezone`` applies again). cronie uses only ``CRON_TZ`` for the schedule (``TZ``
  reaches the command's environment); *(differs)* users who set ``TZ`` mean their jobs to
  run in that zone, so both count as the schedule zone and neither goes into ``env``. A
  rejected zone line (unknown zone, bad quoting, too long) is reported, and so is every
  entry that would have used that zone, until a valid line for the same variable: firing at
  the wrong hour is worse than not importing.
* **Environment.** Every other assignment (``SHELL``, ``PATH``, ``MAILTO``, ``HOME``, your
  own) goes into each following entry's ``env``. Cron's defaults (``SHELL=/bin/sh``, ``HOME``,
  ``LOGNAME``) are not added: running the command is the handler's business.
* **Entries.** Five time fields then the command, or a macro (``@yearly @annually @monthly
  @weekly @daily @midnight @hourly``; *(differs)* in any case) then the command, split at
  blanks. cronie's leading ``-`` (do not log the run) is accepted and dropped. Only the
  *user* format is supported: a line from a system crontab (``m h dom mon dow user
  command``) cannot be told apart from a command starting with a word, so the user name
  would become part of the command. There is no seconds field: in ``0 0 * * * * cmd`` the
  sixth ``*`` starts the command, as in cron. ``@reboot`` is rejected (a cluster scheduler
  has no boot), and so is an expression :meth:`Timetable.compile` refuses, including one
  that never fires (``0 0 30 2 *``), which cron would accept and never run. Our ``H``
  token also works (derived from the schedule id), though cron has none.
* **The ``%`` sign.** The command ends at the first ``%`` not written ``\\%``; the rest is
  the command's standard input, each later ``%`` becoming a newline and a newline ending it,
  exactly as cron writes it (``payload["stdin"]``). In the command ``\\%`` becomes ``%``.
  An entry whose command is empty is rejected.
* **Ids.** ``schedule_id`` is ``id_prefix`` plus the first :data:`SCHEDULE_ID_HASH_CHARS`
  hex digits of the SHA-256 of the zone, expression, command and stdin, so importing a file
  again upserts the same schedules, and an edit of the environment updates one in place. A
  second line with the same id is rejected as a duplicate (cron would run both).
  The environment and the line number are left out of the id and the payload on purpose.

Bounds: input over :data:`CRONTAB_BYTES_MAX` bytes or with more than :data:`ENTRIES_MAX`
entry lines (accepted or rejected) is refused as a whole with :class:`InvalidField`, as are
an ``id_prefix`` that cannot start a schedule id and an unknown ``default_timezone``; a
line over :data:`LINE_CHARS_MAX` characters, one holding a NUL or text that is not valid
Unicode, and an entry whose payload exceeds :data:`engine.model.PAYLOAD_BYTES_MAX` are
rejected alone.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

import msgspec

from engine.core.timetable import Timetable
from engine.core.zones import load_zone
from engine.errors import InvalidField, UnknownTimeZone, ValidationError
from engine.model import PAYLOAD_BYTES_MAX, check_payload_size, validate_identifier

CRONTAB_BYTES_MAX: Final = 1024 * 1024
"""Largest crontab accepted, in UTF-8 bytes."""
ENTRIES_MAX: Final = 10_000
"""Most entry lines (neither blank, comment nor assignment) in one crontab."""
LINE_CHARS_MAX: Final = 4096
ENV_VARIABLES_MAX: Final = 100
"""Most distinct variable names a crontab may set (time-zone variables aside)."""
SCHEDULE_ID_HASH_CHARS: Final = 12
ZONE_VARIABLES: Final = ("CRON_TZ", "TZ")
"""The variables that set the schedule zone, strongest first."""

_ASSIGNMENT: Final = re.compile(r"(?P<name>[^\s=]+)\s*=\s*(?P<value>.*)", re.DOTALL)
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_FIVE_FIELDS: Final = re.compile(r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)(?:\s+(.*))?", re.DOTALL)
_REBOOT_REASON: Final = (
    "@reboot runs a job when the machine boots, and a cluster scheduler has no boot; "
    "start boot-time work from a systemd unit (or your init system), or run it once by hand"
)


class RejectedLine(msgspec.Struct, frozen=True, kw_only=True):
    """A line that was not imported: where it is, what it says, and why."""

    line_no: int
    """1-based."""
    text: str
    """The line as written, without its line ending."""
    reason: str


class CrontabEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One crontab line, ready to become a schedule."""

    line_no: int
    """1-based."""
    schedule_id: str
    """Stable across imports of the same line (see the module docstring)."""
    cron_expr: str
    """Five fields joined by single spaces, or a lower-case macro; compiles in ``timezone``."""
    timezone: str
    command: str
    """The shell command: the text before the first unescaped ``%``, with ``\\%`` as ``%``."""
    env: dict[str, str]
    """The assignments in force at this line, without ``CRON_TZ`` and ``TZ``."""
    payload: dict[str, Any]
    """``{"command": ..., "env": {...}}`` plus ``"stdin"`` when the line feeds standard input."""


class CrontabImport(msgspec.Struct, frozen=True, kw_only=True):
    """What a crontab holds: entries to import and lines refused, each in file order."""

    entries: list[CrontabEntry]
    rejected: list[RejectedLine]


class _LineRejected(Exception):
    """Raised inside the parser to reject the line being read with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_crontab(
    text: str, *, default_timezone: str = "UTC", id_prefix: str = "crontab-"
) -> CrontabImport:
    """Read a user crontab; see the module docstring for the rules.

    Raises :class:`~engine.errors.InvalidField` for input over the bounds or an
    ``id_prefix`` that cannot start a schedule id, and
    :class:`~engine.errors.UnknownTimeZone` for an unknown ``default_timezone``: those are
    the caller's errors. Anything wrong with a single line is a :class:`RejectedLine`.
    """
    if len(text) > CRONTAB_BYTES_MAX or len(_utf8(text)) > CRONTAB_BYTES_MAX:
        raise InvalidField(
            f"the crontab is larger than {CRONTAB_BYTES_MAX} bytes; a user crontab is far "
            "smaller, so check that this is the right file"
        )
    try:
        # The hash part is hex, so checking the prefix with any hex suffix checks every id.
        validate_identifier(f"{id_prefix}{'0' * SCHEDULE_ID_HASH_CHARS}", kind="schedule id")
    except InvalidField as exc:
        raise InvalidField(f"id prefix {id_prefix!r} cannot start a schedule id: {exc}") from None
    load_zone(default_timezone)
    reader = _Reader(default_timezone, id_prefix)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for line_no, line in enumerate(lines, start=1):
        reader.read(line_no, line.removesuffix("\r"))
    return CrontabImport(entries=reader.entries, rejected=reader.rejected)


class _Reader:
    """The state cron keeps while reading a crontab top to bottom."""

    def __init__(self, default_timezone: str, id_prefix: str) -> None:
        self.entries: list[CrontabEntry] = []
        self.rejected: list[RejectedLine] = []
        self._default_timezone = default_timezone
        self._id_prefix = id_prefix
        self._env: dict[str, str] = {}
        self._env_json_bytes: dict[str, int] = {}
        # Zone variables set so far: the zone, or the line number of an invalid setting.
        self._zones: dict[str, str | int] = {}
        self._line_of_id: dict[str, int] = {}
        self._entry_lines = 0

    def read(self, line_no: int, line: str) -> None:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            return
        assignment = _ASSIGNMENT.fullmatch(stripped)
        name = None if assignment is None else _unquote(assignment["name"])
        if name is None:
            self._entry_lines += 1
            if self._entry_lines > ENTRIES_MAX:
                raise InvalidField(
                    f"the crontab has more than {ENTRIES_MAX} entries (line {line_no}); "
                    "split it into several imports"
                )
        try:
            _check_line(line)
            if assignment is None or name is None:
                body = _trim_trailing_blanks(line.lstrip())
                self.entries.append(self._entry(line_no, body))
            else:
                self._assign(name, assignment["value"])
        except _LineRejected as exc:
            if name in ZONE_VARIABLES:
                self._zones[name] = line_no  # entries below must not silently use another zone
            self.rejected.append(RejectedLine(line_no=line_no, text=line, reason=exc.reason))

    def _assign(self, name: str, raw_value: str) -> None:
        value = _unquote(raw_value)
        if value is None:
            raise _LineRejected(
                f"the value of {name} opens a quote that does not close at the end of the "
                "line; quote the whole value or none of it"
            )
        if name in ZONE_VARIABLES:
            self._set_zone(name, value)
            return
        if not _ENV_NAME.fullmatch(name):
            raise _LineRejected(
                f"{name!r} is not a usable environment variable name; use letters, digits "
                "and _, not starting with a digit"
            )
        if name not in self._env and len(self._env) >= ENV_VARIABLES_MAX:
            raise _LineRejected(
                f"the crontab sets more than {ENV_VARIABLES_MAX} environment variables; "
                "move them into a script the command sources"
            )
        self._env[name] = value
        self._env_json_bytes[name] = len(msgspec.json.encode({name: value})) - 1

    def _set_zone(self, name: str, value: str) -> None:
        if not value:
            self._zones.pop(name, None)
            return
        try:
            load_zone(value)
        except UnknownTimeZone as exc:
            raise _LineRejected(
                f"{name}: {exc}; entries that would use this zone are rejected until a valid "
                f"{name} line"
            ) from None
        self._zones[name] = value

    def _timezone(self) -> str:
        for name in ZONE_VARIABLES:
            zone = self._zones.get(name)
            if isinstance(zone, int):
                raise _LineRejected(
                    f"follows an invalid {name} on line {zone}; fix that line so this entry "
                    "runs in the zone you meant"
                )
            if zone is not None:
                return zone
        return self._default_timezone

    def _entry(self, line_no: int, body: str) -> CrontabEntry:
        cron_expr, command_text = _split_schedule(body)
        timezone = self._timezone()
        command, stdin = _split_percent(command_text)
        if not command.strip():
            raise _LineRejected(
                "the command before the first % is empty (cron sends the text after % to "
                "the command's standard input; write \\% for a literal percent sign)"
            )
        digest = hashlib.sha256(_utf8(f"{timezone}\n{cron_expr}\n{command}\n{stdin}"))
        schedule_id = self._id_prefix + digest.hexdigest()[:SCHEDULE_ID_HASH_CHARS]
        first = self._line_of_id.get(schedule_id)
        if first is not None:
            raise _LineRejected(
                f"duplicate of line {first}: same time zone, schedule, command and input, "
                "so the same schedule; delete one, or make them differ if both runs are meant"
            )
        try:
            Timetable.compile(cron_expr, timezone, schedule_id=schedule_id)
        except ValidationError as exc:
            raise _LineRejected(str(exc)) from None
        env = dict(self._env)
        payload: dict[str, Any] = {"command": command, "env": env}
        if stdin:
            payload["stdin"] = stdin
        self._check_payload(payload)
        self._line_of_id[schedule_id] = line_no
        return CrontabEntry(
            line_no=line_no,
            schedule_id=schedule_id,
            cron_expr=cron_expr,
            timezone=timezone,
            command=command,
            env=env,
            payload=payload,
        )

    def _check_payload(self, payload: dict[str, Any]) -> None:
        env_bytes = sum(self._env_json_bytes.values())
        if env_bytes > PAYLOAD_BYTES_MAX:  # certainly too large: skip encoding it per entry
            raise _LineRejected(
                f"the environment set above this line is {env_bytes} bytes of JSON; a "
                f"schedule's payload is limited to {PAYLOAD_BYTES_MAX} bytes"
            )
        try:
            check_payload_size(payload)
        except InvalidField as exc:
            raise _LineRejected(f"the command, its input and environment: {exc}") from None


def _check_line(line: str) -> None:
    if len(line) > LINE_CHARS_MAX:
        raise _LineRejected(
            f"the line is {len(line)} characters long; the limit is {LINE_CHARS_MAX} "
            "(put a long command in a script and run the script)"
        )
    if "\x00" in line:
        raise _LineRejected("the line contains a NUL character, which no command can hold")
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        raise _LineRejected("the line is not valid Unicode text (lone surrogate)") from None


def _split_schedule(body: str) -> tuple[str, str]:
    """``(cron_expr, command text)`` of an entry line."""
    if body.startswith("-"):  # cronie: do not log this job; logging is not ours to skip
        body = body[1:]
    if body.startswith("@"):
        macro, *rest = body.split(maxsplit=1)
        if macro.lower() == "@reboot":
            raise _LineRejected(_REBOOT_REASON)
        cron_expr, command = macro.lower(), "".join(rest)
    else:
        match = _FIVE_FIELDS.fullmatch(body)
        if match is None:
            raise _LineRejected(
                f"expected 5 time fields (minute hour day-of-month month day-of-week) and a "
                f"command, found {len(body.split())} fields; only user crontabs are supported"
            )
        fields = match.groups()[:5]
        if not all(field.isascii() for field in fields):
            raise _LineRejected(
                "the time fields may hold only ASCII digits, names (MON, JAN) and * , - /"
            )
        cron_expr, command = " ".join(fields), match[6]
    if not command:
        raise _LineRejected(f"no command follows the schedule {cron_expr!r}")
    return cron_expr, command


def _split_percent(text: str) -> tuple[str, str]:
    """Cron's ``%`` rule: ``(command, stdin)``, stdin ``""`` when there is none."""
    command: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            command.append("%" if following == "%" else char + following)
            index += 2
            continue
        if char == "%":
            return "".join(command), _stdin_of(text[index + 1 :])
        command.append(char)
        index += 1
    return "".join(command), ""


def _stdin_of(text: str) -> str:
    """The bytes cron writes to the command's stdin (a port of cron's ``write_data``)."""
    written: list[str] = []
    escaped = need_newline = False
    for char in text:
        if escaped:
            if char != "%":
                written.append("\\")
        elif char == "%":
            char = "\n"
        escaped = char == "\\"
        if not escaped:
            written.append(char)
            need_newline = char != "\n"
    if escaped:
        written.append("\\")
    if need_newline:
        written.append("\n")
    return "".join(written)


def _unquote(value: str) -> str | None:
    """``value`` without one pair of surrounding quotes; ``None`` if a quote is unbalanced."""
    if value[:1] not in ("'", '"'):
        return value
    close = value.find(value[0], 1)
    if close == -1 or value[close + 1 :].strip():
        return None
    return value[1:close]


def _trim_trailing_blanks(line: str) -> str:
    trimmed = line.rstrip(" \t")
    if trimmed != line and trimmed.endswith("\\"):
        return line[: len(trimmed) + 1]  # the escaped blank is part of the command
    return trimmed


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")
