"""The egress policy: which addresses and URLs outgoing requests may reach.

The pure policy (:mod:`field.core.egress`) is tested without an event loop,
over every refused address class, IPv4 and IPv6 (literals, mapped,
compatible, NAT64, 6to4), odd literal forms and URLs, and against the
standard library's own idea of a non-global address on random inputs.

The transport (:mod:`field.engine.egress`) is tested with injected
resolvers (no lookup leaves the machine) and a real aiohttp client against a
witness server on 127.0.0.1 that counts the connections it accepts: a refused
request must fail before the witness sees a connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver
from hypothesis import given
from hypothesis import strategies as st

from field.core.egress import (
    MAX_URL_CHARS,
    SHOWN_CHARS,
    EgressPolicy,
    embedded_ipv4,
    parse_networks,
)
from field.engine import egress as egress_transport
from field.engine.egress import (
    EgressRefused,
    PolicyConnector,
    PolicyResolver,
    check_destination,
    refusal_of,
)

#: Failure guard for one awaited answer (never a pacing delay).
TIMEOUT = aiohttp.ClientTimeout(total=5)

OPEN = EgressPolicy()
LOOPBACK_ALLOWED = EgressPolicy(parse_networks(["127.0.0.0/8"]))


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# ---------------------------------------------------------------- addresses

#: One address of every refused class, the words its reason uses, and a network to allow.
REFUSED = [
    ("0.0.0.0", "unspecified", "0.0.0.0/32"),
    ("0.1.2.3", "this network", "0.0.0.0/8"),
    ("10.1.2.3", "private", "10.0.0.0/8"),
    ("100.64.0.1", "shared", "100.64.0.0/10"),
    ("100.127.255.254", "shared", "100.64.0.0/10"),
    ("127.0.0.1", "loopback", "127.0.0.0/8"),
    ("127.255.255.254", "loopback", "127.0.0.0/8"),
    ("169.254.169.254", "link-local", "169.254.0.0/16"),
    ("172.16.0.1", "private", "172.16.0.0/12"),
    ("172.31.255.254", "private", "172.16.0.0/12"),
    ("192.0.0.8", "IETF protocol", "192.0.0.0/24"),
    ("192.0.2.1", "documentation", "192.0.2.0/24"),
    ("192.88.99.1", "6to4 relay", "192.88.99.0/24"),
    ("192.168.1.1", "private", "192.168.0.0/16"),
    ("198.18.0.1", "benchmarking", "198.18.0.0/15"),
    ("198.19.255.254", "benchmarking", "198.18.0.0/15"),
    ("198.51.100.7", "documentation", "198.51.100.0/24"),
    ("203.0.113.9", "documentation", "203.0.113.0/24"),
    ("224.0.0.251", "multicast", "224.0.0.0/4"),
    ("239.255.255.250", "multicast", "224.0.0.0/4"),
    ("240.0.0.1", "reserved", "240.0.0.0/4"),
    ("255.255.255.255", "broadcast", "255.255.255.255/32"),
    ("::", "unspecified", "::/128"),
    ("::1", "loopback", "::1/128"),
    ("100::1", "discard", "100::/64"),
    ("64:ff9b:1::a", "NAT64", "64:ff9b:1::/48"),
    ("2001::1", "IETF protocol", "2001::/32"),  # Teredo
    ("2001:2::1", "IETF protocol", "2001::/23"),
    ("2001:db8::1", "documentation", "2001:db8::/32"),
    ("3fff::1", "documentation", "3fff::/20"),
    ("5f00::1", "SRv6", "5f00::/16"),
    ("fc00::1", "unique-local", "fc00::/7"),
    ("fd12:3456::1", "unique-local", "fd00::/8"),
    ("fe80::1", "link-local", "fe80::/10"),
    ("fec0::1", "site-local", "fec0::/10"),
    ("ff02::1", "multicast", "ff00::/8"),
    ("4000::1", "reserved", "4000::/3"),
    ("1::1", "reserved", "::/3"),
]

#: Global addresses, among them the neighbours of refused ranges.
GLOBAL = [
    "1.1.1.1",
    "8.8.8.8",
    "1.0.0.0",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "172.15.255.255",
    "172.32.0.0",
    "192.0.1.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2a00:1450:4001:81b::200e",
    "2001:4860:4860::8888",
    "2001:200::1",
    "3ffe::1",
]

#: IPv6 addresses that carry an IPv4 address: (address, the IPv4 address, its kind).
CARRIERS = [
    ("::ffff:127.0.0.1", "127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:10.0.0.1", "10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "169.254.169.254", "link-local"),
    ("::127.0.0.1", "127.0.0.1", "loopback"),  # IPv4-compatible
    ("::10.0.0.1", "10.0.0.1", "private"),
    ("::0.0.0.2", "0.0.0.2", "this network"),
    ("64:ff9b::7f00:1", "127.0.0.1", "loopback"),  # NAT64
    ("64:ff9b::a9fe:a9fe", "169.254.169.254", "link-local"),
    ("2002:7f00:1::", "127.0.0.1", "loopback"),  # 6to4
    ("2002:c0a8:101:1::1", "192.168.1.1", "private"),
]

#: The same, carrying a global IPv4 address.
GLOBAL_CARRIERS = [
    ("::ffff:8.8.8.8", "8.8.8.8"),
    ("::8.8.8.8", "8.8.8.8"),
    ("64:ff9b::808:808", "8.8.8.8"),
    ("2002:808:808::1", "8.8.8.8"),
]


@pytest.mark.parametrize(("address", "kind", "network"), REFUSED)
def test_refused_address_classes(address: str, kind: str, network: str) -> None:
    reason = OPEN.refusal(ip(address))
    assert reason is not None
    assert reason.startswith(f"{ip(address)} is ")
    assert kind in reason


@pytest.mark.parametrize(("address", "kind", "network"), REFUSED)
def test_refused_address_allowed_when_its_network_is(address: str, kind: str, network: str) -> None:
    assert EgressPolicy(parse_networks([network])).refusal(ip(address)) is None
    # another network does not allow it
    other = "203.0.113.0/24" if ":" not in address else "2001:db8::/32"
    if ip(address) not in ipaddress.ip_network(other):
        assert EgressPolicy(parse_networks([other])).refusal(ip(address)) is not None


@pytest.mark.parametrize("address", GLOBAL)
def test_global_addresses_are_reachable(address: str) -> None:
    assert OPEN.refusal(ip(address)) is None


@pytest.mark.parametrize(("address", "carried", "kind"), CARRIERS)
def test_ipv6_carrying_ipv4_is_judged_by_the_ipv4(address: str, carried: str, kind: str) -> None:
    v6 = ipaddress.IPv6Address(address)
    assert embedded_ipv4(v6) == ipaddress.IPv4Address(carried)
    reason = OPEN.refusal(v6)
    assert reason is not None
    assert f"leads to {carried}" in reason
    assert kind in reason


@pytest.mark.parametrize(("address", "carried", "kind"), CARRIERS)
def test_allowed_networks_match_the_carried_ipv4_and_the_address_as_given(
    address: str, carried: str, kind: str
) -> None:
    as_ipv4 = EgressPolicy(parse_networks([f"{carried}/32"]))
    as_given = EgressPolicy(parse_networks([f"{address}/128"]))
    assert as_ipv4.refusal(ip(address)) is None
    assert as_given.refusal(ip(address)) is None
    # allowing the IPv6 form does not open the plain IPv4 address, nor the reverse
    assert as_given.refusal(ip(carried)) is not None
    assert as_ipv4.refusal(ip("::ffff:203.0.113.1")) is not None


@pytest.mark.parametrize(("address", "carried"), GLOBAL_CARRIERS)
def test_ipv6_carrying_a_global_ipv4_is_reachable(address: str, carried: str) -> None:
    assert embedded_ipv4(ipaddress.IPv6Address(address)) == ipaddress.IPv4Address(carried)
    assert OPEN.refusal(ip(address)) is None


def test_ipv6_zone_is_ignored_when_judging() -> None:
    zoned = ipaddress.IPv6Address("fe80::1%eth0")
    reason = OPEN.refusal(zoned)
    assert reason == "fe80::1 is a link-local address"
    assert EgressPolicy(parse_networks(["fe80::/10"])).refusal(zoned) is None


@given(st.ip_addresses(v=4))
def test_every_ipv4_address_the_standard_library_calls_non_global_is_refused(
    address: ipaddress.IPv4Address,
) -> None:
    if not address.is_global or address.is_multicast:
        assert OPEN.refusal(address) is not None


@given(st.ip_addresses(v=6))
def test_every_ipv6_address_the_standard_library_calls_non_global_is_refused(
    address: ipaddress.IPv6Address,
) -> None:
    if embedded_ipv4(address) is None and (not address.is_global or address.is_multicast):
        assert OPEN.refusal(address) is not None


@given(st.ip_addresses(v=4))
def test_every_carrier_of_an_ipv4_address_is_judged_like_it(
    address: ipaddress.IPv4Address,
) -> None:
    refused = OPEN.refusal(address) is not None
    value = int(address)
    carriers = [
        ipaddress.IPv6Address((0xFFFF << 32) | value),  # mapped
        ipaddress.IPv6Address((0x64FF9B << 96) | value),  # NAT64
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80)),  # 6to4
    ]
    if value > 1:
        carriers.append(ipaddress.IPv6Address(value))  # compatible
    for carrier in carriers:
        assert (OPEN.refusal(carrier) is not None) == refused, carrier


# ---------------------------------------------------------------- networks


def test_parse_networks() -> None:
    assert parse_networks(["127.0.0.0/8", " ::1/128 ", "10.1.2.3", "fd00::/8"]) == [
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("10.1.2.3/32"),
        ipaddress.ip_network("fd00::/8"),
    ]
    assert parse_networks([]) == []


@pytest.mark.parametrize("bad", ["10.0.0.1/8", "localhost", "", "300.0.0.0/8", "::1/129", "1.2.3"])
def test_parse_networks_names_the_bad_value(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a network") as caught:
        parse_networks(["127.0.0.0/8", bad])
    assert repr(bad) in str(caught.value)


def test_parse_networks_clips_a_long_bad_value() -> None:
    with pytest.raises(ValueError) as caught:
        parse_networks(["x" * 5000])
    assert len(str(caught.value)) < 200


# ---------------------------------------------------------------- URLs

ODD_LITERALS = [
    "2130706433",  # 127.0.0.1 as one decimal number
    "017700000001",  # ... as one octal number
    "0x7f000001",  # ... as one hex number
    "0x7f.1",
    "0x7f.0.0.1",
    "127.1",
    "127.0.1",
    "0177.0.0.1",
    "127.0.0.01",
    "127.0.0.1.",
    "1.2.3.4.5",
    "8.8.8.08",
    "example.0x1",
    "example.123",
]


@pytest.mark.parametrize("host", ODD_LITERALS)
def test_odd_ipv4_forms_are_refused_even_when_allowed(host: str) -> None:
    allow_all = EgressPolicy(parse_networks(["0.0.0.0/0", "::/0"]))
    for policy in (OPEN, allow_all):
        reason = policy.check_url(f"http://{host}/hook")
        assert isinstance(reason, str)
        assert "not a plain IPv4 address" in reason
        assert policy.host_refusal(host) == reason


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/hook", ("http", "example.com", 80)),
        ("https://example.com", ("https", "example.com", 443)),
        ("HTTPS://Hooks.Example.COM:8443/a?b=c#d", ("https", "hooks.example.com", 8443)),
        ("http://example.com:1/", ("http", "example.com", 1)),
        ("http://example.com:65535/", ("http", "example.com", 65535)),
        ("http://example.com./", ("http", "example.com.", 80)),
        ("http://my_host.internal-name.example/", ("http", "my_host.internal-name.example", 80)),
        ("http://xn--bcher-kva.example/", ("http", "xn--bcher-kva.example", 80)),
        ("https://8.8.8.8/hook", ("https", "8.8.8.8", 443)),
        ("https://[2606:4700::1111]:8443/", ("https", "2606:4700::1111", 8443)),
        ("http://[::ffff:8.8.8.8]/", ("http", "::ffff:8.8.8.8", 80)),
        ("http://1e100.net/", ("http", "1e100.net", 80)),
    ],
)
def test_acceptable_urls(url: str, expected: tuple[str, str, int]) -> None:
    assert OPEN.check_url(url) == expected


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://example.com/", "scheme must be http or https"),
        ("file:///etc/passwd", "scheme must be http or https"),
        ("gopher://example.com/", "scheme must be http or https"),
        ("ws://example.com/", "scheme must be http or https"),
        ("javascript:alert(1)", "absolute"),
        ("http:example.com", "absolute"),
        ("//example.com/", "absolute"),
        ("example.com/hook", "absolute"),
        ("http:///hook", "no host"),
        ("http://:80/", "no host"),
        ("http://user@example.com/", "user information"),
        ("http://user:pass@example.com/", "user information"),
        ("http://@example.com/", "user information"),
        ("http://example.com@127.0.0.1/", "user information"),
        ("http://example.com:0/", "port"),
        ("http://example.com:65536/", "port"),
        ("http://example.com:123456/", "port"),
        ("http://example.com:-1/", "port"),
        ("http://example.com:http/", "port"),
        ("http://example.com:/", "port"),
        ("http://example.com:80:80/", "brackets"),
        ("http://exa mple.com/", "printable ASCII"),
        ("http://example.com/a b", "printable ASCII"),
        ("http://example.com\\@127.0.0.1/", "backslashes"),
        ("http://ex\u00e4mple.com/", "printable ASCII"),
        ("http://example.com/\n", "printable ASCII"),
        ("", "printable ASCII"),
        ("http://-example.com/", "not a valid host name"),
        ("http://example-.com/", "not a valid host name"),
        ("http://exa..mple.com/", "not a valid host name"),
        ("http://exa!mple.com/", "not a valid host name"),
        ("http://" + "a" * 64 + ".com/", "not a valid host name"),
        ("http://" + "a." * 127 + "com/", "longer than 253"),
        ("http://127.0.0.1/", "loopback"),
        ("http://10.0.0.1:8080/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://[64:ff9b::7f00:1]/", "loopback"),
        ("http://[2002:7f00:1::]/", "loopback"),
        ("http://[fe80::1%25eth0]/", "zone"),
        ("http://[fd00::1]:8080/", "unique-local"),
        ("http://::1/", "brackets"),
        ("http://[127.0.0.1]/", "only an IPv6 address"),
        ("http://[v1.fe]/", "only an IPv6 address"),
        ("http://[]/", "only an IPv6 address"),
        ("http://[::1/", "unclosed"),
        ("http://[::1]x/", "after its bracketed host"),
        ("http://[1:2:3]/", "not a valid IPv6 address"),
        ("http://[::ffff:127.0.0.01]/", "not a valid IPv6 address"),
    ],
)
def test_refused_urls(url: str, words: str) -> None:
    reason = OPEN.check_url(url)
    assert isinstance(reason, str)
    assert words in reason


def test_url_length_bound() -> None:
    base = "https://example.com/"
    longest = base + "a" * (MAX_URL_CHARS - len(base))
    assert OPEN.check_url(longest) == ("https", "example.com", 443)
    reason = OPEN.check_url(longest + "a")
    assert reason == f"the URL is longer than {MAX_URL_CHARS} characters"


@pytest.mark.parametrize(
    "url",
    [
        "http://" + "a" * 2000 + "/",
        "http://" + "1." * 900 + "1/",
        "http://[" + "1:" * 600 + "1]/",
        "ftp://" + "x" * 2000,
        "http://h:" + "9" * 2000 + "/",
        "http://" + "u" * 2000 + "@h/",
        "\u2028" * 3000,
    ],
)
def test_reasons_are_short_and_never_the_whole_url(url: str) -> None:
    reason = OPEN.check_url(url)
    assert isinstance(reason, str)
    assert len(reason) <= SHOWN_CHARS + 100  # a clipped piece and a sentence around it
    assert url not in reason


def test_allowed_literal_url() -> None:
    assert LOOPBACK_ALLOWED.check_url("http://127.0.0.1:8080/h") == ("http", "127.0.0.1", 8080)
    mapped = LOOPBACK_ALLOWED.check_url("http://[::FFFF:127.0.0.1]/")
    assert mapped == ("http", "::ffff:127.0.0.1", 80)
    assert isinstance(LOOPBACK_ALLOWED.check_url("http://[::1]/"), str)


# ---------------------------------------------------------------- check_destination


class Lookups:
    """An injected name service: fixed answers, a record of the names asked for."""

    def __init__(self, answers: dict[str, Sequence[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


async def test_check_destination_accepts_a_name_with_public_addresses() -> None:
    lookups = Lookups({"hooks.example.com": ["93.184.216.34", "2606:2800:220:1::1"]})
    url = "https://hooks.example.com:8443/in"
    assert await check_destination(OPEN, url, resolve=lookups) is None
    assert lookups.asked == [("hooks.example.com", 8443)]


async def test_check_destination_refuses_a_name_with_any_refused_address() -> None:
    lookups = Lookups({"mixed.example.com": ["93.184.216.34", "10.0.0.7"]})
    reason = await check_destination(OPEN, "https://mixed.example.com/", resolve=lookups)
    assert (
        reason == "mixed.example.com resolves to a refused address: 10.0.0.7 is a private address"
    )


async def test_check_destination_judges_every_answer_with_zones_and_carriers() -> None:
    lookups = Lookups({"a.example": ["8.8.8.8", "fe80::1%eth0"], "b.example": ["::ffff:10.0.0.1"]})
    assert "link-local" in (await check_destination(OPEN, "http://a.example/", resolve=lookups))
    assert "private" in (await check_destination(OPEN, "http://b.example/", resolve=lookups))
    allowed = EgressPolicy(parse_networks(["10.0.0.0/8", "fe80::/10"]))
    assert await check_destination(allowed, "http://a.example/", resolve=lookups) is None
    assert await check_destination(allowed, "http://b.example/", resolve=lookups) is None


async def test_check_destination_refuses_a_failed_lookup() -> None:
    lookups = Lookups({})
    reason = await check_destination(OPEN, "https://nowhere.example/", resolve=lookups)
    assert reason == "cannot look up nowhere.example: Name or service not known"


async def test_check_destination_refuses_an_empty_or_garbled_answer() -> None:
    lookups = Lookups({"empty.example": [], "odd.example": ["not-an-address"]})
    assert await check_destination(OPEN, "http://empty.example/", resolve=lookups) == (
        "empty.example has no address"
    )
    reason = await check_destination(OPEN, "http://odd.example/", resolve=lookups)
    assert reason == "odd.example has an answer that is not an address"


async def test_check_destination_gives_up_on_a_slow_lookup() -> None:
    never = asyncio.Event()
    started = asyncio.Event()

    async def stuck(host: str, port: int) -> Sequence[str]:
        started.set()
        await never.wait()
        return ["8.8.8.8"]

    reason = await check_destination(OPEN, "http://slow.example/", timeout=0.05, resolve=stuck)
    assert started.is_set()
    assert reason == "looking up slow.example took longer than 0.05 s"


async def test_check_destination_does_not_look_up_literals_or_refused_urls() -> None:
    lookups = Lookups({})
    assert await check_destination(OPEN, "http://8.8.8.8/", resolve=lookups) is None
    assert "loopback" in (await check_destination(OPEN, "http://127.0.0.1/", resolve=lookups))
    assert "user information" in (
        await check_destination(OPEN, "http://u@example.com/", resolve=lookups)
    )
    allowed = await check_destination(LOOPBACK_ALLOWED, "http://127.0.0.1/", resolve=lookups)
    assert allowed is None
    assert lookups.asked == []


async def test_check_destination_default_lookup_resolves_locally() -> None:
    # "localhost" is answered from the local hosts file: loopback only
    reason = await check_destination(OPEN, "http://localhost:9/")
    assert reason is not None and "loopback" in reason
    both = EgressPolicy(parse_networks(["127.0.0.0/8", "::1/128"]))
    assert await check_destination(both, "http://localhost:9/") is None


# ---------------------------------------------------------------- at connect time


class Witness:
    """An HTTP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.connections = 0
        self.probes = 0
        self.server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1") -> Witness:
        self.server = await asyncio.start_server(self._serve, host, 0)
        self.host = host
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def url(self, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(self.response)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def sightings(self) -> int:
        """Connections seen from others: a request of its own is accepted after them all."""
        self.probes += 1
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.get(self.url(), allow_redirects=False) as response,
        ):
            await response.read()
        return self.connections - self.probes

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.fixture
async def witness() -> AsyncIterator[Witness]:
    server = await Witness(OK).start()
    yield server
    await server.close()


def _result(host: str, address: str, port: int) -> Any:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {
        "hostname": host,
        "host": address,
        "port": port,
        "family": family,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST,
    }


class StaticResolver(AbstractResolver):
    """An aiohttp resolver with fixed answers."""

    def __init__(self, answers: dict[str, Sequence[str]]) -> None:
        self.answers = answers
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[Any]:
        if host not in self.answers:
            raise OSError(f"unknown name {host}")
        return [_result(host, address, port) for address in self.answers[host]]

    async def close(self) -> None:
        self.closed = True


class RebindingDNS(AbstractResolver):
    """A name that answers a public address once, then 127.0.0.1 (a rebinding attack)."""

    def __init__(self) -> None:
        self.lookups = 0

    async def lookup(self, host: str, port: int) -> Sequence[str]:
        self.lookups += 1
        return ["93.184.216.34"] if self.lookups == 1 else ["127.0.0.1"]

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[Any]:
        return [_result(host, address, port) for address in await self.lookup(host, port)]

    async def close(self) -> None:
        pass


async def fetch(connector: aiohttp.BaseConnector, url: str, **kwargs: Any) -> bytes:
    async with (
        aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as session,
        session.get(url, **kwargs) as response,
    ):
        return await response.read()


async def refused(connector: aiohttp.BaseConnector, url: str, **kwargs: Any) -> str:
    """The egress reason a request fails with (the test fails if it is anything else)."""
    with pytest.raises(aiohttp.ClientConnectorError) as caught:
        await fetch(connector, url, **kwargs)
    reason = refusal_of(caught.value)
    assert reason is not None, caught.value
    assert reason in str(caught.value)
    return reason


async def test_literal_loopback_refused_before_connecting(witness: Witness) -> None:
    reason = await refused(PolicyConnector(OPEN), witness.url())
    assert reason == "127.0.0.1 is a loopback address"
    assert await witness.sightings() == 0


async def test_a_connector_judges_a_host_alike_every_time(
    witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress_transport, "MAX_VERDICTS", 2)
    connector = PolicyConnector(OPEN)
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as session:
        for host in ["127.0.0.1", "10.1.2.3", "127.0.0.1", "169.254.1.1", "10.1.2.3"] * 2:
            url = witness.url(host)
            with pytest.raises(aiohttp.ClientConnectorError) as caught:
                async with session.get(url) as response:
                    await response.read()
            reason = refusal_of(caught.value)
            assert reason is not None and reason == OPEN.host_refusal(host)
        assert len(connector._verdicts) <= 2  # kept verdicts are bounded
    assert await witness.sightings() == 0


async def test_literal_loopback_served_when_allowed(witness: Witness) -> None:
    assert await fetch(PolicyConnector(LOOPBACK_ALLOWED), witness.url()) == b"ok"
    assert await witness.sightings() == 1


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "127.0.0.1."])
async def test_odd_literals_refused_at_connect(witness: Witness, host: str) -> None:
    reason = await refused(PolicyConnector(LOOPBACK_ALLOWED), witness.url(host))
    assert "not a plain IPv4 address" in reason
    assert await witness.sightings() == 0


async def test_zoned_ipv6_literal_refused_at_connect(witness: Witness) -> None:
    url = f"http://[fe80::1%25lo]:{witness.port}/"
    connector = PolicyConnector(EgressPolicy(parse_networks(["fe80::/10"])))
    assert "zone" in await refused(connector, url)


async def test_name_resolving_to_loopback_refused_before_connecting(witness: Witness) -> None:
    dns = StaticResolver({"hooks.test": ["127.0.0.1"]})
    reason = await refused(PolicyConnector(OPEN, resolver=dns), witness.url("hooks.test"))
    assert reason == "hooks.test resolves to a refused address: 127.0.0.1 is a loopback address"
    assert await witness.sightings() == 0


async def test_name_resolving_to_loopback_served_when_allowed(witness: Witness) -> None:
    dns = StaticResolver({"hooks.test": ["127.0.0.1"]})
    connector = PolicyConnector(LOOPBACK_ALLOWED, resolver=dns)
    assert await fetch(connector, witness.url("hooks.test")) == b"ok"
    assert await witness.sightings() == 1


async def test_default_resolver_for_localhost(witness: Witness) -> None:
    await refused(PolicyConnector(OPEN), witness.url("localhost"))
    assert await witness.sightings() == 0
    # 127.0.0.1 is kept and served (that ::1 is dropped: test_resolver_keeps_only_...)
    assert await fetch(PolicyConnector(LOOPBACK_ALLOWED), witness.url("localhost")) == b"ok"
    assert await witness.sightings() == 1


async def test_resolver_keeps_only_allowed_addresses() -> None:
    dns = StaticResolver({"mixed.test": ["10.0.0.1", "127.0.0.1", "::1", "fe80::1%lo", "8.8.8.8"]})
    resolver = PolicyResolver(LOOPBACK_ALLOWED, dns)
    kept = await resolver.resolve("mixed.test", 443)
    assert [result["host"] for result in kept] == ["127.0.0.1", "8.8.8.8"]
    dns.answers["mixed.test"] = ["10.0.0.1", "::1", "fe80::1%lo", "ff02::1"]
    with pytest.raises(EgressRefused) as caught:
        await PolicyResolver(OPEN, dns).resolve("mixed.test", 443, socket.AF_UNSPEC)
    assert (
        caught.value.reason
        == "mixed.test resolves to a refused address: 10.0.0.1 is a private address"
    )
    assert refusal_of(caught.value) == caught.value.reason
    empty = StaticResolver({"empty.test": []})
    with pytest.raises(EgressRefused, match="empty.test has no address"):
        await PolicyResolver(OPEN, empty).resolve("empty.test")
    await resolver.close()
    assert not dns.closed  # a resolver given is its owner's to close, as in aiohttp


async def test_dns_rebinding_refused_at_connect(witness: Witness) -> None:
    dns = RebindingDNS()
    url = witness.url("rebind.test")
    # when the URL is given, the name leads to a public address: accepted
    assert await check_destination(OPEN, url, resolve=dns.lookup) is None
    # at delivery it leads to 127.0.0.1: the connection is refused, nothing is sent
    reason = await refused(PolicyConnector(OPEN, resolver=dns), url)
    assert reason == "rebind.test resolves to a refused address: 127.0.0.1 is a loopback address"
    assert dns.lookups == 2
    assert await witness.sightings() == 0


async def test_redirect_to_a_refused_literal_is_refused() -> None:
    target = await Witness(OK).start("127.0.0.2")
    redirect = (
        b"HTTP/1.1 307 Temporary Redirect\r\n"
        b"Location: " + target.url().encode() + b"\r\nContent-Length: 0\r\n"
        b"Connection: close\r\n\r\n"
    )
    origin = await Witness(redirect).start()
    try:
        policy = EgressPolicy(parse_networks(["127.0.0.1/32"]))
        reason = await refused(PolicyConnector(policy), origin.url())
        assert reason == "127.0.0.2 is a loopback address"
        assert await origin.sightings() == 1
        assert await target.sightings() == 0
    finally:
        await origin.close()
        await target.close()


async def test_proxied_requests_are_refused(witness: Witness) -> None:
    reason = await refused(
        PolicyConnector(LOOPBACK_ALLOWED),
        "http://example.com/hook",
        proxy=f"http://127.0.0.1:{witness.port}",
    )
    assert "proxy" in reason
    assert await witness.sightings() == 0


async def test_other_connection_errors_are_not_refusals() -> None:
    # a port nothing listens on: a plain connection error, not the policy's
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(aiohttp.ClientConnectorError) as caught:
        await fetch(PolicyConnector(LOOPBACK_ALLOWED), f"http://127.0.0.1:{port}/")
    assert refusal_of(caught.value) is None
    assert refusal_of(ValueError("x")) is None
