"""`carillon run` as a process on PostgreSQL: ready, owns partitions, hands them back on
SIGTERM; and the `carillon` CLI, as separate processes, driving it through its API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from engine.ledger.postgres import open_postgres_ledger
from tests.ledger.backends import postgres_template_database

pytestmark = pytest.mark.postgres


async def read_until(
    stream: trio.abc.ReceiveStream, needle: str, buffer: list[str]
) -> dict[str, object]:
    pending = ""
    while True:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise AssertionError(f"process ended before {needle!r}: {''.join(buffer)}")
        pending += chunk.decode()
        *lines, pending = pending.split("\n")
        for line in lines:
            buffer.append(line + "\n")
            record = json.loads(line)
            if needle in str(record.get("msg")):
                return record


async def test_a_node_process_starts_owns_partitions_and_releases_them_on_sigterm(
    database_url: str, postgres_template: str
) -> None:
    async with postgres_template_database(database_url, postgres_template) as url:
        command = [
            sys.executable, "-m", "engine", "run", "--database-url", url,
            "--node-id", "proc-1", "--lease-ttl", "3", "--lease-safety-margin", "0.5",
            "--log-format", "json", "--http", "127.0.0.1:0",
        ]  # fmt: skip
        process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        assert process.stderr is not None
        seen: list[str] = []
        try:
            with trio.fail_after(30):
                ready = await read_until(process.stderr, "node ready", seen)
            assert ready["node_id"] == "proc-1"
            async with open_postgres_ledger(url) as ledger:
                with trio.fail_after(15):
                    while True:
                        leases = await ledger.leases_list()
                        if all(lease.owner_id == "proc-1" for lease in leases):
                            break
                        await trio.sleep(0.2)
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    code = await process.wait()
                assert code == 0, "".join(seen)
                leases = await ledger.leases_list()
                assert all(lease.owner_id is None for lease in leases)
                assert await ledger.nodes_live() == []
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _carillon(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """Run the ``carillon`` command as a separate process (the way an operator does)."""
    return await trio.run_process(
        [sys.executable, "-m", "engine", *args], capture_stdout=True, capture_stderr=True,
        check=False, env=env,
    )  # fmt: skip


async def test_the_cli_drives_a_live_node_process_through_its_api(
    database_url: str, postgres_template: str, tmp_path: Path
) -> None:
    async with postgres_template_database(database_url, postgres_template) as url:
        command = [
            sys.executable, "-m", "engine", "run", "--database-url", url, "--demo",
            "--node-id", "proc-api", "--log-format", "json", "--http", "127.0.0.1:0",
        ]  # fmt: skip
        process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        assert process.stderr is not None
        seen: list[str] = []
        try:
            with trio.fail_after(30):
                ready = await read_until(process.stderr, "node ready", seen)
            api_url = str(ready["api"])
            assert api_url.startswith("http://127.0.0.1:")
            env = {**os.environ, "CARILLON_URL": api_url}
            token_file = tmp_path / "token"
            created = await _carillon(
                "token", "create", "--admin", "--database-url", url, "--save", str(token_file),
                env=env,
            )  # fmt: skip
            assert created.returncode == 0, created.stderr
            env["CARILLON_TOKEN_FILE"] = str(token_file)

            added = await _carillon(
                "schedule", "add", "proc-every-second", "--cron", "* * * * * *",
                "--task-type", "demo", env=env,
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            bad = await _carillon(
                "schedule", "add", "proc-bad", "--cron", "61 * * * *", "--task-type", "demo",
                env=env,
            )  # fmt: skip
            assert bad.returncode == 2
            assert b"minute field" in bad.stderr
            assert b"Traceback" not in bad.stderr

            with trio.fail_after(20):
                while True:
                    listed = await _carillon(
                        "executions", "list", "--schedule", "proc-every-second",
                        "--status", "succeeded", "--output", "json", env=env,
                    )  # fmt: skip
                    assert listed.returncode == 0, listed.stderr
                    if json.loads(listed.stdout)["items"]:
                        break
                    await trio.sleep(0.5)
            demo = await _carillon("schedule", "show", "demo-every-10s", "-o", "json", env=env)
            assert json.loads(demo.stdout)["task_type"] == "demo"
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await process.wait() == 0, "".join(seen)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
