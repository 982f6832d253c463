"""The timetable cache: one compiled timetable per resolved expression, zone and policy."""

from __future__ import annotations

import pytest

from engine.core import cron
from engine.core.cron import resolve_hash
from engine.core.timetable import TimetableCache
from engine.errors import ValidationError


def test_schedules_whose_h_lands_on_the_same_minute_share_one_timetable() -> None:
    cache = TimetableCache()
    ids = [f"sch-{n}" for n in range(400)]
    by_minute = {
        resolve_hash("H * * * *", sid): cache.get("H * * * *", schedule_id=sid) for sid in ids
    }
    assert len(by_minute) <= 60
    for sid in ids:
        assert cache.get("H * * * *", schedule_id=sid) is by_minute[resolve_hash("H * * * *", sid)]
    assert cache.get("H * * * *", schedule_id=ids[0]).spec.expression == resolve_hash(
        "H * * * *", ids[0]
    )


def test_a_hit_does_not_parse_the_expression_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TimetableCache()
    cache.get("*/5 * * * *", "Europe/Berlin")
    cache.get("H H * * *", "Asia/Tokyo", schedule_id="sch-1")

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("parsed on a cache hit")

    monkeypatch.setattr("engine.core.timetable.parse_cron", refuse)
    cache.get("*/5 * * * *", "Europe/Berlin")
    cache.get("H H * * *", "Asia/Tokyo", schedule_id="sch-1")
    assert cache.hits == 2


def test_resolving_h_gives_the_expression_parse_cron_validates() -> None:
    spec = cron.parse_cron("H/15 H(8-18) * * MON-FRI", hash_key="sch-7")
    assert spec.expression == resolve_hash("H/15 H(8-18) * * MON-FRI", "sch-7")
    assert resolve_hash("*/5 * * * *", None) == "*/5 * * * *"


def test_bad_expressions_and_zones_are_still_refused_on_a_miss() -> None:
    cache = TimetableCache()
    with pytest.raises(ValidationError):
        cache.get("H * * * *")  # H needs the schedule id
    with pytest.raises(ValidationError):
        cache.get("61 * * * *")
    with pytest.raises(ValidationError):
        cache.get("* * * * *", "Mars/Olympus_Mons")
