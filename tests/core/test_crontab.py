"""Importing a user crontab: what cron would run becomes an entry, anything else a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.crontab import (
    CRONTAB_BYTES_MAX,
    ENTRIES_MAX,
    ENV_VARIABLES_MAX,
    LINE_CHARS_MAX,
    CrontabEntry,
    CrontabImport,
    RejectedLine,
    parse_crontab,
)
from engine.core.timetable import Timetable
from engine.errors import InvalidField, UnknownTimeZone
from engine.model import PAYLOAD_BYTES_MAX, validate_identifier

SAMPLE = Path(__file__).with_name("sample.crontab")


def only_entry(text: str, **kwargs: str) -> CrontabEntry:
    result = parse_crontab(text, **kwargs)
    assert result.rejected == []
    assert len(result.entries) == 1
    return result.entries[0]


def only_rejection(text: str) -> RejectedLine:
    result = parse_crontab(text)
    assert result.entries == []
    assert len(result.rejected) == 1
    return result.rejected[0]


def zones(result: CrontabImport) -> dict[int, str]:
    return {entry.line_no: entry.timezone for entry in result.entries}


# The sample crontab -----------------------------------------------------------------------


def test_sample_crontab_imports_entries_and_explains_rejections() -> None:
    result = parse_crontab(SAMPLE.read_text())

    assert [(e.line_no, e.cron_expr, e.timezone) for e in result.entries] == [
        (10, "30 2 * * *", "Europe/Paris"),
        (11, "5 0 * * *", "Europe/Paris"),
        (12, "0 9 * * mon-fri", "Europe/Paris"),
        (15, "@hourly", "America/New_York"),
        (18, "*/15 * * * *", "America/New_York"),
        (21, "0 0 1 * *", "America/New_York"),
    ]
    by_line = {entry.line_no: entry for entry in result.entries}
    env = {"SHELL": "/bin/bash", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert by_line[10].env == {**env, "MAILTO": "ops@example.com"}
    assert by_line[11].command == "tar czf /backups/home-$(date +%F).tgz /home"
    assert by_line[12].command == "/opt/reports/daily.sh  # weekday report"
    assert by_line[21].payload == {
        "command": 'mail -s "Monthly report" ops@example.com',
        "env": {**env, "MAILTO": ""},
        "stdin": "Dear ops,\nall good.\n",
    }

    reasons = {line.line_no: line.reason for line in result.rejected}
    assert sorted(reasons) == [16, 17, 19]
    assert "systemd" in reasons[16]
    assert "minute field '61'" in reasons[17]
    assert reasons[19].startswith("duplicate of line 18")
    assert result.rejected[0].text == "@reboot /opt/agent/start.sh"


# Lines, comments and assignments ----------------------------------------------------------


def test_blank_and_comment_lines_are_skipped_silently() -> None:
    result = parse_crontab("\n   \n# a comment\n\t  # an indented one\n")

    assert result == CrontabImport(entries=[], rejected=[])


def test_hash_after_the_command_start_is_part_of_the_command() -> None:
    entry = only_entry("0 * * * * echo '#not a comment' # nor this\n")

    assert entry.command == "echo '#not a comment' # nor this"


def test_assignments_apply_to_following_lines_only() -> None:
    result = parse_crontab("0 1 * * * first\nMAILTO=ops@example.com\n0 2 * * * second\n")

    assert [entry.env for entry in result.entries] == [{}, {"MAILTO": "ops@example.com"}]
    assert [entry.payload["env"] for entry in result.entries] == [
        {},
        {"MAILTO": "ops@example.com"},
    ]


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("A=plain", "plain"),
        ("A = spaced out  ", "spaced out"),
        ('A="double quoted "', "double quoted "),
        ("A='single # quoted'", "single # quoted"),
        ("A=", ""),
        ('A=""', ""),
        ("A=$PATH:/opt/bin", "$PATH:/opt/bin"),
        ("A=a # not a comment", "a # not a comment"),
        ('"A"=quoted name', "quoted name"),
    ],
)
def test_assignment_values_lose_one_pair_of_quotes_and_nothing_else(line: str, value: str) -> None:
    entry = only_entry(f"{line}\n* * * * * run\n")

    assert entry.env == {"A": value}


@pytest.mark.parametrize("line", ['A="unclosed', "A='a' trailing", "A=\"a\" 'b'"])
def test_unbalanced_quote_rejects_the_assignment(line: str) -> None:
    result = parse_crontab(f"{line}\n* * * * * run\n")

    assert [rejected.line_no for rejected in result.rejected] == [1]
    assert "quote" in result.rejected[0].reason
    assert result.entries[0].env == {}


def test_unusable_variable_name_is_rejected() -> None:
    rejected = only_rejection("MY-VAR=1\n")

    assert "'MY-VAR' is not a usable environment variable name" in rejected.reason


def test_too_many_environment_variables_are_rejected() -> None:
    lines = [f"V{index}=x" for index in range(ENV_VARIABLES_MAX + 1)]
    result = parse_crontab("\n".join([*lines, "V0=y", "* * * * * run"]))

    assert [line.line_no for line in result.rejected] == [ENV_VARIABLES_MAX + 1]
    assert len(result.entries[0].env) == ENV_VARIABLES_MAX
    assert result.entries[0].env["V0"] == "y"


# Time zones -------------------------------------------------------------------------------


def test_cron_tz_applies_to_following_lines_only() -> None:
    result = parse_crontab(
        "0 9 * * * a\nCRON_TZ=Asia/Tokyo\n0 9 * * * b\nCRON_TZ=Europe/Paris\n0 9 * * * c\n",
        default_timezone="America/Chicago",
    )

    assert zones(result) == {1: "America/Chicago", 3: "Asia/Tokyo", 5: "Europe/Paris"}


def test_tz_sets_the_zone_and_cron_tz_wins_over_it() -> None:
    result = parse_crontab(
        "TZ=Asia/Tokyo\n0 9 * * * a\nCRON_TZ=Europe/Paris\n0 9 * * * b\nTZ=UTC\n0 9 * * * c\n"
    )

    assert zones(result) == {2: "Asia/Tokyo", 4: "Europe/Paris", 6: "Europe/Paris"}


def test_empty_cron_tz_restores_the_default_zone() -> None:
    result = parse_crontab(
        "CRON_TZ=Asia/Tokyo\n0 9 * * * a\nCRON_TZ=\n0 9 * * * b\n", default_timezone="Europe/Oslo"
    )

    assert zones(result) == {2: "Asia/Tokyo", 4: "Europe/Oslo"}


def test_zone_variables_stay_out_of_env() -> None:
    entry = only_entry("CRON_TZ=Asia/Tokyo\nTZ=UTC\nHOME=/home/me\n0 9 * * * run\n")

    assert entry.env == {"HOME": "/home/me"}


def test_invalid_zone_rejects_following_entries() -> None:
    result = parse_crontab(
        "CRON_TZ=Europe/Pariss\n0 9 * * * a\n@daily b\nCRON_TZ=Europe/Paris\n0 9 * * * c\n"
    )

    reasons = {line.line_no: line.reason for line in result.rejected}
    assert "unknown time zone 'Europe/Pariss'" in reasons[1]
    assert reasons[2] == reasons[3]
    assert reasons[2].startswith("follows an invalid CRON_TZ on line 1")
    assert zones(result) == {5: "Europe/Paris"}


def test_invalid_tz_does_not_matter_under_a_valid_cron_tz() -> None:
    result = parse_crontab("CRON_TZ=Asia/Tokyo\nTZ=Nowhere\n0 9 * * * a\n")

    assert [line.line_no for line in result.rejected] == [2]
    assert zones(result) == {3: "Asia/Tokyo"}


def test_invalid_default_timezone_is_a_caller_error() -> None:
    with pytest.raises(UnknownTimeZone):
        parse_crontab("", default_timezone="Mars/Olympus")


# Entries ----------------------------------------------------------------------------------


def test_reboot_line_is_rejected_with_a_reason() -> None:
    rejected = only_rejection("@reboot /opt/agent/start.sh\n")

    assert rejected.text == "@reboot /opt/agent/start.sh"
    assert "boots" in rejected.reason
    assert "systemd unit" in rejected.reason


def test_unknown_macro_is_rejected() -> None:
    rejected = only_rejection("@fortnightly run\n")

    assert "unknown macro '@fortnightly'" in rejected.reason


@pytest.mark.parametrize(
    "macro", ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
)
def test_macros_are_kept_as_macros(macro: str) -> None:
    entry = only_entry(f"{macro.upper()}\t  run it\n")

    assert (entry.cron_expr, entry.command) == (macro, "run it")


def test_sixth_field_starts_the_command_not_seconds() -> None:
    entry = only_entry("0 9 * * * * /bin/run\n")

    assert (entry.cron_expr, entry.command) == ("0 9 * * *", "* /bin/run")
    # Read as five fields, a seconds-first line usually has an hour or a day out of range.
    assert "the hour field '30'" in only_rejection("0 30 9 * * * /bin/run\n").reason


def test_fields_separated_by_tabs_are_joined_by_single_spaces() -> None:
    entry = only_entry("  0\t9  *\t* 1-5\t\tcmd  --flag\n")

    assert (entry.cron_expr, entry.command) == ("0 9 * * 1-5", "cmd  --flag")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("* * * run", "expected 5 time fields"),
        ("* * * * *", "no command follows the schedule '* * * * *'"),
        ("@daily", "no command follows the schedule '@daily'"),
        ("0 ٩ * * * run", "ASCII"),
    ],
)
def test_malformed_entries_are_rejected(line: str, reason: str) -> None:
    assert reason in only_rejection(line).reason


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("61 * * * *", "the minute field '61'"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 * FOO *", "month field"),
    ],
)
def test_invalid_expression_is_rejected_with_the_parser_message(
    expression: str, reason: str
) -> None:
    assert reason in only_rejection(f"{expression} run\n").reason


def test_cronie_do_not_log_dash_is_accepted() -> None:
    result = parse_crontab("-*/5 * * * * quiet\n-@daily quieter\n")

    assert [entry.cron_expr for entry in result.entries] == ["*/5 * * * *", "@daily"]


# The percent sign -------------------------------------------------------------------------


def test_percent_splits_command_and_stdin() -> None:
    entry = only_entry("0 8 * * * mail -s hello ops%Good morning,%the night went well.\n")

    assert entry.command == "mail -s hello ops"
    assert entry.payload == {
        "command": "mail -s hello ops",
        "env": {},
        "stdin": "Good morning,\nthe night went well.\n",
    }


def test_escaped_percent_is_a_literal_percent() -> None:
    entry = only_entry(r"0 0 * * * date +\%Y-\%m-\%d > /tmp/today" + "\n")

    assert entry.command == "date +%Y-%m-%d > /tmp/today"
    assert "stdin" not in entry.payload


@pytest.mark.parametrize(
    ("command_text", "command", "stdin"),
    [
        ("cat%", "cat", None),
        ("cat%%", "cat", "\n"),
        ("cat%a%", "cat", "a\n"),
        (r"cat%a\%b", "cat", "a%b\n"),
        (r"cat%a\b", "cat", "a\\b\n"),
        (r"cat%a\\%b", "cat", "a\\%b\n"),
        (r"c\\%a", r"c\\", "a\n"),
        (r"c\x%a", r"c\x", "a\n"),
        ("c\\", "c\\", None),
    ],
)
def test_percent_translation_matches_cron(
    command_text: str, command: str, stdin: str | None
) -> None:
    entry = only_entry(f"* * * * * {command_text}\n")

    assert (entry.command, entry.payload.get("stdin")) == (command, stdin)


def test_empty_command_before_percent_is_rejected() -> None:
    assert "the command before the first % is empty" in only_rejection("* * * * * %data\n").reason


# Ids ------------------------------------------------------------------------------------


def test_reimport_gives_same_ids() -> None:
    text = SAMPLE.read_text()

    first, second = parse_crontab(text), parse_crontab(text)

    assert [entry.schedule_id for entry in first.entries] == [
        entry.schedule_id for entry in second.entries
    ]
    assert first == second


def test_ids_ignore_line_numbers_environment_and_trailing_blanks() -> None:
    before = only_entry("MAILTO=a@example.com\n0 9 * * * report\n")
    after = only_entry("# moved down\nMAILTO=b@example.com\nPATH=/bin\n\n0 9 * * * report  \n")

    assert after.schedule_id == before.schedule_id
    assert after.payload["env"] == {"MAILTO": "b@example.com", "PATH": "/bin"}


def test_ids_change_with_zone_schedule_command_and_stdin() -> None:
    base = "0 9 * * * report%x"
    variants = [
        base,
        "CRON_TZ=Asia/Tokyo\n" + base,
        "0 10 * * * report%x",
        "0 9 * * * report2%x",
        "0 9 * * * report%y",
        "0 9 * * * report",
    ]

    ids = {only_entry(text).schedule_id for text in variants}

    assert len(ids) == len(variants)


def test_ids_use_the_prefix_and_are_valid_identifiers() -> None:
    entry = only_entry("@daily run\n", id_prefix="alice.crontab-")

    assert entry.schedule_id.startswith("alice.crontab-")
    assert len(entry.schedule_id) == len("alice.crontab-") + 12
    assert validate_identifier(entry.schedule_id, kind="schedule id") == entry.schedule_id


@pytest.mark.parametrize("prefix", ["has space-", "-leading", "x" * 117, "colon:"])
def test_invalid_id_prefix_is_a_caller_error(prefix: str) -> None:
    with pytest.raises(InvalidField, match="id prefix"):
        parse_crontab("", id_prefix=prefix)


def test_empty_id_prefix_gives_bare_hashes() -> None:
    assert len(only_entry("@daily run\n", id_prefix="").schedule_id) == 12


def test_duplicate_line_is_rejected_naming_the_first() -> None:
    result = parse_crontab("0 9 * * * run\nMAILTO=x\n0  9 * * *  run\n")

    assert [entry.line_no for entry in result.entries] == [1]
    assert result.rejected[0].line_no == 3
    assert result.rejected[0].reason.startswith("duplicate of line 1")


def test_hash_token_resolves_from_the_schedule_id() -> None:
    entry = only_entry("H H * * * spread\n")

    timetable = Timetable.compile(entry.cron_expr, entry.timezone, schedule_id=entry.schedule_id)
    assert timetable.spec.uses_hash


# Bounds and encodings ---------------------------------------------------------------------


def test_windows_line_endings_and_missing_final_newline_are_accepted() -> None:
    result = parse_crontab("MAILTO=ops\r\n0 9 * * * a\r\n@daily b")

    assert [(e.line_no, e.command, e.env) for e in result.entries] == [
        (2, "a", {"MAILTO": "ops"}),
        (3, "b", {"MAILTO": "ops"}),
    ]


def test_escaped_trailing_blank_stays_in_the_command() -> None:
    assert only_entry("* * * * * echo a\\  \n").command == "echo a\\ "


def test_overlong_line_is_rejected() -> None:
    line = "* * * * * echo " + "x" * LINE_CHARS_MAX

    rejected = only_rejection(line + "\n")

    assert f"the limit is {LINE_CHARS_MAX}" in rejected.reason
    assert rejected.text == line


def test_overlong_zone_line_poisons_following_entries() -> None:
    result = parse_crontab("CRON_TZ=" + "x" * LINE_CHARS_MAX + "\n@daily run\n")

    assert [line.line_no for line in result.rejected] == [1, 2]
    assert "follows an invalid CRON_TZ on line 1" in result.rejected[1].reason


@pytest.mark.parametrize("line", ["* * * * * echo \x00", "* * * * * echo \ud800"])
def test_unusable_characters_are_rejected(line: str) -> None:
    assert "the line" in only_rejection(line).reason


def test_oversized_input_is_refused() -> None:
    with pytest.raises(InvalidField, match=str(CRONTAB_BYTES_MAX)):
        parse_crontab("#" * CRONTAB_BYTES_MAX + "\n")


def test_oversized_input_is_measured_in_utf8_bytes() -> None:
    with pytest.raises(InvalidField):
        parse_crontab("#" + "é" * (CRONTAB_BYTES_MAX // 2))


def test_too_many_entries_are_refused() -> None:
    with pytest.raises(InvalidField, match=str(ENTRIES_MAX)):
        parse_crontab("x\n" * (ENTRIES_MAX + 1))


def test_payload_over_the_limit_is_rejected() -> None:
    values = [f"V{index}='{'v' * (LINE_CHARS_MAX - 10)}'" for index in range(20)]

    rejected = only_rejection("\n".join([*values, "* * * * * run"]))

    assert str(PAYLOAD_BYTES_MAX) in rejected.reason


# Properties -------------------------------------------------------------------------------

FIELD = st.sampled_from(["*", "0", "5", "*/7", "1-5", "mon", "61", "H", "30", "2", "JAN", "?"])
ASSIGNMENT_NAME = st.sampled_from(["CRON_TZ", "TZ", "MAILTO", "PATH", "X-Y", '"Q"'])
ZONE = st.sampled_from(["UTC", "Europe/Paris", "Asia/Kolkata", "Nowhere", "", "'Asia/Tokyo'"])
CRONISH_LINE = st.one_of(
    st.builds(" ".join, st.lists(FIELD, min_size=0, max_size=7)).map(lambda f: f + " cmd%in"),
    st.builds(lambda n, v: f"{n}={v}", ASSIGNMENT_NAME, st.one_of(ZONE, st.text(max_size=8))),
    st.sampled_from(["@daily x", "@reboot x", "@weird x", "# c", "", "-@hourly y", "\\%%"]),
    st.text(max_size=30),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CRONISH_LINE, max_size=25), st.sampled_from(["\n", "\r\n"]))
def test_parse_never_raises_and_every_entry_compiles(lines: list[str], newline: str) -> None:
    text = newline.join(lines)

    result = parse_crontab(text)

    line_count = len(text.split("\n"))
    numbers = [e.line_no for e in result.entries] + [r.line_no for r in result.rejected]
    assert len(numbers) == len(set(numbers))
    assert all(1 <= number <= line_count for number in numbers)
    for entry in result.entries:
        Timetable.compile(entry.cron_expr, entry.timezone, schedule_id=entry.schedule_id)
        validate_identifier(entry.schedule_id, kind="schedule id")
        assert entry.command.strip()
        assert entry.payload["command"] == entry.command
        assert entry.payload["env"] == entry.env
        assert not {"CRON_TZ", "TZ"} & set(entry.env)
    assert len({entry.schedule_id for entry in result.entries}) == len(result.entries)
    assert parse_crontab(text) == result


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_parse_never_raises_on_arbitrary_text(text: str) -> None:
    result = parse_crontab(text)

    for entry in result.entries:
        Timetable.compile(entry.cron_expr, entry.timezone, schedule_id=entry.schedule_id)
