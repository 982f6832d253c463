"""Log lines: the human and JSON formats of ``carillon.*`` records, and reconfiguration."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import LogFormat, LogLevel
from engine.logs import LOGGER_NAMESPACE, HumanFormatter, JsonFormatter, configure_logging

TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture(autouse=True)
def restore_carillon_logger() -> Iterator[None]:
    logger = logging.getLogger(LOGGER_NAMESPACE)
    handlers, level = list(logger.handlers), logger.level
    yield
    for handler in logger.handlers:
        if handler not in handlers:
            handler.close()
    logger.handlers[:] = handlers
    logger.setLevel(level)


def configured(fmt: LogFormat, level: LogLevel = LogLevel.INFO) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, fmt, stream=stream)
    return stream


def record_at(created: float, msg: str, *args: object) -> logging.LogRecord:
    record = logging.LogRecord("carillon.planner", logging.INFO, __file__, 1, msg, args, None)
    record.created, record.msecs = created, (created % 1) * 1000
    return record


class Opaque:
    def __str__(self) -> str:
        return "opaque thing"


def test_human_line_shows_utc_millisecond_timestamp_level_logger_and_message() -> None:
    record = record_at(1795939200.123, "partition %d: planned %d executions", 3, 120)
    assert HumanFormatter().format(record) == (
        "2026-11-29T08:00:00.123Z INFO carillon.planner partition 3: planned 120 executions"
    )


def test_json_line_carries_rfc3339_utc_timestamp_and_core_fields() -> None:
    record = record_at(1795939200.123, "partition %d: planned %d executions", 3, 120)
    assert json.loads(JsonFormatter().format(record)) == {
        "ts": "2026-11-29T08:00:00.123Z",
        "level": "info",
        "logger": "carillon.planner",
        "msg": "partition 3: planned 120 executions",
    }


def test_json_lines_parse_and_carry_extras() -> None:
    stream = configured(LogFormat.JSON)
    log = logging.getLogger("carillon.planner")
    log.info("planned", extra={"partition": 3, "count": 120, "where": Path("/x"), "o": Opaque()})
    log.warning("lease lost", extra={"partitions": [1, 2]})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert re.fullmatch(TS, first.pop("ts"))
    assert first == {
        "level": "info",
        "logger": "carillon.planner",
        "msg": "planned",
        "partition": 3,
        "count": 120,
        "where": "/x",
        "o": "opaque thing",
    }
    assert second["level"] == "warning"
    assert second["partitions"] == [1, 2]


def test_json_extra_named_like_a_core_field_does_not_overwrite_it() -> None:
    stream = configured(LogFormat.JSON)
    logging.getLogger("carillon.api").info("request", extra={"ts": "yesterday", "level": 3})
    line = json.loads(stream.getvalue())
    assert line["extra_ts"] == "yesterday"
    assert line["extra_level"] == 3
    assert line["level"] == "info"
    assert re.fullmatch(TS, line["ts"])


def test_json_line_survives_an_extra_that_cannot_be_printed() -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    stream = configured(LogFormat.JSON)
    logging.getLogger("carillon.x").info("odd", extra={"thing": Broken()})
    assert json.loads(stream.getvalue())["thing"] == "<unprintable Broken>"


def test_json_exception_is_one_line_with_the_traceback_in_exc() -> None:
    stream = configured(LogFormat.JSON)
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        logging.getLogger("carillon.worker").exception("handler failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["msg"] == "handler failed"
    assert line["level"] == "error"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert line["exc"].rstrip().endswith("ZeroDivisionError: division by zero")


def test_human_format_appends_extras_and_prints_the_traceback_after_the_line() -> None:
    stream = configured(LogFormat.HUMAN)
    try:
        raise KeyError("k")
    except KeyError:
        logging.getLogger("carillon.worker").error(
            "handler failed", exc_info=True, extra={"execution": "a:b", "reason": "two words"}
        )
    first, *rest = stream.getvalue().splitlines()
    assert re.fullmatch(
        TS + r' ERROR carillon\.worker handler failed execution=a:b reason="two words"', first
    )
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "KeyError: 'k'"


def test_level_filters_records() -> None:
    stream = configured(LogFormat.HUMAN, LogLevel.WARNING)
    log = logging.getLogger("carillon.planner")
    log.info("quiet")
    log.warning("loud")
    assert [line.split(" ", 3)[1:] for line in stream.getvalue().splitlines()] == [
        ["WARNING", "carillon.planner", "loud"]
    ]


def test_configuring_twice_keeps_one_handler_and_applies_the_latest_settings() -> None:
    logger = logging.getLogger(LOGGER_NAMESPACE)
    before = len(logger.handlers)
    old = configured(LogFormat.HUMAN)
    new = configured(LogFormat.JSON, LogLevel.DEBUG)
    assert len(logger.handlers) == before + 1
    logging.getLogger("carillon.planner").debug("once")
    assert old.getvalue() == ""
    assert [json.loads(line)["msg"] for line in new.getvalue().splitlines()] == ["once"]


def test_configuring_leaves_other_handlers_alone() -> None:
    logger = logging.getLogger(LOGGER_NAMESPACE)
    theirs = logging.StreamHandler(io.StringIO())
    logger.addHandler(theirs)
    configured(LogFormat.HUMAN)
    configured(LogFormat.HUMAN)
    assert theirs in logger.handlers
