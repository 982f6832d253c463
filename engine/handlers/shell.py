"""The ``shell`` handler: run a command (an argv list, never a shell string).

Settings: ``argv`` (a non-empty list of strings; ``["sh", "-c", "..."]`` if a shell is truly
wanted), optional ``env`` (extra variables), ``timeout_s`` (default 30 s) and
``kill_grace_s`` (default 2 s).

**Disabled unless the node runs with ``--enable-shell``**
(:attr:`HandlerOptions.enable_shell`): anyone allowed to create a task type could otherwise
run any command as the node's user, on a host holding the database credentials.

How a run goes:

* The command starts in a **new session, hence its own process group**, with stdin and
  stdout connected to ``/dev/null`` and stderr captured (its last
  :data:`STDERR_TAIL_BYTES` bytes become the error message).
* Its environment is *not* the node's (which may hold secrets): only :data:`INHERITED_ENV`,
  then the settings' ``env``, then the context as ``CARILLON_EXECUTION_ID``,
  ``CARILLON_SCHEDULE_ID``, ``CARILLON_TENANT_ID``, ``CARILLON_TASK_TYPE``,
  ``CARILLON_PLANNED_AT`` (RFC 3339 UTC), ``CARILLON_ATTEMPT``, ``CARILLON_FENCING_TOKEN``
  and ``CARILLON_PAYLOAD`` (JSON).
* At ``timeout_s`` the whole group gets SIGTERM, then SIGKILL after ``kill_grace_s``; the
  outcome is transient ``timeout``. Cancellation from outside (shutdown) does the same
  before it propagates. When the command exits by itself, group members it left behind are
  killed too: nothing started by an attempt outlives it.
* Exit 0 → succeeded; exit 75 (``EX_TEMPFAIL``) → transient ``exit_75``; any other exit
  status → unknown ``exit_<n>``; death by a signal → unknown ``signal_<n>``. A command that
  does not exist is permanent ``command_not_found``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import trio

from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.handlers.base import (
    TIMEOUT_S_DEFAULT,
    ExecutionContext,
    HandlerOptions,
    HandlerResult,
    check_timeout_s,
    parse_settings,
)

EXIT_TEMPFAIL: Final = 75
STDERR_TAIL_BYTES: Final = 4096
KILL_GRACE_S_DEFAULT: Final = 2.0
KILL_GRACE_S_MAX: Final = 60.0
STDERR_DRAIN_S_MAX: Final = 1.0
"""How long stderr may stay open after the group is gone (held by a process that left it)."""
INHERITED_ENV: Final = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_CONTEXT_PREFIX: Final = "CARILLON_"


class ShellSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    argv: list[str]
    env: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_s: float = TIMEOUT_S_DEFAULT
    kill_grace_s: float = KILL_GRACE_S_DEFAULT


def _check(settings: ShellSettings) -> None:
    if not settings.argv or not settings.argv[0]:
        raise InvalidField("shell handler: argv must name a command, e.g. ['/usr/bin/backup']")
    if any("\0" in arg for arg in settings.argv):
        raise InvalidField("shell handler: argv must not contain NUL characters")
    for name, value in settings.env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise InvalidField(f"shell handler: env name {name!r} or its value is malformed")
        if name.startswith(_CONTEXT_PREFIX):
            raise InvalidField(
                f"shell handler: env {name!r} is reserved: CARILLON_* variables carry the context"
            )
    if not 0 <= settings.kill_grace_s <= KILL_GRACE_S_MAX:
        raise InvalidField(
            f"shell handler: kill_grace_s must be between 0 and {KILL_GRACE_S_MAX:g}"
        )


def context_env(context: ExecutionContext) -> dict[str, str]:
    """The ``CARILLON_*`` variables describing ``context``."""
    return {
        "CARILLON_EXECUTION_ID": context.execution_id,
        "CARILLON_SCHEDULE_ID": context.schedule_id,
        "CARILLON_TENANT_ID": context.tenant_id,
        "CARILLON_TASK_TYPE": context.task_type,
        "CARILLON_PLANNED_AT": format_utc(context.planned_at),
        "CARILLON_ATTEMPT": str(context.attempt),
        "CARILLON_FENCING_TOKEN": str(context.fencing_token),
        "CARILLON_PAYLOAD": msgspec.json.encode(context.payload).decode(),
    }


class _StderrTail:
    """The last :data:`STDERR_TAIL_BYTES` bytes a process wrote to stderr."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = trio.Event()

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        try:
            while chunk := await stream.receive_some(STDERR_TAIL_BYTES):
                self.data = (self.data + chunk)[-STDERR_TAIL_BYTES:]
        except trio.BrokenResourceError:
            pass
        finally:
            self.closed.set()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace").strip()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, signum)


async def _end_group(process: trio.Process, grace_s: float) -> None:
    """SIGTERM the process's group, SIGKILL it after ``grace_s``, reap the leader."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with trio.move_on_after(grace_s):
            await process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()


class ShellHandler:
    """Runs one command per attempt; build it with :func:`engine.handlers.build_handler`."""

    def __init__(self, settings: Mapping[str, Any], *, options: HandlerOptions) -> None:
        if not options.enable_shell:
            raise InvalidField(
                "shell handlers are disabled on this node: start it with --enable-shell to allow "
                "them (off by default, since a shell task type runs any command as the node's user)"
            )
        if isinstance(settings.get("argv"), str):
            raise InvalidField(
                "shell handler: argv must be a list of strings such as "
                '["/usr/bin/backup", "--full"], never a shell string; to use a shell, say so: '
                '["sh", "-c", "..."]'
            )
        parsed = parse_settings("shell", settings, ShellSettings)
        _check(parsed)
        self.timeout_s = check_timeout_s("shell", parsed.timeout_s)
        self._argv = tuple(parsed.argv)
        self._kill_grace_s = parsed.kill_grace_s
        inherited = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        self._env = inherited | parsed.env

    def __repr__(self) -> str:
        return f"ShellHandler(argv={list(self._argv)!r})"

    async def run(self, context: ExecutionContext) -> HandlerResult:
        try:
            process = await trio.lowlevel.open_process(
                self._argv,
                env=self._env | context_env(context),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as error:
            return HandlerResult.permanent("command_not_found", f"cannot run {error.filename}")
        except PermissionError as error:
            return HandlerResult.permanent("spawn_error", f"cannot run {self._argv[0]}: {error}")
        except OSError as error:
            return HandlerResult.transient("spawn_error", f"cannot run {self._argv[0]}: {error}")
        tail = _StderrTail()
        supervised = False
        try:
            timed_out = await self._supervise(process, tail)
            supervised = True
        finally:
            with trio.CancelScope(shield=True):
                if not supervised:  # cancelled from outside: the group must not outlive us
                    await _end_group(process, self._kill_grace_s)
                if process.stderr is not None:
                    await process.stderr.aclose()
        return self._outcome(process.returncode, timed_out, tail.text())

    async def _supervise(self, process: trio.Process, tail: _StderrTail) -> bool:
        """Wait for the command or its deadline; end its group; True if it timed out."""
        assert process.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail.drain, process.stderr)
            with trio.move_on_after(self.timeout_s) as deadline:
                await process.wait()
            await _end_group(process, self._kill_grace_s if deadline.cancelled_caught else 0.0)
            with trio.move_on_after(STDERR_DRAIN_S_MAX):
                await tail.closed.wait()
            nursery.cancel_scope.cancel()
        return deadline.cancelled_caught

    def _outcome(self, returncode: int | None, timed_out: bool, stderr: str) -> HandlerResult:
        said = f": {stderr[-800:]}" if stderr else ""
        command = self._argv[0]
        if timed_out:
            return HandlerResult.transient(
                "timeout", f"{command} did not finish within {self.timeout_s:g} s{said}"
            )
        if returncode == 0:
            return HandlerResult.succeeded()
        if returncode == EXIT_TEMPFAIL:
            return HandlerResult.transient(
                f"exit_{returncode}", f"{command} exited with {returncode} (EX_TEMPFAIL){said}"
            )
        if returncode is not None and returncode < 0:
            name = signal.Signals(-returncode).name if -returncode in _SIGNALS else "?"
            return HandlerResult.unknown(
                f"signal_{-returncode}", f"{command} was killed by signal {name}{said}"
            )
        return HandlerResult.unknown(
            f"exit_{returncode}", f"{command} exited with {returncode}{said}"
        )


_SIGNALS: Final = frozenset(int(s) for s in signal.Signals)
