"""HTTPS with the connection pinned to the vetted address: the TLS server name and the
certificate check still use the URL's host name (needs the ``openssl`` command)."""

from __future__ import annotations

import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind
from engine.handlers.webhook import WebhookHandler
from tests.handlers.conftest import Sink, make_clock, make_context

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def tls_sink(certificate: tuple[Path, Path]) -> Iterator[tuple[Sink, list[str | None]]]:
    server_names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    context.sni_callback = lambda _socket, name, _context: server_names.append(name)
    sink = Sink(tls=context)
    sink.start()
    try:
        yield sink, server_names
    finally:
        sink.stop()


class FixedResolver(trio.abc.HostnameResolver):
    """Every name resolves to 127.0.0.1."""

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    async def getnameinfo(self, sockaddr, flags):
        raise NotImplementedError


def handler_for(url: str, cert: Path) -> WebhookHandler:
    trusted = ssl.create_default_context(cafile=str(cert))
    trusted.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    options = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), webhook_timeout_s=5)
    return WebhookHandler({"url": url}, options=options, clock=make_clock(), ssl_context=trusted)


async def test_https_to_a_pinned_address_keeps_sni_and_host_for_the_name(
    tls_sink: tuple[Sink, list[str | None]], certificate: tuple[Path, Path]
) -> None:
    sink, server_names = tls_sink
    previous = trio.socket.set_custom_hostname_resolver(FixedResolver())
    try:
        result = await handler_for(sink.url(host="sink.test", scheme="https"), certificate[0]).run(
            make_context()
        )
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert result == HandlerResult.succeeded()
    assert server_names == ["sink.test"]
    assert sink.requests[0].headers["host"] == f"sink.test:{sink.port}"


async def test_a_certificate_for_another_name_is_refused(
    tls_sink: tuple[Sink, list[str | None]], certificate: tuple[Path, Path]
) -> None:
    sink, _ = tls_sink
    previous = trio.socket.set_custom_hostname_resolver(FixedResolver())
    try:
        result = await handler_for(sink.url(host="other.test", scheme="https"), certificate[0]).run(
            make_context()
        )
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "connect_error")
    assert result.error_message is not None
    assert "not valid for 'other.test'" in result.error_message
    assert sink.requests == []
