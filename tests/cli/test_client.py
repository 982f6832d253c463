"""How the CLI finds the API, presents its token, and reports what went wrong."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from engine import __version__
from engine.cli import client
from engine.cli.client import ApiClient, ApiProblem, CommandFailed, Target, target_from_args
from engine.ledger.memory import MemoryLedger
from engine.testing import ManualClock
from tests.cli.conftest import START, Api
from tests.cli.harness import Cli, create_token, serving
from tests.ledger.backends import put_noop_task_type


async def test_without_a_token_it_says_how_to_get_one_and_sends_nothing(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1")
    result = await cli("schedule", "list")
    assert (result.code, result.out) == (2, "")
    assert result.err == (
        "carillon: error: no API token: pass --token or set CARILLON_TOKEN; an operator with "
        "database access creates one with `carillon token create --admin` (or `--tenant ID`)\n"
    )


async def test_an_unreachable_api_names_the_url_and_what_to_check(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARILLON_TOKEN", "crl_x_y")
    result = await cli("schedule", "list", "--url", "http://127.0.0.1:1")
    assert (result.code, result.out) == (1, "")
    assert result.err == (
        "carillon: error: cannot reach the Carillon API at http://127.0.0.1:1: is a node "
        "running (`carillon run`)? set CARILLON_URL (or --url) to its address\n"
    )
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1/")
    result = await cli("cluster")
    assert "cannot reach the Carillon API at http://127.0.0.1:1:" in result.err


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://example.com", "http://", "::"])
async def test_a_malformed_url_is_exit_2(cli: Cli, url: str) -> None:
    result = await cli("schedule", "list", "--url", url, "--token", "crl_x_y")
    assert result.code == 2
    assert result.err == (
        f"carillon: error: --url {url!r} is not an http(s) URL such as http://127.0.0.1:8080\n"
    )


async def test_a_refused_token_is_exit_1_and_never_printed(api: Api, cli: Cli) -> None:
    forged = "crl_000000000000_" + "A" * 32
    result = await cli("schedule", "list", "--token", forged)
    assert (result.code, result.out) == (1, "")
    assert result.err.startswith("carillon: error: the token is not valid (pass --token")
    assert forged not in result.err


async def test_the_token_comes_from_a_flag_a_file_or_the_environment(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CARILLON_TOKEN")
    saved = tmp_path / "token"
    saved.write_text(api.admin_token + "\n")
    result = await cli("schedule", "list", "--token-file", str(saved))
    assert (result.code, result.out) == (0, "no schedules match\n")
    monkeypatch.setenv("CARILLON_TOKEN_FILE", str(saved))
    assert (await cli("schedule", "list")).code == 0
    result = await cli("schedule", "list", "--token-file", str(tmp_path / "missing"))
    assert result.code == 2
    assert f"--token-file: cannot read {tmp_path / 'missing'}: No such file" in result.err
    saved.write_bytes(b"crl_one two\n")
    result = await cli("schedule", "list")
    assert (result.code, result.err) == (
        2,
        f"carillon: error: the token from CARILLON_TOKEN_FILE {saved} is malformed\n",
    )
    assert "two" not in result.err
    result = await cli("schedule", "list", "--token", api.admin_token)  # the flag wins
    assert result.code == 0


async def test_429_is_retried_once_after_retry_after_then_fails_with_the_detail(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=8)
    await put_noop_task_type(ledger)
    waits: list[float] = []

    def wait_and_refill(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    monkeypatch.setattr(client, "sleep", wait_and_refill)
    async with serving(ledger, clock.monotonic, token_rate_per_s=1.0, token_burst=1) as (url, _):
        monkeypatch.setenv("CARILLON_URL", url)
        monkeypatch.setenv("CARILLON_TOKEN", await create_token(ledger))
        assert (await cli("schedule", "list")).code == 0  # takes the only request in the bucket
        result = await cli("schedule", "list")  # refused, waits 1 s (the clock), retried: fine
        assert (result.code, result.out) == (0, "no schedules match\n")
        assert waits == [1]
        monkeypatch.setattr(client, "sleep", waits.append)  # waiting does not refill it now
        result = await cli("schedule", "list")
        assert (result.code, result.out) == (1, "")
        assert result.err == (
            "carillon: error: this token's requests are limited to 1/s with a burst of 1; "
            "that rate is exhausted; retry in 1 s\n"
        )
        assert waits == [1, 1]


def fake_api(answer: Callable[[httpx.Request], httpx.Response]) -> ApiClient:
    target = Target("http://api.test", "crl_secret_token", 30.0)
    return ApiClient(target, transport=httpx.MockTransport(answer))


def test_a_timeout_says_the_request_may_have_happened() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(CommandFailed) as raised, fake_api(hang) as api:
        api.call("POST", "/v1/schedules/s:trigger", body={})
    assert raised.value.exit_code == 1
    assert str(raised.value) == (
        "the Carillon API at http://api.test did not answer within 30 s (--api-timeout); it "
        "may still have done what was asked"
    )


def test_answers_that_are_not_problems_name_the_status() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>bad gateway</html>")

    with pytest.raises(ApiProblem) as raised, fake_api(gateway) as api:
        api.call("GET", "/v1/cluster")
    assert (raised.value.status, raised.value.exit_code) == (502, 1)
    assert str(raised.value) == "the Carillon API at http://api.test answered 502 Bad Gateway"

    def moved(request: httpx.Request) -> httpx.Response:
        return httpx.Response(301, headers={"Location": "https://elsewhere/"})

    with (
        pytest.raises(CommandFailed, match="answered 301 Moved Permanently"),
        fake_api(moved) as api,
    ):
        api.call("GET", "/v1/cluster")

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>")

    with pytest.raises(CommandFailed, match="is not JSON"), fake_api(html) as api:
        api.call_json("GET", "/v1/cluster")


def test_a_problem_reads_as_its_detail_with_its_errors_and_the_exit_code_of_its_status() -> None:
    def problem(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer crl_secret_token"
        assert request.headers["if-match"] == '"3"'
        assert json.loads(request.content) == {"cron_expr": "x"}
        body = {"type": "urn:carillon:problem:invalid-field", "title": "A field is invalid",
                "status": 422, "detail": "2 of 5 schedules are invalid",
                "errors": ["schedules[0]: a", "schedules[1]: b\nc"]}  # fmt: skip
        return httpx.Response(422, json=body, headers={"content-type": "application/problem+json"})

    with pytest.raises(ApiProblem) as raised, fake_api(problem) as api:
        api.call("PATCH", "/v1/schedules/s", body={"cron_expr": "x"}, if_match=3)
    assert (raised.value.status, raised.value.slug, raised.value.exit_code) == (
        422,
        "invalid-field",
        2,
    )
    assert str(raised.value) == "2 of 5 schedules are invalid: schedules[0]: a; schedules[1]: b c"


def test_the_url_comes_from_the_flag_then_the_environment_then_the_default() -> None:
    args = argparse.Namespace(api_url=None, token=None, token_file=None, api_timeout=30.0)
    assert target_from_args(args, {}) == Target("http://127.0.0.1:8080", None, 30.0)
    env = {"CARILLON_URL": "https://carillon.example.com/api/", "CARILLON_TOKEN": " crl_a_b\n"}
    assert target_from_args(args, env) == Target(
        "https://carillon.example.com/api", "crl_a_b", 30.0
    )
    args.api_url = "http://10.0.0.1:8080"
    assert target_from_args(args, env).url == "http://10.0.0.1:8080"
    args.api_timeout = 0.0
    with pytest.raises(CommandFailed, match="--api-timeout must be more than 0"):
        target_from_args(args, env)


async def test_the_old_json_flag_is_output_json(api: Api, cli: Cli) -> None:
    result = await cli("schedule", "list", "--json")
    assert json.loads(result.out) == {"items": [], "next_cursor": None}


class _NotCarillon(http.server.BaseHTTPRequestHandler):
    """Another JSON service: answers ``{"hello": "world"}`` to everything."""

    def do_GET(self) -> None:
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_a_success_of_another_shape_is_one_line_not_a_traceback(cli: Cli) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotCarillon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = await cli("schedule", "list", "--url", url, "--token", "crl_x_y")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert (result.code, result.out) == (1, "")
    assert result.err == (
        "carillon: error: unexpected answer from the API (KeyError: 'items'); is CARILLON_URL "
        f"a Carillon API of this version ({__version__})?\n"
    )
