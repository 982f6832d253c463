"""A burst of broker publishes: N executions of a message-broker task type due at one instant.

Per broker kind (``--brokers``: ``redis``, ``nats`` and ``rabbitmq``), each burst in a
throwaway database (``carillon_brokers_<hex>``) of the resolved server: one task type
``publish`` of that kind,
its settings at their defaults (for redis: 64 connections, no trimming), and N schedules
(default 20,000) over 20 tenants, all due at one instant T. One node runs in this process
(PostgresLedger on the bridge, real clock, ``NodeConfig`` at its defaults apart from its id,
the log level, ``broker_allow_cidrs="127.0.0.0/8"`` and no HTTP API). The broker is a
private server started for the run on a free port (``redis-server`` with persistence off,
``nats-server -js`` with a memory-stored stream, a ``rabbitmq-server`` node of its own
publishing to a non-durable queue: the figures are the engine's and the client's, not a
disk's), never the machine's shared one.

Reported per broker: publishes/s (N / T until the last execution had succeeded in the
ledger: the last publish acknowledged and its completion written), T until all were
published, start delay p50/p99 (the ledger), the stream's entries and distinct execution
ids (exactly N each: nothing lost, nothing twice), the ledger's duplicates
(``_burst.ledger_figures``). Beside them, in the same run right after each burst, the
**bare loop**: the same client and the same publish (the handler's own connect and publish
coroutines, so the same Lua script and fields) driven by a plain uvloop loop -- no trio, no
bridge, no engine -- with as many publishes in flight as the handler's connection pool
allows (redis) or 64 at once on the one connection (nats, rabbitmq), N publishes of fresh
ids after a warm-up. The node's publishes/s is given as a ratio of the bare loop's: what the
engine's path (planning, claims and completions in PostgreSQL,
the hop to the broker bridge) leaves of what the client can do.

A full run writes its section of docs/benchmarks.md, its figures to the folder
docs/bench-results/ (as bench_brokers.json) and rebuilds the Targets section (none of its
own); ``--quick`` (1,000 executions, one run) and ``--no-docs`` write none of these.

Usage: python benchmarks/bench_brokers.py [--quick] [--no-docs] [--executions N] [--runs K]
       [--brokers redis,nats,rabbitmq] [--timeout S]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import aio_pika
import nats
import redis
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._burst import (
    CREATE_BATCH,
    TENANTS,
    admin,
    fresh_database,
    ledger_figures,
    poll_until_succeeded,
    schedule_ids,
    tenant_of,
)
from benchmarks._report import (
    machine,
    revision,
    summary,
    write_results,
    write_section,
    write_targets,
)
from engine.clock import SystemClock
from engine.config import BURST_PLAN_RATE_PER_S_DEFAULT, WORKERS_DEFAULT, LogLevel, NodeConfig
from engine.handlers import ExecutionContext, HandlerOptions
from engine.handlers.nats_jetstream import NatsHandler
from engine.handlers.rabbitmq import RabbitmqHandler
from engine.handlers.redis_stream import MAX_CONNECTIONS_DEFAULT, RedisHandler
from engine.ledger.database import resolve_database
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import PARTITIONS_DEFAULT, migrate_database, open_postgres_ledger
from engine.model import HandlerKind, Schedule, TaskType
from engine.node import Node

ALLOW: Final = "127.0.0.0/8"
TASK_TYPE: Final = "publish"
EXECUTIONS_DEFAULT: Final = 20_000
REDIS_SERVER: Final = shutil.which("redis-server") or "/usr/bin/redis-server"
NATS_SERVER: Final = shutil.which("nats-server") or "/usr/sbin/nats-server"
NATS_IN_FLIGHT: Final = 64
RABBITMQ_SERVER: Final = shutil.which("rabbitmq-server") or "/usr/sbin/rabbitmq-server"
RABBITMQ_IN_FLIGHT: Final = 64
RABBITMQ_EXCHANGE: Final = "carillon-bench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- the brokers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Broker:
    """One broker kind: its private server, the task type's settings, how to count what
    landed, and the bare loop."""

    kind: HandlerKind
    label: str
    serve: Callable[[], Any]
    """A context manager: starts a private server, yields its URL, stops it."""
    settings: Callable[[str, str], dict[str, Any]]
    """(server URL, target name) -> the task type's settings."""
    landed: Callable[[str, str], tuple[int, int]]
    """(server URL, target name) -> (messages, distinct execution ids)."""
    bare: Callable[[str, str, int], float]
    """(server URL, target name, N) -> publishes/s of the bare loop."""
    in_flight: int


@contextmanager
def redis_serve() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="bench-brokers-redis-") as directory:
        port = free_port()
        process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis.from_url(url).ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise
                    time.sleep(0.05)
            yield url
        finally:
            process.terminate()
            process.wait(10)


def redis_settings(url: str, target: str) -> dict[str, Any]:
    return {"url": url, "stream": target}


def redis_landed(url: str, target: str) -> tuple[int, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(target)  # type: ignore[assignment]
    finally:
        client.close()
    return len(entries), len({fields["execution_id"] for _, fields in entries})


_PLANNED: Final = datetime.now(UTC)


def _context(execution_id: str) -> ExecutionContext:
    return ExecutionContext(
        execution_id=execution_id,
        schedule_id=execution_id,
        tenant_id="tenant-00",
        task_type=TASK_TYPE,
        planned_at=_PLANNED,
        attempt=1,
        fencing_token=1,
    )


async def _bare(publish: Callable[[str], Any], n: int, in_flight: int) -> float:
    """Publishes/s of ``publish`` with ``in_flight`` at once: N fresh ids after a warm-up."""

    async def worker(first: int, count: int, prefix: str) -> None:
        for index in range(first, first + count):
            await publish(f"{prefix}{index}")

    share = max(n // in_flight, 1)
    await asyncio.gather(*(worker(w, 1, "warm-") for w in range(in_flight)))
    started = time.perf_counter()
    await asyncio.gather(*(worker(w * share, share, "bare-") for w in range(in_flight)))
    return share * in_flight / (time.perf_counter() - started)


async def _redis_bare(url: str, target: str, n: int) -> float:
    """The handler's own connect and publish coroutines, on a plain uvloop loop."""
    handler = RedisHandler(redis_settings(url, target), options=HandlerOptions())
    client = await handler._connector(ipaddress.ip_address("127.0.0.1"))()
    try:
        return await _bare(lambda i: handler._op(_context(i))(client), n, MAX_CONNECTIONS_DEFAULT)
    finally:
        await client.aclose()


def redis_bare(url: str, target: str, n: int) -> float:
    return uvloop.run(_redis_bare(url, target, n))


@contextmanager
def nats_serve() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="bench-brokers-nats-") as directory:
        port = free_port()
        process = subprocess.Popen(
            [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", directory],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise
                    time.sleep(0.05)
            yield f"nats://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(10)


def _stream_of(target: str) -> str:
    return "BENCH_" + "".join(ch if ch.isalnum() else "_" for ch in target).upper()


async def _nats(url: str, action: Callable[[Any], Any]) -> Any:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        return await action(nc.jetstream())
    finally:
        await nc.close()


def nats_settings(url: str, target: str) -> dict[str, Any]:
    """A memory-stored stream of its own for ``target`` (the subject), created here."""
    subject = target.replace(":", ".")

    async def add(js: Any) -> None:
        await js.add_stream(name=_stream_of(target), subjects=[subject], storage="memory")

    uvloop.run(_nats(url, add))
    return {"url": url, "subject": subject}


def nats_landed(url: str, target: str) -> tuple[int, int]:
    async def read(js: Any) -> tuple[int, int]:
        info = await js.stream_info(_stream_of(target))
        ids = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages:
                message = await js.get_msg(_stream_of(target), seq)
                ids.append((message.headers or {}).get("Nats-Msg-Id"))
        return len(ids), len(set(ids))

    return uvloop.run(_nats(url, read))  # type: ignore[no-any-return]


async def _nats_bare(url: str, subject: str, n: int) -> float:
    """The handler's own connect and publish coroutines, on a plain uvloop loop."""
    handler = NatsHandler({"url": url, "subject": subject}, options=HandlerOptions())
    handler._window_checked = True  # the bare loop publishes only
    client = await handler._connector(ipaddress.ip_address("127.0.0.1"))()
    try:
        return await _bare(lambda i: handler._op(_context(i))(client), n, NATS_IN_FLIGHT)
    finally:
        await client.aclose()


def nats_bare(url: str, target: str, n: int) -> float:
    subject = nats_settings(url, target)["subject"]  # a stream of its own
    return uvloop.run(_nats_bare(url, subject, n))


@contextmanager
def rabbitmq_serve() -> Iterator[str]:
    """A private node (its own name, ports and data); the server drops to the rabbitmq
    user, so its directory is that user's."""
    directory = tempfile.mkdtemp(prefix="bench-brokers-rabbitmq-")
    port, dist_port = free_port(), free_port()
    (Path(directory) / "enabled_plugins").write_text("[].\n")
    shutil.chown(directory, user="rabbitmq")
    environment = {
        **os.environ,
        "RABBITMQ_NODENAME": f"carillon-bench-{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": f"{directory}/mnesia",
        "RABBITMQ_LOG_BASE": f"{directory}/log",
        "RABBITMQ_PID_FILE": f"{directory}/pid",
        "RABBITMQ_FEATURE_FLAGS_FILE": f"{directory}/feature_flags",
        "RABBITMQ_ENABLED_PLUGINS_FILE": f"{directory}/enabled_plugins",
        "RABBITMQ_CONFIG_FILE": f"{directory}/no-config",
        "RABBITMQ_ADVANCED_CONFIG_FILE": f"{directory}/no-advanced.config",
    }
    process = subprocess.Popen(
        [RABBITMQ_SERVER], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                uvloop.run(_rabbitmq(url, _nothing))
                break
            except Exception:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.25)
        yield url
    finally:
        pid_file = Path(directory) / "pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().strip()), 15)
        process.wait(60)
        shutil.rmtree(directory, ignore_errors=True)


async def _nothing(channel: Any) -> None:
    del channel


async def _rabbitmq(url: str, action: Callable[[Any], Any]) -> Any:
    connection = await aio_pika.connect(url, timeout=5)
    try:
        return await action(await connection.channel())
    finally:
        await connection.close()


def rabbitmq_settings(url: str, target: str) -> dict[str, Any]:
    """A non-durable queue of its own for ``target``, bound under that routing key."""

    async def declare(channel: Any) -> None:
        exchange = await channel.declare_exchange(RABBITMQ_EXCHANGE, "direct")
        queue = await channel.declare_queue(target)
        await queue.bind(exchange, target)

    uvloop.run(_rabbitmq(url, declare))
    return {"url": url, "exchange": RABBITMQ_EXCHANGE, "routing_key": target}


def rabbitmq_landed(url: str, target: str) -> tuple[int, int]:
    async def read(channel: Any) -> tuple[int, int]:
        queue = await channel.declare_queue(target, passive=True)
        count = queue.declaration_result.message_count
        ids: list[str] = []
        if count:
            await channel.set_qos(prefetch_count=1000)
            async with queue.iterator(no_ack=True) as messages:
                async for message in messages:
                    ids.append(message.message_id)
                    if len(ids) == count:
                        break
        return len(ids), len(set(ids))

    return uvloop.run(_rabbitmq(url, read))  # type: ignore[no-any-return]


async def _rabbitmq_bare(settings: dict[str, Any], n: int) -> float:
    """The handler's own connect and publish coroutines, on a plain uvloop loop."""
    handler = RabbitmqHandler(settings, options=HandlerOptions())
    client = await handler._connector(ipaddress.ip_address("127.0.0.1"))()
    try:
        return await _bare(lambda i: handler._op(_context(i))(client), n, RABBITMQ_IN_FLIGHT)
    finally:
        await client.aclose()


def rabbitmq_bare(url: str, target: str, n: int) -> float:
    settings = rabbitmq_settings(url, target)  # a queue of its own
    return uvloop.run(_rabbitmq_bare(settings, n))


BROKERS: Final = {
    "redis": Broker(
        HandlerKind.REDIS,
        "redis (XADD once per execution id)",
        redis_serve,
        redis_settings,
        redis_landed,
        redis_bare,
        MAX_CONNECTIONS_DEFAULT,
    ),
    "nats": Broker(
        HandlerKind.NATS,
        "nats (JetStream, Nats-Msg-Id)",
        nats_serve,
        nats_settings,
        nats_landed,
        nats_bare,
        NATS_IN_FLIGHT,
    ),
    "rabbitmq": Broker(
        HandlerKind.RABBITMQ,
        "rabbitmq (confirmed, persistent, message_id)",
        rabbitmq_serve,
        rabbitmq_settings,
        rabbitmq_landed,
        rabbitmq_bare,
        RABBITMQ_IN_FLIGHT,
    ),
}


# --- one burst -------------------------------------------------------------------------------


async def create_burst(
    url: str, n: int, kind: HandlerKind, settings: dict[str, Any], base_lead_s: float
) -> datetime:
    """Migrate; store the task type and N schedules due at one instant T; returns T."""
    await migrate_database(url, partitions=PARTITIONS_DEFAULT)
    async with open_postgres_ledger(url) as ledger:
        now = await ledger.database_now()
        lead = timedelta(seconds=base_lead_s + n / 5_000 + n / BURST_PLAN_RATE_PER_S_DEFAULT)
        burst_at = (now + lead).replace(microsecond=0)
        expr = f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"
        await ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name=TASK_TYPE,
                    kind=kind,
                    settings=settings,
                    allowed_tenants=("*",),
                )
            )
        )
        ids = schedule_ids(n)
        for first in range(0, n, CREATE_BATCH):
            batch = [
                Schedule(
                    schedule_id=sid,
                    tenant_id=tenant_of(sid),
                    cron_expr=expr,
                    timezone="UTC",
                    task_type=TASK_TYPE,
                    next_run_at=burst_at,
                )
                for sid in ids[first : first + CREATE_BATCH]
            ]
            await ledger.schedules_create(SchedulesCreate(batch))
    return burst_at


async def node_phase(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, Any]:
    config = NodeConfig(
        node_id=f"bench-brokers-{os.getpid()}",
        log_level=LogLevel.WARNING,
        broker_allow_cidrs=ALLOW,
        http="",
    )
    async with open_postgres_ledger(url) as ledger:
        node = Node(config, ledger, SystemClock(), random.Random(7))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await trio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
            polled = await trio.to_thread.run_sync(
                poll_until_succeeded, url, n, burst_at, timeout_s
            )
            nursery.cancel_scope.cancel()
    return polled


def one_burst(
    server_url: str,
    broker: Broker,
    broker_url: str,
    n: int,
    run_index: int,
    timeout_s: float,
    base_lead_s: float,
) -> dict[str, Any]:
    target = f"bench:{run_index}:{time.monotonic_ns()}"
    name, url = fresh_database(server_url, "carillon_brokers_")
    try:
        settings = broker.settings(broker_url, target)
        burst_at = trio.run(create_burst, url, n, broker.kind, settings, base_lead_s)
        result = trio.run(node_phase, url, n, burst_at, timeout_s)
        result |= uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
    finally:
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    messages, distinct = broker.landed(broker_url, target)
    bare_per_s = broker.bare(broker_url, target + ":bare", n)
    result |= {
        "publishes_per_s": result["executions_per_s"],
        "all_published_s": result["all_succeeded_s"],
        "messages": float(messages),
        "distinct_ids": float(distinct),
        "lost_or_repeated": float(abs(messages - n) + (messages - distinct)),
        "bare_per_s": bare_per_s,
        "ratio": result["executions_per_s"] / bare_per_s,
    }
    print(
        f"  {broker.kind}: {result['publishes_per_s']:,.0f} publishes/s, all published "
        f"{result['all_published_s']:.2f} s after T; {messages} messages, {distinct} distinct "
        f"ids; bare loop {bare_per_s:,.0f}/s; ratio {result['ratio']:.2f}",
        file=sys.stderr,
        flush=True,
    )
    return result


# --- the report ------------------------------------------------------------------------------

ROWS: Final = (
    ("publishes/s (N / T until the last publish succeeded)", "publishes_per_s", 0),
    ("T until all published (s)", "all_published_s", 2),
    ("share published (by the timeout)", "succeeded_share", 4),
    ("start delay p50 (s)", "delay_p50_s", 2),
    ("start delay p99 (s)", "delay_p99_s", 2),
    ("messages in the target", "messages", 0),
    ("distinct execution ids in the target", "distinct_ids", 0),
    ("ledger: duplicates (attempt > 1, extra rows, extra attempts)", "duplicates", 0),
    ("bare loop, the same client and publish (publishes/s)", "bare_per_s", 0),
    ("publishes/s / bare loop", "ratio", 2),
)


def _spread(samples: list[float], digits: int) -> str:
    median, low, high = summary(samples)
    if low == high:
        return f"{median:,.{digits}f}".replace("inf", "timeout")
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})".replace("inf", "timeout")


def report(
    args: argparse.Namespace,
    brokers: list[Broker],
    results: dict[str, list[dict[str, Any]]],
    elapsed_s: float,
) -> tuple[str, bool]:
    clean = all(
        run["duplicates"] == 0 and run["lost_or_repeated"] == 0 and run["succeeded_share"] == 1.0
        for runs in results.values()
        for run in runs
    )
    header = "| figure | " + " | ".join(b.label for b in brokers) + " |"
    lines = [
        "## Broker bursts (`benchmarks/bench_brokers.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.executions:,} executions over "
        f"{TENANTS} tenants all due at the same instant T, a fresh database per burst, "
        f"{PARTITIONS_DEFAULT} partitions; one node in-process at its **default settings** "
        f"({WORKERS_DEFAULT:,} workers; the task type's settings at theirs) plus "
        f"`--broker-allow-cidrs {ALLOW}` and no HTTP API ({args.runs} run"
        f"{'' if args.runs == 1 else 's'}, median (min-max)). Each broker is a private "
        "server started for the run, persistence off. The bare loop, right after each burst: "
        "the handler's own connect and publish coroutines (the same client, script and "
        "fields) on a plain uvloop loop, no trio, no engine, as many in flight as the "
        "handler's pool has connections, N fresh ids after a warm-up. PostgreSQL, the broker "
        f"and the node share the machine's cores; the whole run took {elapsed_s / 60:.1f} min.",
        "",
        header,
        "|---|" + "---|" * len(brokers),
    ]
    for title, key, digits in ROWS:
        cells = []
        for broker in brokers:
            samples = [run[key] for run in results[broker.kind] if key in run]
            cells.append(_spread(samples, digits) if samples else "-")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Nothing lost and nothing twice in every burst (the target's messages and distinct "
        f"ids, and the ledger): {'yes' if clean else '**no**'}.",
    ]
    return "\n".join(lines), clean


def save_results(
    args: argparse.Namespace, brokers: list[Broker], results: dict[str, list[dict[str, Any]]]
) -> None:
    figures: dict[str, list[float]] = {}
    for broker in brokers:
        for _, key, _ in ROWS:
            samples = [run[key] for run in results[broker.kind] if key in run]
            if samples:
                figures[f"{key}@{broker.kind}"] = samples
    context = {"executions": args.executions, "runs": args.runs, "brokers": args.brokers}
    write_results("bench_brokers", figures, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--no-docs", action="store_true", help="print only: no docs or JSON")
    parser.add_argument("--executions", type=int, default=EXECUTIONS_DEFAULT)
    parser.add_argument("--runs", type=int, default=3, help="bursts per broker")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="broker kinds to measure")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after T")
    args = parser.parse_args()
    base_lead_s = 8.0
    if args.quick:
        args.executions, args.runs, args.timeout, base_lead_s = 1_000, 1, 60.0, 3.0
    brokers = [BROKERS[name.strip()] for name in args.brokers.split(",") if name.strip()]
    results: dict[str, list[dict[str, Any]]] = {broker.kind: [] for broker in brokers}
    started = time.monotonic()
    with resolve_database() as database:
        for broker in brokers:
            with broker.serve() as broker_url:
                for run_index in range(args.runs):
                    results[broker.kind].append(
                        one_burst(
                            database.url,
                            broker,
                            broker_url,
                            args.executions,
                            run_index,
                            args.timeout,
                            base_lead_s,
                        )
                    )
    text, clean = report(args, brokers, results, time.monotonic() - started)
    print(text)
    if not (args.quick or args.no_docs):
        write_section("bench_brokers", text)
        save_results(args, brokers, results)
        write_targets()
    return 0 if clean else 1  # a slow run is a figure; a lost or repeated message is not


if __name__ == "__main__":
    raise SystemExit(main())
