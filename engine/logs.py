"""Log output for the ``carillon`` logger tree: one line per record, human or JSON.

Engine modules log through stdlib loggers named under :data:`LOGGER_NAMESPACE`
(``logging.getLogger("carillon.planner")``) and pass structured fields with ``extra={...}``.
:func:`configure_logging` decides what those records look like:

* ``human`` — ``2026-11-29T08:00:00.123Z INFO carillon.planner partition 3: planned 120
  executions``, then any extra fields as ``key=value``; a traceback follows on its own lines.
* ``json`` — one object per line: ``ts`` (RFC 3339, UTC, milliseconds, ``Z``), ``level``
  (lower case, as ``--log-level`` spells it), ``logger``, ``msg``, then the extra fields,
  then ``exc`` (the formatted traceback) when the record carries an exception.

Invariants: every record becomes exactly one line (JSON) or one line plus its traceback
(human); a field that JSON cannot represent is written as ``str(value)``; an extra field
named like a core field is kept as ``extra_<name>`` instead of overwriting it; configuring
again replaces the previous handler, so records are never written twice.

Timestamps are ``record.created``, which the logging module stamps itself: log lines show
when they were written, and nothing here reads a clock.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import msgspec

from engine.config import LogFormat, LogLevel

__all__ = ["LOGGER_NAMESPACE", "HumanFormatter", "JsonFormatter", "configure_logging"]

LOGGER_NAMESPACE: Final = "carillon"

_LEVELS: Final = {
    LogLevel.DEBUG: logging.DEBUG,
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
}
_CORE_FIELDS: Final = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})
# Attributes every LogRecord has; whatever else a record carries came from ``extra=``.
_RECORD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", (), None).__dict__
) | {"message", "asctime", "taskName"}
_JSON_ENCODER: Final = msgspec.json.Encoder(enc_hook=str)


def configure_logging(level: LogLevel, fmt: LogFormat, *, stream: TextIO | None = None) -> None:
    """Send ``carillon.*`` records at ``level`` and above to ``stream`` (default: stderr).

    Idempotent: a second call replaces the handler installed by the first (so it may change
    the level, format or stream) and never adds another. Handlers installed by others (for
    instance pytest's capture) are left alone, and records still propagate to the root logger.
    """
    logger = logging.getLogger(LOGGER_NAMESPACE)
    for handler in [h for h in logger.handlers if isinstance(h, _CarillonHandler)]:
        logger.removeHandler(handler)
        handler.close()
    handler = _CarillonHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == LogFormat.JSON else HumanFormatter())
    logger.addHandler(handler)
    logger.setLevel(_LEVELS[level])


class _CarillonHandler(logging.StreamHandler[TextIO]):
    """Marks the handler :func:`configure_logging` owns, so it can find and replace it."""


class HumanFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> <message> [key=value ...]``, then any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts.extend(f"{key}={_human_value(value)}" for key, value in _extras(record).items())
        line = " ".join(parts)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            payload[f"extra_{key}" if key in _CORE_FIELDS else key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        try:
            return _JSON_ENCODER.encode(payload).decode()
        except Exception:  # a value whose str() fails, a self-containing list, ...
            # Keep the line and its fields, as text: a log call must never raise.
            plain = {key: _plain(value) for key, value in payload.items()}
            return _JSON_ENCODER.encode(plain).decode()


def _timestamp(record: logging.LogRecord) -> str:
    instant = datetime.fromtimestamp(record.created, UTC)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _RECORD_ATTRIBUTES and not key.startswith("_")
    }


def _human_value(value: object) -> str:
    text = str(_plain(value))
    if not text or any(c.isspace() or c in '="' for c in text):
        return _JSON_ENCODER.encode(text).decode()
    return text


def _plain(value: object) -> object:
    if isinstance(value, str | int | float | bool | None):
        return value
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
