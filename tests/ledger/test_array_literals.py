"""The complete's array parameters: literals that PostgreSQL reads back as exactly the values.

``text_array``, ``int_array`` and ``timestamptz_array`` (engine/ledger/postgres/rows.py) replace
asyncpg's per-element binary encoding of a complete's batch; whatever text the ledger
accepts must come out of the server unchanged -- quotes, backslashes, commas, braces,
whitespace, the word NULL, the empty string, non-ASCII -- and ``None`` must come out NULL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest

from engine.ledger.bridge import DatabaseBridge
from engine.ledger.postgres import rows
from engine.ledger.postgres.rows import int_array, text_array, timestamptz_array

NASTY = [
    "plain",
    "",
    " ",
    "  padded  ",
    "NULL",
    "null",
    'a "quoted" word',
    "back\\slash",
    "\\",
    '"',
    '\\"',
    "comma,separated",
    "{braces}",
    "}{",
    "tab\there",
    "line\nbreak",
    "é ü 漢字 🙂",
    "s1:2026-03-08,07:00:00Z",  # an execution id Python's fromisoformat accepts
    "s1:2026-03-08 07:00:00Z ",
]


def test_text_arrays_quote_every_element() -> None:
    assert text_array([]) == "{}"
    assert text_array(["a", "b"]) == '{"a","b"}'
    assert text_array([None, None]) == "{NULL,NULL}"
    assert text_array(["a", None]) == '{"a",NULL}'
    assert text_array(['x"y\\z']) == '{"x\\"y\\\\z"}'


def test_plain_ids_are_joined_without_escaping_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path: ids hold neither quotes nor backslashes, so nothing is escaped one by one
    (the separators' own quotes must not send every batch down the slow path)."""

    def escaped(value: str) -> str:
        raise AssertionError(f"{value!r} was escaped")

    monkeypatch.setattr(rows, "_quoted", escaped)
    ids = [f"s{n:07d}:2026-03-08T07:00:00Z" for n in range(1000)]
    assert text_array(ids) == '{"' + '","'.join(ids) + '"}'
    assert text_array(["succeeded", "failed"]) == '{"succeeded","failed"}'


def test_int_and_timestamp_arrays() -> None:
    assert int_array([]) == "{}"
    assert int_array([1, -2, 2**40]) == "{1,-2,1099511627776}"
    assert int_array([True, False]) == "{1,0}"
    assert timestamptz_array([]) == "{}"
    assert timestamptz_array([None]) == "{NULL}"
    plus_two = datetime(2026, 3, 8, 9, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert timestamptz_array([None, plus_two]) == '{NULL,"2026-03-08T07:00:00.123456+00:00"}'


async def _read_back(connection: asyncpg.Connection, query: str, literal: str) -> list[object]:
    value: list[object] = await connection.fetchval(query, literal)
    return value


@pytest.mark.postgres
async def test_postgres_reads_text_arrays_back_unchanged(
    bridge: DatabaseBridge, connection: asyncpg.Connection
) -> None:
    query = "SELECT $1::text::text[]"
    for values in (NASTY, [None, *NASTY, None], [None], [], ["only"]):
        assert await bridge.call(_read_back, connection, query, text_array(values)) == values


@pytest.mark.postgres
async def test_postgres_reads_int_and_timestamp_arrays_back_unchanged(
    bridge: DatabaseBridge, connection: asyncpg.Connection
) -> None:
    ints = [0, 1, -1, 2_147_483_647, -2_147_483_648]
    assert (
        await bridge.call(_read_back, connection, "SELECT $1::text::integer[]", int_array(ints))
        == ints
    )
    instants = [
        None,
        datetime(2026, 3, 8, 7, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 7, 0, 0, 999_999, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(9999, 12, 30, tzinfo=UTC),
    ]
    read = await bridge.call(
        _read_back, connection, "SELECT $1::text::timestamptz[]", timestamptz_array(instants)
    )
    assert read == instants
