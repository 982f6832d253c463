"""The SSRF guard's address classes, allow-list and resolution (no network beyond loopback)."""

from __future__ import annotations

import ipaddress

import pytest

from engine.handlers.ssrf import (
    AddressRefused,
    check_address,
    parse_allow_list,
    refusal_reason,
    resolve_vetted,
)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("100.100.100.200", "CGNAT"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.10", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "unique local"),
        ("fd00:ec2::254", "unique local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("::ffff:127.0.0.1", "loopback (embedded in IPv6"),
        ("::ffff:10.0.0.1", "private (embedded in IPv6"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("::127.0.0.1", "loopback (embedded"),
        ("64:ff9b::a9fe:a9fe", "cloud metadata"),
        ("2002:7f00:1::", "loopback (embedded"),
        ("100::1", "discard-only"),
        ("4000::1", "not global unicast"),
    ],
)
def test_refuses_special_purpose_addresses_naming_their_class(address: str, reason: str) -> None:
    refused = refusal_reason(ipaddress.ip_address(address))
    assert refused is not None
    assert reason in refused


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "172.32.0.1",
        "100.128.0.1",
        "2606:2800:220:1:248:1893:25c8:1946",
        "2a00:1450:4001:80b::200e",
        "::ffff:93.184.216.34",
        "64:ff9b::5db8:d822",
        "2002:5db8:d822::1",
    ],
)
def test_allows_public_unicast_addresses(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None


def test_allow_list_admits_refused_addresses_inside_it_only() -> None:
    allow = parse_allow_list(["127.0.0.0/8", "fd00::/8"])
    assert check_address(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert check_address(ipaddress.ip_address("::ffff:127.0.0.1"), allow) is None
    assert check_address(ipaddress.ip_address("fd12::1"), allow) is None
    assert check_address(ipaddress.ip_address("10.0.0.1"), allow) == "private"
    assert check_address(ipaddress.ip_address("::1"), allow) == "loopback"


async def test_a_hostname_resolving_to_loopback_is_refused() -> None:
    with pytest.raises(AddressRefused, match=r"localhost \(resolved to .*loopback"):
        await resolve_vetted("localhost", 80, ())


async def test_an_address_literal_is_vetted_without_dns() -> None:
    with pytest.raises(AddressRefused, match=r"169\.254\.169\.254: a link-local"):
        await resolve_vetted("169.254.169.254", 80, ())
    assert await resolve_vetted("127.0.0.1", 80, parse_allow_list(["127.0.0.0/8"])) == [
        ipaddress.ip_address("127.0.0.1")
    ]
