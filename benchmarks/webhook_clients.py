"""Which HTTP client should deliver webhooks? Candidates against one local receiver, measured.

Each run starts a candidate in a fresh process that POSTs webhook-shaped requests (a ~300-byte
JSON body, the handler's headers, a unique ``Idempotency-Key``) to a receiver running in its
own process (``benchmarks/webhook_receiver.py``, uvloop), ``--concurrency`` requests in
flight, until ``--requests`` are answered or ``--budget-s`` has passed (the slow candidates
would otherwise take minutes). A warm-up of ``concurrency`` requests is not counted. Reported
per candidate and receiver latency: requests/s, the client process's CPU per request
(``time.process_time`` over the measured window, all its threads), and the ratio of its
requests/s to the receiver's *ceiling*: the best requests/s of the plain clients (no trio,
no bridge) at that latency. Figures are medians over ``--runs`` rounds; the candidates are
run one after another, their order reversed every other round, because the machine is
shared and noisy. The receiver checks that every request arrived once (unique keys).

Candidates (the trio ones run under ``trio.run``, as the engine does):

* ``httpx-new`` -- today's handler: a new ``httpx.AsyncClient`` (and TCP connection) per
  request.
* ``httpx-pool`` -- one shared ``httpx.AsyncClient`` with a keep-alive pool.
* ``aiohttp-bridge`` -- aiohttp on a uvloop thread, each request one hop through the
  database bridge's technique (``engine.ledger.bridge.open_bridge``, a second instance).
* ``h11-trio`` -- h11 on trio streams with a keep-alive pool of its own.
* ``webhook`` -- the engine's ``WebhookHandler`` with the shared client it now uses
  (``engine.handlers.http_client``): the whole delivery path, SSRF vetting, DNS cache and
  headers included.
* ceiling clients: ``aiohttp-plain`` (aiohttp on uvloop, no trio) and ``raw-uvloop`` (a
  minimal keep-alive ``asyncio.Protocol`` client on uvloop).

aiohttp is no dependency of Carillon: its candidates are skipped, saying so, unless it is
installed (``.venv/bin/pip install aiohttp``).

``--memory`` instead measures the resident memory per in-flight request of the ``webhook``
candidate: RSS with ``--memory-requests`` (5,000) requests in flight against a receiver
answering after 1 s, minus the RSS before, divided by the number in flight.

Usage: python benchmarks/webhook_clients.py [--quick] [--runs K] [--requests N]
       [--concurrency C] [--latencies 0,50] [--budget-s S] [--candidates a,b,...] [--memory]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.webhook_receiver import raise_fd_limit, start_receiver

TRIO_CANDIDATES = ("httpx-new", "httpx-pool", "aiohttp-bridge", "h11-trio", "webhook")
PLAIN_CANDIDATES = ("aiohttp-plain", "raw-uvloop")
CANDIDATES = TRIO_CANDIDATES + PLAIN_CANDIDATES

BODY = json.dumps(
    {
        "execution_id": "nightly.report:2026-03-08T07:00:00Z",
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": "2026-03-08T07:00:00Z",
        "attempt": 1,
        "fencing_token": 42,
        "payload": {"region": "eu", "n": 3, "note": "x" * 80},
    }
).encode()


def headers_for(key: str, host: str) -> dict[str, str]:
    return {
        "Host": host,
        "Content-Type": "application/json",
        "User-Agent": "carillon/bench",
        "Accept-Encoding": "identity",
        "Idempotency-Key": key,
        "X-Carillon-Execution-Id": key,
        "X-Carillon-Schedule-Id": "nightly.report",
        "X-Carillon-Planned-At": "2026-03-08T07:00:00Z",
        "X-Carillon-Attempt": "1",
        "X-Carillon-Fencing-Token": "42",
    }


# --- the worker side: one candidate in this process ---------------------------------------


@dataclass
class Job:
    url: str
    requests: int
    concurrency: int
    budget_s: float
    tag: str
    memory: bool = False


@dataclass
class Tally:
    next_index: int = 0
    done: int = 0
    errors: int = 0
    first_error: str = ""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _result(job: Job, tally: Tally, elapsed: float, cpu: float, **extra: Any) -> dict[str, Any]:
    return {
        "done": tally.done,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "elapsed_s": elapsed,
        "rate": tally.done / elapsed if elapsed else 0.0,
        "cpu_us": cpu / tally.done * 1e6 if tally.done else float("nan"),
        **extra,
    }


async def _trio_window(
    job: Job, post: Callable[[str], Awaitable[int]], count: int, tag: str
) -> tuple[Tally, float, float]:
    """``count`` requests, ``job.concurrency`` at a time, under trio; (tally, elapsed, cpu)."""
    import trio

    tally = Tally()
    deadline = time.perf_counter() + job.budget_s

    async def worker() -> None:
        while tally.next_index < count and time.perf_counter() < deadline:
            index = tally.next_index
            tally.next_index += 1
            try:
                status = await post(f"{tag}-{index}")
            except Exception as error:
                tally.errors += 1
                tally.first_error = tally.first_error or repr(error)
                continue
            if status == 200:
                tally.done += 1
            else:
                tally.errors += 1
                tally.first_error = tally.first_error or f"status {status}"

    cpu0, t0 = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(min(job.concurrency, count)):
            nursery.start_soon(worker)
    return tally, time.perf_counter() - t0, time.process_time() - cpu0


async def _asyncio_window(
    job: Job, post: Callable[[str], Awaitable[int]], count: int, tag: str
) -> tuple[Tally, float, float]:
    tally = Tally()
    deadline = time.perf_counter() + job.budget_s

    async def worker() -> None:
        while tally.next_index < count and time.perf_counter() < deadline:
            index = tally.next_index
            tally.next_index += 1
            try:
                status = await post(f"{tag}-{index}")
            except Exception as error:
                tally.errors += 1
                tally.first_error = tally.first_error or repr(error)
                continue
            if status == 200:
                tally.done += 1
            else:
                tally.errors += 1
                tally.first_error = tally.first_error or f"status {status}"

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(job.concurrency, count))))
    return tally, time.perf_counter() - t0, time.process_time() - cpu0


async def _trio_measure(job: Job, post: Callable[[str], Awaitable[int]]) -> dict[str, Any]:
    await _trio_window(job, post, job.concurrency, job.tag + "-warm")
    tally, elapsed, cpu = await _trio_window(job, post, job.requests, job.tag)
    return _result(job, tally, elapsed, cpu)


async def _asyncio_measure(job: Job, post: Callable[[str], Awaitable[int]]) -> dict[str, Any]:
    await _asyncio_window(job, post, job.concurrency, job.tag + "-warm")
    tally, elapsed, cpu = await _asyncio_window(job, post, job.requests, job.tag)
    return _result(job, tally, elapsed, cpu)


# (a) today's: a new client and connection per request


async def run_httpx_new(job: Job) -> dict[str, Any]:
    import httpx

    ssl_context = httpx.create_ssl_context(trust_env=True)
    parts = urlsplit(job.url)

    async def post(key: str) -> int:
        transport = httpx.AsyncHTTPTransport(
            verify=ssl_context,
            trust_env=False,
            retries=0,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0),
        )
        async with httpx.AsyncClient(
            transport=transport, follow_redirects=False, trust_env=False, timeout=30
        ) as client:
            response = await client.post(
                job.url, content=BODY, headers=headers_for(key, parts.netloc)
            )
            return response.status_code

    return await _trio_measure(job, post)


# (b) one shared httpx pool


async def run_httpx_pool(job: Job) -> dict[str, Any]:
    import httpx

    parts = urlsplit(job.url)
    limits = httpx.Limits(
        max_connections=job.concurrency, max_keepalive_connections=job.concurrency
    )
    async with httpx.AsyncClient(
        limits=limits, follow_redirects=False, trust_env=False, timeout=60
    ) as client:

        async def post(key: str) -> int:
            response = await client.post(
                job.url, content=BODY, headers=headers_for(key, parts.netloc)
            )
            return response.status_code

        return await _trio_measure(job, post)


# (c) aiohttp on a uvloop thread, reached through the database bridge's technique


async def run_aiohttp_bridge(job: Job) -> dict[str, Any]:
    import aiohttp

    from engine.ledger.bridge import open_bridge

    parts = urlsplit(job.url)
    async with open_bridge() as bridge:

        async def make() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(limit=job.concurrency, limit_per_host=0)
            return aiohttp.ClientSession(connector=connector, trust_env=False)

        session = await bridge.call(make)

        async def post_on_loop(key: str) -> int:
            async with session.post(
                job.url, data=BODY, headers=headers_for(key, parts.netloc), allow_redirects=False
            ) as response:
                await response.content.read(65536)
                return response.status

        async def post(key: str) -> int:
            return await bridge.call(post_on_loop, key)

        try:
            return await _trio_measure(job, post)
        finally:
            await bridge.call(session.close)


# (d) h11 on trio streams with a keep-alive pool


async def run_h11_trio(job: Job) -> dict[str, Any]:
    import h11
    import trio

    parts = urlsplit(job.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    idle: list[tuple[trio.SocketStream, h11.Connection]] = []
    slots = trio.Semaphore(job.concurrency)

    async def post(key: str) -> int:
        async with slots:
            if idle:
                stream, conn = idle.pop()
            else:
                stream = await trio.open_tcp_stream(host, port)
                conn = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method="POST",
                target=parts.path or "/",
                headers=[
                    *headers_for(key, parts.netloc).items(),
                    ("Content-Length", str(len(BODY))),
                ],
            )
            await stream.send_all(
                conn.send(request) + conn.send(h11.Data(data=BODY)) + conn.send(h11.EndOfMessage())
            )
            status = 0
            received = 0
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    received += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise RuntimeError(f"unexpected {event!r}")
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
                idle.append((stream, conn))
            else:
                await stream.aclose()
            return status

    try:
        return await _trio_measure(job, post)
    finally:
        for stream, _ in idle:
            await stream.aclose()


# the engine's handler with its shared client


async def run_webhook(job: Job) -> dict[str, Any]:
    import trio

    from engine.clock import SystemClock
    from engine.handlers import ExecutionContext, HandlerOptions
    from engine.handlers.http_client import WebhookClientConfig, open_webhook_client
    from engine.handlers.webhook import WebhookHandler

    options = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), webhook_timeout_s=60)
    config = WebhookClientConfig(
        connections_per_host=job.concurrency, connections_total=job.concurrency
    )
    from datetime import UTC, datetime

    planned = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)

    async with open_webhook_client(config) as client:
        handler = WebhookHandler(
            {"url": job.url}, options=options, clock=SystemClock(), client=client
        )

        async def post(key: str) -> int:
            context = ExecutionContext(
                execution_id=key,
                schedule_id="nightly.report",
                tenant_id="acme",
                task_type="report",
                planned_at=planned,
                attempt=1,
                fencing_token=42,
                payload={"region": "eu", "n": 3, "note": "x" * 80},
            )
            result = await handler.run(context)
            if result.error_code is not None:
                raise RuntimeError(f"{result.error_code}: {result.error_message}")
            return 200

        if not job.memory:
            return await _trio_measure(job, post)
        # Memory: everything in flight at once against a slow receiver.
        await _trio_window(job, post, min(job.concurrency, 200), job.tag + "-warm")
        import gc

        gc.collect()
        await trio.sleep(0.2)
        idle_rss = _rss_bytes()
        peak = idle_rss
        tally = Tally()

        async def one(index: int) -> None:
            try:
                await post(f"{job.tag}-mem-{index}")
                tally.done += 1
            except Exception as error:
                tally.errors += 1
                tally.first_error = tally.first_error or repr(error)

        async with trio.open_nursery() as nursery:
            for index in range(job.requests):
                nursery.start_soon(one, index)
            for _ in range(40):
                await trio.sleep(0.025)
                peak = max(peak, _rss_bytes())
        return {
            "done": tally.done,
            "errors": tally.errors,
            "first_error": tally.first_error,
            "idle_rss": idle_rss,
            "peak_rss": peak,
            "per_request_bytes": (peak - idle_rss) / job.requests,
        }


# ceilings: plain asyncio clients on uvloop


async def run_aiohttp_plain(job: Job) -> dict[str, Any]:
    import aiohttp

    parts = urlsplit(job.url)
    connector = aiohttp.TCPConnector(limit=job.concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:

        async def post(key: str) -> int:
            async with session.post(
                job.url, data=BODY, headers=headers_for(key, parts.netloc), allow_redirects=False
            ) as response:
                await response.content.read(65536)
                return response.status

        return await _asyncio_measure(job, post)


class _RawConnection(asyncio.Protocol):
    """One keep-alive connection answering one request at a time (Content-Length only)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self.buffer[: end + 4 + length]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))


async def run_raw_uvloop(job: Job) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    parts = urlsplit(job.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    idle: list[_RawConnection] = []

    async def post(key: str) -> int:
        if idle:
            conn = idle.pop()
        else:
            _, conn = await loop.create_connection(_RawConnection, host, port)
        head = "".join(
            f"{name}: {value}\r\n" for name, value in headers_for(key, parts.netloc).items()
        )
        conn.waiter = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(
            f"POST {parts.path} HTTP/1.1\r\n{head}Content-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY
        )
        status = await conn.waiter
        idle.append(conn)
        return status

    try:
        return await _asyncio_measure(job, post)
    finally:
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()


RUNNERS: dict[str, Callable[[Job], Awaitable[dict[str, Any]]]] = {
    "httpx-new": run_httpx_new,
    "httpx-pool": run_httpx_pool,
    "aiohttp-bridge": run_aiohttp_bridge,
    "h11-trio": run_h11_trio,
    "webhook": run_webhook,
    "aiohttp-plain": run_aiohttp_plain,
    "raw-uvloop": run_raw_uvloop,
}


def worker_main(candidate: str, job: Job) -> None:
    raise_fd_limit()
    runner = RUNNERS[candidate]
    if candidate in TRIO_CANDIDATES:
        import trio

        result = trio.run(runner, job)
    else:
        import uvloop

        result = uvloop.run(runner(job))
    print(json.dumps(result), flush=True)


# --- the orchestrating side ----------------------------------------------------------------


def run_candidate(candidate: str, job: Job, timeout_s: float) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        candidate,
        "--url",
        job.url,
        "--requests",
        str(job.requests),
        "--concurrency",
        str(job.concurrency),
        "--budget-s",
        str(job.budget_s),
        "--tag",
        job.tag,
    ] + (["--memory"] if job.memory else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{candidate} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 round, 2,000 requests, 200 in flight"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=1_000)
    parser.add_argument("--latencies", default="0,50", help="receiver latencies in ms")
    parser.add_argument("--budget-s", type=float, default=15.0)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--memory", action="store_true", help="memory per in-flight request")
    parser.add_argument("--memory-requests", type=int, default=5_000)
    parser.add_argument("--json", type=Path, help="also write the runs here")
    # worker mode (internal)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="run", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        job = Job(args.url, args.requests, args.concurrency, args.budget_s, args.tag, args.memory)
        worker_main(args.worker, job)
        return
    if args.quick:
        args.runs, args.requests, args.concurrency, args.budget_s = 1, 2_000, 200, 5.0
        args.memory_requests = min(args.memory_requests, 1_000)
    raise_fd_limit()
    if args.memory:
        memory(args.memory_requests)
        return
    candidates = [name.strip() for name in args.candidates.split(",") if name.strip()]
    unknown = set(candidates) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; choose from {', '.join(CANDIDATES)}")
    if importlib.util.find_spec("aiohttp") is None:
        skipped = [name for name in candidates if name.startswith("aiohttp")]
        if skipped:
            print(
                f"aiohttp is not installed: skipping {', '.join(skipped)} "
                "(pip install aiohttp to measure them)",
                file=sys.stderr,
            )
        candidates = [name for name in candidates if name not in skipped]
    latencies = [float(text) for text in args.latencies.split(",")]
    receiver = start_receiver()
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    try:
        for latency in latencies:
            receiver.set_latency(latency)
            for round_index in range(args.runs):
                order = candidates if round_index % 2 == 0 else candidates[::-1]
                for candidate in order:
                    tag = f"{candidate}-{latency:g}-{round_index}"
                    receiver.reset()
                    job = Job(
                        receiver.url("/hook"),
                        args.requests,
                        args.concurrency,
                        args.budget_s,
                        tag,
                    )
                    result = run_candidate(candidate, job, timeout_s=args.budget_s * 4 + 120)
                    seen = receiver.stats()
                    result["receiver"] = seen
                    runs.setdefault((candidate, latency), []).append(result)
                    print(
                        f"  {latency:>4g} ms  round {round_index + 1}  {candidate:<15} "
                        f"{result['rate']:>8.0f} req/s  {result['cpu_us']:>7.0f} µs CPU/req  "
                        f"done {result['done']} errors {result['errors']}  receiver: "
                        f"{seen['requests']} requests, {seen['unique_keys']} keys, "
                        f"{seen['connections']} connections",
                        file=sys.stderr,
                        flush=True,
                    )
                    if result["errors"]:
                        print(f"    first error: {result['first_error']}", file=sys.stderr)
    finally:
        receiver.stop()
    print_table(candidates, latencies, runs, args)
    if args.json:
        args.json.write_text(
            json.dumps(
                {f"{name}@{latency:g}ms": value for (name, latency), value in runs.items()},
                indent=1,
            )
        )


def print_table(
    candidates: list[str],
    latencies: list[float],
    runs: dict[tuple[str, float], list[dict[str, Any]]],
    args: argparse.Namespace,
) -> None:
    print(
        f"Webhook clients: {args.requests:,} requests (or {args.budget_s:g} s), "
        f"{args.concurrency:,} in flight, median of {args.runs} run(s)"
    )
    header = (
        f"{'latency':>7}  {'candidate':<15} {'req/s':>8} {'CPU µs/req':>11} "
        f"{'x ceiling':>9}  runs (req/s)"
    )
    print(header)
    print("-" * len(header))
    for latency in latencies:
        ceiling = max(
            (
                median([run["rate"] for run in runs[(name, latency)]])
                for name in PLAIN_CANDIDATES
                if (name, latency) in runs
            ),
            default=float("nan"),
        )
        for name in candidates:
            results = runs[(name, latency)]
            rate = median([run["rate"] for run in results])
            cpu = median([run["cpu_us"] for run in results])
            each = ", ".join(f"{run['rate']:.0f}" for run in results)
            print(
                f"{latency:>5g}ms  {name:<15} {rate:>8.0f} {cpu:>11.0f} "
                f"{rate / ceiling:>9.3f}  {each}"
            )
        print(f"{'':>7}  receiver ceiling (best plain client): {ceiling:.0f} req/s")


def memory(count: int) -> None:
    receiver = start_receiver(latency_ms=1000)
    try:
        job = Job(receiver.url("/hook"), count, count, 120.0, "memory", memory=True)
        result = run_candidate("webhook", job, timeout_s=180)
    finally:
        receiver.stop()
    print(
        f"webhook client, {count:,} requests in flight (receiver latency 1 s): "
        f"idle RSS {result['idle_rss'] / 2**20:.1f} MiB, peak {result['peak_rss'] / 2**20:.1f} "
        f"MiB, {result['per_request_bytes'] / 1024:.1f} KiB per in-flight request "
        f"({result['done']} done, {result['errors']} errors)"
    )


if __name__ == "__main__":
    main()
