"""Domain records: deterministic execution ids, identifier rules, payload limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from engine.errors import InvalidField
from engine.model import (
    PAYLOAD_BYTES_MAX,
    Execution,
    ExecutionStatus,
    Schedule,
    check_payload_size,
    execution_id,
    parse_execution_id,
    validate_identifier,
    validate_scope,
)


def test_execution_id_is_deterministic_and_offset_independent() -> None:
    planned = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    same_instant = planned.astimezone(timezone(timedelta(hours=-4)))
    assert execution_id("billing", planned) == "billing:2026-03-08T07:00:00Z"
    assert execution_id("billing", same_instant) == execution_id("billing", planned)


def test_execution_id_round_trips() -> None:
    planned = datetime(2026, 3, 8, 7, 0, 30, tzinfo=UTC)
    assert parse_execution_id(execution_id("a.b-c_d~e", planned)) == ("a.b-c_d~e", planned)


@pytest.mark.parametrize(
    "bad", ["", "has:colon", "has space", "-leading", "x" * 129, "ü", "trailing\n", "x\n" * 60]
)
def test_identifiers_are_refused_when_malformed(bad: str) -> None:
    with pytest.raises(InvalidField, match="is invalid"):
        validate_identifier(bad, kind="schedule id")


def test_payload_at_the_limit_is_accepted_and_over_it_refused() -> None:
    overhead = len(msgspec.json.encode({"blob": ""}))
    at_limit = {"blob": "x" * (PAYLOAD_BYTES_MAX - overhead)}
    assert check_payload_size(at_limit) == PAYLOAD_BYTES_MAX
    with pytest.raises(InvalidField, match="the limit is 65536 bytes"):
        check_payload_size({"blob": "x" * (PAYLOAD_BYTES_MAX - overhead + 1)})


def test_records_round_trip_through_json() -> None:
    schedule = Schedule(
        schedule_id="s1", tenant_id="t1", cron_expr="0 * * * *", task_type="noop",
        payload={"k": [1, 2]}, next_run_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    assert msgspec.json.decode(msgspec.json.encode(schedule), type=Schedule) == schedule
    execution = Execution(
        execution_id="s1:2026-01-01T00:00:00Z", schedule_id="s1", tenant_id="t1",
        task_type="noop", planned_at=datetime(2026, 1, 1, tzinfo=UTC), partition_id=0,
    )  # fmt: skip
    encoded = msgspec.json.encode(execution)
    assert b'"status":"queued"' in encoded
    assert msgspec.json.decode(encoded, type=Execution) == execution


def test_an_execution_always_names_its_partition_and_zero_is_one() -> None:
    # What the API has always sent: both ledgers set the partition (Postgres: NOT NULL since
    # migration 0001), so every stored or served execution decodes.
    served = (
        b'{"execution_id":"s1:2026-01-01T00:00:00Z","schedule_id":"s1","tenant_id":"t1",'
        b'"task_type":"noop","planned_at":"2026-01-01T00:00:00Z","status":"succeeded",'
        b'"attempt":1,"fencing_token":3,"partition_id":0}'
    )
    execution = msgspec.json.decode(served, type=Execution)
    assert execution.partition_id == 0
    for without in (b"", b',"partition_id":null'):
        with pytest.raises(msgspec.ValidationError, match="partition_id"):
            msgspec.json.decode(served.replace(b',"partition_id":0', without), type=Execution)


def test_terminal_statuses() -> None:
    terminal = {status for status in ExecutionStatus if status.is_terminal}
    assert terminal == {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.DEAD_LETTER,
        ExecutionStatus.SKIPPED,
    }


@pytest.mark.parametrize("scope", ["admin", "tenant:acme", "tenant:a.b_c~d-1"])
def test_token_scopes_are_admin_or_one_tenant(scope: str) -> None:
    assert validate_scope(scope) == scope


@pytest.mark.parametrize(
    "scope", ["", "Admin", "root", "tenant:", "tenant:a b", "tenants:x", "tenant"]
)
def test_other_token_scopes_are_refused(scope: str) -> None:
    with pytest.raises(InvalidField, match="scope"):
        validate_scope(scope)
