"""Connections to PostgreSQL: how they are opened, set up, pooled, and how their failures read.

Everything here runs on the bridge's event loop (asyncio). Invariants:

* A connection carries no session state beyond its startup parameters (statement timeout,
  application name) and its type codecs, so the pool may skip asyncpg's per-release reset
  query (``docs/ledger.md``: it halves the cost of a pooled call). asyncpg still rolls back
  a transaction left open by a cancelled coroutine before the connection is reused.
  LISTEN and session advisory locks therefore never happen on pooled connections: the change
  listener and ``carillon migrate`` use connections of their own.
* Failures of the database *as a service* (unreachable, restarting, terminated, too slow)
  become :class:`~engine.errors.LedgerUnavailable` with the driver's error chained; a missing
  schema becomes :class:`~engine.errors.ConfigError`; bugs (a SQL error, a violated
  constraint) propagate unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Final

import asyncpg
import msgspec

from engine.errors import ConfigError, LedgerUnavailable
from engine.ledger.database import ResolvedDatabase, validate_database_url

CONNECT_TIMEOUT_S: Final = 10.0
"""How long opening one connection (TCP, TLS, login) may take."""
COMMAND_MARGIN_S: Final = 5.0
"""Client-side timeout beyond the server's statement timeout: catches a silent network."""
APPLICATION_NAME: Final = "carillon"

_JSONB_VERSION: Final = b"\x01"

# The server-side causes that mean "the database is not available right now".
_UNAVAILABLE: Final = (
    asyncpg.PostgresConnectionError,  # class 08: connection failure, does not exist
    asyncpg.OperatorInterventionError,  # class 57: canceled, admin/crash shutdown, starting
    asyncpg.InsufficientResourcesError,  # class 53: too many connections, disk full
    asyncpg.InterfaceError,  # connection closed under the call, pool closing
    # A server that terminates an idle connection sends FATAL before closing the socket; a
    # call that takes the connection in between finds its protocol in an error state.
    asyncpg.InternalClientError,
    asyncio.TimeoutError,  # client-side command, connect or acquire timeout
    OSError,  # refused, unreachable, reset
)

_CONFIGURATION: Final = (
    asyncpg.InvalidCatalogNameError,  # the database does not exist
    asyncpg.InvalidAuthorizationSpecificationError,  # unknown role, pg_hba refusal
    asyncpg.InvalidPasswordError,
    asyncpg.ClientConfigurationError,
)


def _encode_jsonb(value: Any) -> bytes:
    return _JSONB_VERSION + msgspec.json.encode(value)


def _decode_jsonb(data: bytes) -> Any:
    return msgspec.json.decode(data[1:])


async def init_connection(connection: asyncpg.Connection) -> None:
    """Per-connection setup: ``jsonb`` in the binary format, encoded with msgspec."""
    await connection.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        format="binary",
    )


async def _no_reset(connection: asyncpg.Connection) -> None:
    """Pool release hook: nothing to reset (see the module docstring)."""


def connect_options(statement_timeout_s: float | None) -> dict[str, Any]:
    """asyncpg keyword arguments shared by pooled and dedicated connections."""
    settings = {"application_name": APPLICATION_NAME}
    options: dict[str, Any] = {"timeout": CONNECT_TIMEOUT_S, "server_settings": settings}
    if statement_timeout_s is not None:
        settings["statement_timeout"] = str(max(1, round(statement_timeout_s * 1000)))
        options["command_timeout"] = statement_timeout_s + COMMAND_MARGIN_S
    return options


async def connect(url: str, *, statement_timeout_s: float | None = None) -> asyncpg.Connection:
    """One dedicated connection with the ledger's codecs (caller closes it)."""
    with translate_errors(url):
        connection = await asyncpg.connect(
            validate_database_url(url), **connect_options(statement_timeout_s)
        )
        try:
            await init_connection(connection)
        except BaseException:
            connection.terminate()
            raise
        return connection


async def create_pool(url: str, *, pool_max: int, statement_timeout_s: float) -> asyncpg.Pool:
    """A pool of up to ``pool_max`` connections; one is opened now to fail early."""
    with translate_errors(url):
        pool: asyncpg.Pool = await asyncpg.create_pool(
            validate_database_url(url),
            min_size=1,
            max_size=pool_max,
            init=init_connection,
            reset=_no_reset,
            **connect_options(statement_timeout_s),
        )
        return pool


def is_unavailable(error: BaseException) -> bool:
    """Whether ``error`` means the database cannot be used right now."""
    return isinstance(error, _UNAVAILABLE)


@contextlib.contextmanager
def translate_errors(url: str | None = None) -> Iterator[None]:
    """Turn driver failures into Carillon's errors, chaining the cause."""
    try:
        yield
    except _CONFIGURATION as exc:
        where = f" at {_redact(url)}" if url else ""
        raise ConfigError(f"cannot use the database{where}: {exc}") from exc
    except asyncpg.UndefinedTableError as exc:
        raise ConfigError(
            f"the Carillon schema is missing ({exc}); run `carillon migrate` first"
        ) from exc
    except asyncpg.DataError:
        raise  # a value the driver cannot encode: a bug, not an outage
    except asyncpg.QueryCanceledError as exc:
        raise LedgerUnavailable(f"the database timed out: {exc}") from exc
    except asyncpg.ReadOnlySQLTransactionError as exc:
        # A hot standby (another region's replica, not yet promoted) takes reads only: this
        # node waits, as for an outage, until it is promoted.
        where = f" at {_redact(url)}" if url else ""
        raise LedgerUnavailable(f"the database{where} is read-only (a standby?): {exc}") from exc
    except _UNAVAILABLE as exc:
        where = f" at {_redact(url)}" if url else ""
        reason = str(exc) or type(exc).__name__
        raise LedgerUnavailable(f"the database{where} is unavailable: {reason}") from exc


def _redact(url: str) -> str:
    return ResolvedDatabase(url, "env").redacted_url
