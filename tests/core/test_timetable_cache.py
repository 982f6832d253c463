"""The timetable cache: one compiled timetable per resolved expression, zone and policy."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import cron
from engine.core.cron import resolve_hash
from engine.core.hashing import stable_hash
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


# -- the memoised H resolution gives what resolving each schedule from scratch gives --------

_H_FORMS = st.sampled_from(["H", "H/5", "H/7", "H(0-29)", "H(3-17)/4", "H,30", "H(10-12)/1"])


def _resolve_from_scratch(source: str, hash_key: str) -> str:
    """The unmemoised path: every ``H`` field from the schedule's full 64-bit hash."""
    fields, hashed = cron._hash_template(source)
    resolved = list(fields)
    for index, name, items, _ in hashed:
        seed = int.from_bytes(
            hashlib.blake2b(f"{hash_key}/{name}".encode(), digest_size=8).digest(), "big"
        )
        resolved[index] = cron._apply_hash(items, seed)
    return " ".join(resolved)


@settings(max_examples=300, deadline=None)
@given(
    minute=_H_FORMS,
    hour=st.sampled_from(["*", "H", "H(8-18)", "H/6", "9"]),
    seconds=st.sampled_from([None, "H", "H/20", "0"]),
    key=st.text(min_size=1, max_size=20),
)
def test_memoised_h_resolution_matches_resolving_from_scratch(
    minute: str, hour: str, seconds: str | None, key: str
) -> None:
    source = f"{minute} {hour} * * MON-FRI"
    if seconds is not None:
        source = f"{seconds} {source}"
    expected = _resolve_from_scratch(source, key)
    assert resolve_hash(source, key) == expected
    assert resolve_hash(source, key) == expected  # a memo hit too
    assert TimetableCache().get(source, schedule_id=key).spec.expression == expected


@given(st.text(max_size=40))
def test_stable_hash_is_64_bit_blake2b(text: str) -> None:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    assert stable_hash(text) == int.from_bytes(digest, "big")


def test_schedules_with_equal_residues_share_the_resolved_expression_object() -> None:
    resolved = [resolve_hash("H H * * *", f"sch-{n}") for n in range(3000)]
    assert len({id(text) for text in resolved}) == len(set(resolved)) <= 24 * 60
