"""The SSRF guard: which addresses a webhook may reach.

Whoever can create a task type chooses a URL the node will POST to from inside the network.
Without a guard that URL could be the cloud metadata service (``169.254.169.254``), the
database on ``127.0.0.1``, or any internal service. So a webhook may only reach globally
routable unicast addresses, unless the node's allow-list (``--webhook-allow-cidr``) says
otherwise.

Rules, in order:

1. An address inside an allow-listed network is allowed (an IPv6 address embedding an IPv4
   one is also allowed when the embedded address is).
2. An IPv6 address that embeds an IPv4 address — IPv4-mapped ``::ffff:a.b.c.d``,
   IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16`` — is judged by
   the IPv4 address it reaches.
3. An address in a special-purpose range (:data:`_REFUSED_V4`, :data:`_REFUSED_V6`) is
   refused, naming the range's class; so is any IPv6 address outside global unicast
   ``2000::/3``.

The message-broker kinds (:mod:`engine.handlers.redis_stream`) go through the same guard, with
their own allow-list (``--broker-allow-cidrs``).

The guard is applied to *every* address a host resolves to (one bad record refuses the
host), and the webhook handler then connects to one of exactly those vetted addresses, so a
second, different DNS answer at connect time (DNS rebinding) cannot redirect it. The webhook
client (:mod:`engine.handlers.http_client`) caches answers for a few seconds and vets the
cached answer again on every delivery; its pooled connections are keyed by the vetted
address, so a connection is only ever reused for an address that passed the guard.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ADDRESSES_MAX: Final = 8
"""Most resolved addresses vetted and tried for one host."""

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

_METADATA: Final = ipaddress.IPv4Address("169.254.169.254")

_REFUSED_V4: Final[tuple[tuple[ipaddress.IPv4Network, str], ...]] = (
    (_V4("0.0.0.0/8"), "unspecified ('this network')"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "reserved (IETF protocol assignments)"),
    (_V4("192.0.2.0/24"), "reserved (documentation)"),
    (_V4("192.88.99.0/24"), "reserved (6to4 relay anycast)"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "reserved (benchmarking)"),
    (_V4("198.51.100.0/24"), "reserved (documentation)"),
    (_V4("203.0.113.0/24"), "reserved (documentation)"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved (incl. broadcast)"),
)

_REFUSED_V6: Final[tuple[tuple[ipaddress.IPv6Network, str], ...]] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("64:ff9b:1::/48"), "private (local-use NAT64)"),
    (_V6("100::/64"), "reserved (discard-only)"),
    (_V6("2001::/23"), "reserved (IETF protocol assignments, incl. Teredo)"),
    (_V6("2001:db8::/32"), "reserved (documentation)"),
    (_V6("3fff::/20"), "reserved (documentation)"),
    (_V6("5f00::/16"), "reserved (SRv6 SIDs)"),
    (_V6("fc00::/7"), "unique local (private)"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)
_GLOBAL_UNICAST_V6: Final = _V6("2000::/3")
_COMPATIBLE_V6: Final = _V6("::/96")
_NAT64_V6: Final = _V6("64:ff9b::/96")


class AddressRefused(Exception):
    """A host resolved to an address the guard refuses; the message names its class."""


def parse_allow_list(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """The allow-list as networks (host bits ignored: ``127.0.0.1/8`` means ``127.0.0.0/8``)."""
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches through mapping, compatibility, NAT64 or 6to4."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64_V6 or (address in _COMPATIBLE_V6 and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal_reason(address: IPAddress) -> str | None:
    """Why the guard refuses ``address`` (its class, e.g. ``"loopback"``), or ``None``.

    Ignores any allow-list: see :func:`check_address`.
    """
    inner = embedded_ipv4(address)
    if inner is not None:
        reason = refusal_reason(inner)
        return None if reason is None else f"{reason} (embedded in IPv6 {address})"
    if isinstance(address, ipaddress.IPv4Address):
        for network, reason in _REFUSED_V4:
            if address in network:
                if address == _METADATA:
                    return "link-local (cloud metadata service)"
                return reason
        return None
    for network6, reason in _REFUSED_V6:
        if address in network6:
            return reason
    if address not in _GLOBAL_UNICAST_V6:
        return "reserved (not global unicast)"
    return None


def check_address(address: IPAddress, allow: tuple[IPNetwork, ...]) -> str | None:
    """Like :func:`refusal_reason`, but ``None`` for addresses inside an allow-listed network."""
    inner = embedded_ipv4(address)
    for candidate in (address, inner):
        if candidate is not None and any(
            candidate.version == network.version and candidate in network for network in allow
        ):
            return None
    return refusal_reason(address)


def parse_address(text: str) -> IPAddress:
    """An address from ``getaddrinfo`` (an IPv6 zone suffix such as ``%eth0`` is dropped)."""
    return ipaddress.ip_address(text.partition("%")[0])


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The distinct addresses ``host`` resolves to, in resolver order, not yet vetted.

    Raises ``OSError`` (``socket.gaierror``) if the name does not resolve.
    """
    infos = await trio.socket.getaddrinfo(
        host, port, type=trio.socket.SOCK_STREAM, proto=trio.socket.IPPROTO_TCP
    )
    addresses: list[IPAddress] = []
    for info in infos:
        address = parse_address(str(info[4][0]))
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise OSError(f"{host} resolved to no address")
    return addresses


def vet(
    host: str,
    addresses: list[IPAddress],
    allow: tuple[IPNetwork, ...],
    *,
    who: str = "Webhooks",
    flag: str = "--webhook-allow-cidr",
) -> list[IPAddress]:
    """``addresses`` (what ``host`` resolved to) if the guard allows every one of them.

    Raises :class:`AddressRefused` naming the first refused address, and ``flag``, the node
    flag that would allow it (``who`` says whose guard refused); returns at most
    :data:`ADDRESSES_MAX` addresses, in the given order.
    """
    for address in addresses:
        reason = check_address(address, allow)
        if reason is not None:
            shown = host if host == str(address) else f"{host} (resolved to {address})"
            raise AddressRefused(
                f"refused to call {shown}: a {reason} address. {who} may reach only "
                f"public addresses; allow a network with {flag} if this is intended"
            )
    return addresses[:ADDRESSES_MAX]


async def resolve_vetted(host: str, port: int, allow: tuple[IPNetwork, ...]) -> list[IPAddress]:
    """Resolve ``host`` and return its addresses, all of which the guard allows.

    Raises :class:`AddressRefused` if any address is refused and ``OSError``
    (``socket.gaierror``) if the name does not resolve. At most :data:`ADDRESSES_MAX`
    addresses are returned, in resolver order.
    """
    return vet(host, await resolve(host, port), allow)
