"""The shell handler: opt-in, argv only, exit-status classification, context in the
environment, and whole-process-group cleanup on timeout and cancellation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind, build_handler
from engine.handlers.base import Handler
from tests.handlers.conftest import make_context

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process groups, checked through /proc"
)

ENABLED = HandlerOptions(enable_shell=True)


def shell(script: str, **settings: object) -> Handler:
    return build_handler("shell", {"argv": ["sh", "-c", script], **settings}, options=ENABLED)


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan may wait a while for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_all_stopped(pids: list[int]) -> None:
    with trio.fail_after(5):
        while any(is_running(pid) for pid in pids):
            await trio.sleep(0.01)


def recorded_pids(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def test_shell_is_refused_unless_the_node_enables_it() -> None:
    with pytest.raises(InvalidField, match="--enable-shell"):
        build_handler("shell", {"argv": ["true"]}, options=HandlerOptions())


def test_a_shell_string_is_refused_in_favour_of_an_argv_list() -> None:
    with pytest.raises(InvalidField, match="never a shell string"):
        build_handler("shell", {"argv": "rm -rf /tmp/x"}, options=ENABLED)
    with pytest.raises(InvalidField, match="argv must name a command"):
        build_handler("shell", {"argv": []}, options=ENABLED)
    with pytest.raises(InvalidField, match="reserved"):
        build_handler(
            "shell", {"argv": ["true"], "env": {"CARILLON_ATTEMPT": "9"}}, options=ENABLED
        )


async def test_exit_zero_succeeds() -> None:
    assert await shell("exit 0").run(make_context()) == HandlerResult.succeeded()


async def test_exit_75_is_transient() -> None:
    result = await shell("exit 75").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "exit_75")


async def test_other_exit_statuses_are_unknown_with_the_stderr_tail() -> None:
    result = await shell("echo 'first line' >&2; echo 'disk full' >&2; exit 3").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "exit_3")
    assert result.error_message is not None
    assert result.error_message.endswith("first line\ndisk full")


async def test_a_large_stderr_keeps_only_its_tail() -> None:
    script = "i=0; while [ $i -lt 2000 ]; do echo line-$i >&2; i=$((i+1)); done; exit 1"
    result = await shell(script).run(make_context())
    assert result.error_message is not None
    assert result.error_message.endswith("line-1999")
    assert "line-0\n" not in result.error_message


async def test_a_missing_command_is_permanent() -> None:
    handler = build_handler("shell", {"argv": ["/nonexistent/carillon-cmd"]}, options=ENABLED)
    result = await handler.run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "command_not_found")


async def test_the_context_is_in_the_environment_and_the_nodes_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_DATABASE_PASSWORD", "hunter2")
    script = " && ".join(
        [
            'test "$CARILLON_EXECUTION_ID" = "nightly.report:2026-03-08T07:00:00Z"',
            'test "$CARILLON_SCHEDULE_ID" = nightly.report',
            'test "$CARILLON_TENANT_ID" = acme',
            'test "$CARILLON_TASK_TYPE" = report',
            'test "$CARILLON_PLANNED_AT" = 2026-03-08T07:00:00Z',
            'test "$CARILLON_ATTEMPT" = 2',
            'test "$CARILLON_FENCING_TOKEN" = 42',
            """test "$CARILLON_PAYLOAD" = '{"region":"eu","n":3}'""",
            'test "$EXTRA" = yes',
            'test -z "$NODE_DATABASE_PASSWORD"',
            'test -n "$PATH"',
        ]
    )
    handler = shell(script + " || { env >&2; exit 1; }", env={"EXTRA": "yes"})
    assert await handler.run(make_context(attempt=2)) == HandlerResult.succeeded()


async def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    handler = shell(f"sleep 30 & echo $$ $! > {pids}; wait", timeout_s=0.5)
    result = await handler.run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")
    await wait_all_stopped(recorded_pids(pids))


async def test_a_group_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    handler = shell(
        f"trap '' TERM; sleep 30 & echo $$ $! > {pids}; wait; wait",
        timeout_s=0.3,
        kill_grace_s=0.2,
    )
    started = trio.current_time()
    result = await handler.run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")
    assert trio.current_time() - started < 3
    await wait_all_stopped(recorded_pids(pids))


async def test_cancellation_from_outside_kills_the_group_then_propagates(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    handler = shell(f"sleep 30 & echo $$ $! > {pids}; wait")
    with trio.move_on_after(0.5) as scope:
        await handler.run(make_context())
        raise AssertionError("run must not return once cancelled")
    assert scope.cancelled_caught
    await wait_all_stopped(recorded_pids(pids))


async def test_processes_left_behind_by_a_finished_command_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    handler = shell(f"sleep 30 & echo $! > {pids}; exit 0", timeout_s=10)
    with trio.fail_after(5):  # stderr, still held by the orphan, must not keep run waiting
        assert await handler.run(make_context()) == HandlerResult.succeeded()
    await wait_all_stopped(recorded_pids(pids))
