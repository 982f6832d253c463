"""`carillon run` as a process on PostgreSQL: ready, owns partitions, hands them back on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

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
