"""The HTTP client behind every command that speaks to the API, and how its failures read.

**Where and who.** The API is at ``--url``, else ``$CARILLON_URL``, else
:data:`URL_DEFAULT` (a node started with ``carillon run`` on this machine). The bearer token
is ``--token``, else the file ``--token-file`` names, else ``$CARILLON_TOKEN``, else the file
``$CARILLON_TOKEN_FILE`` names (``carillon token create --save PATH`` writes such a file). The
token travels only in the ``Authorization`` header: no message, table or error ever shows it.

**Failures.** Each ends the command with one ``carillon: error: ...`` line
(:class:`CommandFailed`) and an exit code:

* an error answer (RFC 9457 problem) reads as its ``detail``; exit 2 when the request itself
  was wrong (:data:`USAGE_STATUSES`: 400, 413, 422), else 1 (401, 403, 404, 409, 412, 5xx);
* 429 is retried once after its ``Retry-After`` (when that is at most
  :data:`RETRY_AFTER_S_MAX`), then fails with the problem's detail. Only 429 is retried: the
  API refuses it before doing anything, whereas after a 503 or a timeout a write may have
  happened (a ``trigger`` would run twice);
* a refused connection, a timeout (:data:`TIMEOUT_S_DEFAULT`, ``--api-timeout``) or a broken
  exchange: exit 1, naming the URL and what to check;
* no token, a malformed token or URL: exit 2, saying how to get or fix it.

``--output json`` prints the API's answer exactly as received (one JSON document a line),
for scripts; ``table`` (the default) is for people.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import httpx

from engine import __version__
from engine.errors import CarillonError

URL_ENV: Final = "CARILLON_URL"
TOKEN_ENV: Final = "CARILLON_TOKEN"
TOKEN_FILE_ENV: Final = "CARILLON_TOKEN_FILE"
URL_DEFAULT: Final = "http://127.0.0.1:8080"
TIMEOUT_S_DEFAULT: Final = 30.0
TIMEOUT_S_MAX: Final = 3600.0
RETRY_AFTER_S_MAX: Final = 60
"""Longest ``Retry-After`` the client waits out before its one retry; longer ones fail now."""
USAGE_STATUSES: Final = frozenset({400, 413, 422})
"""Answers that mean the command line asked for something invalid: exit code 2."""
TOKEN_CHARS_MAX: Final = 256
TOKEN_FILE_BYTES_MAX: Final = 4096
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
OUTPUTS: Final = ("table", "json")
HOW_TO_GET_A_TOKEN: Final = (
    f"pass --token or set {TOKEN_ENV}; an operator with database access creates one with "
    "`carillon token create --admin` (or `--tenant ID`)"
)

sleep: Callable[[float], None] = time.sleep
"""How the client waits out a ``Retry-After`` (tests replace it)."""


class CommandFailed(CarillonError):
    """A command that cannot complete: its one-line message and exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


class ApiProblem(CommandFailed):
    """The API answered with an error (a problem document, or something else)."""

    def __init__(self, status: int, slug: str, detail: str, errors: tuple[str, ...] = ()) -> None:
        code = EXIT_USAGE if status in USAGE_STATUSES else EXIT_FAILURE
        super().__init__(detail, code)
        self.status = status
        self.slug = slug
        """The problem type without its ``urn:carillon:problem:`` prefix (``not-found``)."""
        self.errors = errors
        """Every problem the answer listed (the message quotes the first three)."""


# --- where and who ---------------------------------------------------------------------------


def add_client_arguments(
    parser: argparse.ArgumentParser, *, output: bool = True, url_flag: bool = True
) -> None:
    """The options of every API command: ``--url`` (also ``--api-url``; only the latter when
    ``url_flag`` is false, for ``task-type set`` whose ``--url`` is a webhook's), ``--token``,
    ``--token-file``, ``--api-timeout`` and (unless ``output`` is false) ``--output``."""
    parser.set_defaults(speaks_api=True)
    group = parser.add_argument_group("API connection")
    group.add_argument(
        *(("--url", "--api-url") if url_flag else ("--api-url",)),
        dest="api_url",
        metavar="URL",
        help=f"the Carillon API (default: ${URL_ENV}, else {URL_DEFAULT})",
    )
    group.add_argument(
        "--token", metavar="TOKEN", help=f"API token (default: ${TOKEN_ENV}; never printed)"
    )
    group.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"read the token from this file (default: ${TOKEN_FILE_ENV})",
    )
    group.add_argument(
        "--api-timeout",
        dest="api_timeout",
        type=float,
        default=TIMEOUT_S_DEFAULT,
        metavar="S",
        help=f"seconds to wait for each answer [{TIMEOUT_S_DEFAULT:g}]",
    )
    if output:
        add_output_argument(parser)


def add_output_argument(
    parser: argparse.ArgumentParser, json_is: str = "the API's JSON as received"
) -> None:
    parser.add_argument(
        "--output",
        "-o",
        choices=OUTPUTS,
        default="table",
        help=f"table for people [default], json for scripts ({json_is})",
    )
    parser.add_argument(  # the pre-API spelling, kept so that scripts keep working
        "--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS
    )


@dataclass(frozen=True)
class Target:
    """Where the API is and the token to present (``None``: none was given)."""

    url: str
    token: str | None
    timeout_s: float


def target_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Target:
    """The URL, token and timeout ``args`` and the environment choose; ``CommandFailed``
    (exit 2) for a malformed URL, token or timeout."""
    env = os.environ if env is None else env
    if args.api_url is not None:
        url, url_origin = args.api_url, "--url"
    elif env.get(URL_ENV):
        url, url_origin = env[URL_ENV], URL_ENV
    else:
        url, url_origin = URL_DEFAULT, "the default URL"
    if not 0 < args.api_timeout <= TIMEOUT_S_MAX:
        raise CommandFailed(
            f"--api-timeout must be more than 0 and at most {TIMEOUT_S_MAX:g} seconds", EXIT_USAGE
        )
    return Target(_checked_url(url, url_origin), _token(args, env), args.api_timeout)


def _checked_url(url: str, origin: str) -> str:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise CommandFailed(
            f"{origin} {url!r} is not an http(s) URL such as {URL_DEFAULT}", EXIT_USAGE
        )
    return url.rstrip("/")


def _token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.token is not None:
        return _checked_token(args.token, "--token")
    if args.token_file is not None:
        return _token_from_file(args.token_file, "--token-file")
    if env.get(TOKEN_ENV):
        return _checked_token(env[TOKEN_ENV], TOKEN_ENV)
    if env.get(TOKEN_FILE_ENV):
        return _token_from_file(Path(env[TOKEN_FILE_ENV]), TOKEN_FILE_ENV)
    return None


def _token_from_file(path: Path, origin: str) -> str:
    try:
        with path.open("rb") as file:
            raw = file.read(TOKEN_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise CommandFailed(
            f"{origin}: cannot read {path}: {exc.strerror or exc}", EXIT_USAGE
        ) from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        text = "\x00"  # not a token; refused below without echoing it
    return _checked_token(text, f"{origin} {path}")


def _checked_token(token: str, origin: str) -> str:
    token = token.strip()
    if not token or len(token) > TOKEN_CHARS_MAX or not token.isascii():
        raise CommandFailed(f"the token from {origin} is malformed", EXIT_USAGE)
    if not token.isprintable() or any(char.isspace() for char in token):
        raise CommandFailed(f"the token from {origin} is malformed", EXIT_USAGE)
    return token


def segment(value: str) -> str:
    """``value`` as one URL path segment (execution ids hold ``:``)."""
    return quote(value, safe="")


# --- the client ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A successful answer: its status, raw body and headers."""

    status: int
    text: str
    headers: httpx.Headers

    def json(self) -> Any:
        return json.loads(self.text) if self.text else None


class ApiClient:
    """A synchronous client of one Carillon API; use it as a context manager."""

    def __init__(self, target: Target, *, transport: httpx.BaseTransport | None = None) -> None:
        self.target = target
        headers = {"User-Agent": f"carillon-cli/{__version__}", "Accept": "application/json"}
        if target.token is not None:
            headers["Authorization"] = f"Bearer {target.token}"
        self._http = httpx.Client(
            base_url=target.url,
            headers=headers,
            timeout=httpx.Timeout(target.timeout_s),
            follow_redirects=False,
            transport=transport,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        if_match: int | None = None,
    ) -> Answer:
        """Send one request (``query`` values ``None`` are left out); the answer if it is a
        success, else :class:`ApiProblem` or :class:`CommandFailed`."""
        params = {
            name: _query_value(value) for name, value in (query or {}).items() if value is not None
        }
        headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
        content = None if body is None else json.dumps(body).encode()
        if content is not None:
            headers["Content-Type"] = "application/json"
        response = self._send(method, path, params, headers, content)
        if response.status_code == 429:
            wait_s = _retry_after_s(response)
            if wait_s is not None and wait_s <= RETRY_AFTER_S_MAX:
                sleep(wait_s)
                response = self._send(method, path, params, headers, content)
        if response.status_code >= 400:
            raise self._problem(response)
        if response.status_code >= 300:
            raise CommandFailed(
                f"the Carillon API at {self.target.url} answered {response.status_code} "
                f"{response.reason_phrase}: is {URL_ENV} the API's own address?"
            )
        return Answer(response.status_code, response.text, response.headers)

    def call_json(self, method: str, path: str, **options: Any) -> Any:
        """:meth:`call`, its body decoded; ``CommandFailed`` if it is not JSON."""
        answer = self.call(method, path, **options)
        try:
            return answer.json()
        except ValueError:
            raise self._not_carillon() from None

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        headers: dict[str, str],
        content: bytes | None,
    ) -> httpx.Response:
        url = self.target.url
        try:
            return self._http.request(method, path, params=params, headers=headers, content=content)
        except httpx.ConnectError:
            raise CommandFailed(
                f"cannot reach the Carillon API at {url}: is a node running (`carillon run`)? "
                f"set {URL_ENV} (or --url) to its address"
            ) from None
        except httpx.TimeoutException:
            raise CommandFailed(
                f"the Carillon API at {url} did not answer within {self.target.timeout_s:g} s "
                "(--api-timeout); it may still have done what was asked"
            ) from None
        except httpx.HTTPError as exc:
            raise CommandFailed(
                f"talking to the Carillon API at {url} failed: {type(exc).__name__}: {exc}"
            ) from None

    def _problem(self, response: httpx.Response) -> CommandFailed:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("detail"), str):
            return ApiProblem(
                response.status_code,
                "http-error",
                f"the Carillon API at {self.target.url} answered {response.status_code} "
                f"{response.reason_phrase}",
            )
        detail: str = body["detail"]
        errors = body.get("errors")
        listed = tuple(str(error) for error in errors) if isinstance(errors, list) else ()
        if isinstance(errors, list) and errors:
            detail += ": " + "; ".join(str(error) for error in errors[:3])
            if len(errors) > 3:
                detail += f"; and {len(errors) - 3} more"
        if response.status_code == 401:
            detail += f" ({HOW_TO_GET_A_TOKEN})"
        slug = str(body.get("type", "")).rpartition(":")[2]
        return ApiProblem(response.status_code, slug, detail, listed)

    def _not_carillon(self) -> CommandFailed:
        return CommandFailed(
            f"the answer from {self.target.url} is not JSON: is {URL_ENV} the address of a "
            "Carillon API?"
        )


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _retry_after_s(response: httpx.Response) -> int | None:
    text = response.headers.get("retry-after", "").strip()
    return int(text) if text.isdigit() else None


def open_client(args: argparse.Namespace) -> ApiClient:
    """A client for ``args`` (see :func:`target_from_args`); ``CommandFailed`` (exit 2) when
    no token was given."""
    target = target_from_args(args)
    if target.token is None:
        raise CommandFailed(f"no API token: {HOW_TO_GET_A_TOKEN}", EXIT_USAGE)
    return ApiClient(target)


def emit(args: argparse.Namespace, answer: Answer, render: Callable[[Any], None]) -> None:
    """Print ``answer``: as received with ``--output json``, else through ``render``."""
    if args.output == "json":
        print(answer.text)
    else:
        render(answer.json())
