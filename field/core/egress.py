"""Which addresses the Field's outgoing requests (webhooks, RAP callbacks) may reach.

A URL an agent gives is a request to make the server connect somewhere. Left
unchecked it reaches what the agent cannot: the loopback interface, the
private network the server sits in, a cloud metadata service on a link-local
address. :class:`EgressPolicy` refuses every address that is not globally
routable unless the operator allows its network (``--webhook-allow-net``).

This module is pure: it judges addresses and URLs, it never resolves a name.
A hostname is judged where it is resolved, by
:mod:`field.engine.egress`, once when a URL is accepted and again at
every connection (a name may resolve elsewhere by then).

What is refused (the tables below, most specific entry first):

* IPv4: this network (0/8) and the unspecified address, private (10/8,
  172.16/12, 192.168/16), shared address space (100.64/10), loopback
  (127/8), link-local (169.254/16), IETF protocol assignments (192.0.0/24),
  documentation (192.0.2/24, 198.51.100/24, 203.0.113/24), the retired
  6to4 relay anycast (192.88.99/24), benchmarking (198.18/15), multicast
  (224/4), reserved (240/4) and broadcast.
* IPv6: unspecified, loopback, discard-only (100::/64), local-use NAT64
  (64:ff9b:1::/48), IETF protocol assignments including Teredo (2001::/23),
  documentation (2001:db8::/32, 3fff::/20), SRv6 segment identifiers
  (5f00::/16), unique-local (fc00::/7), link-local (fe80::/10), site-local
  (fec0::/10), multicast (ff00::/8), and everything outside global unicast
  (2000::/3).
* An IPv6 address that carries an IPv4 address (IPv4-mapped ``::ffff:0:0/96``,
  IPv4-compatible ``::/96``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is
  judged by the IPv4 address it carries, since that is where it leads.

An allowed network wins over every refusal; it is matched against the
address as given and against the IPv4 address it carries, so allowing
``127.0.0.0/8`` also allows ``::ffff:127.0.0.1``.

Every reason is short and safe to show to the client: it names a parsed
address or at most :data:`SHOWN_CHARS` characters of what it was given.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The longest URL accepted.
MAX_URL_CHARS = 2048
#: The longest piece of client text a reason repeats.
SHOWN_CHARS = 64
#: The URL schemes outgoing requests may use, and their default ports.
DEFAULT_PORTS = {"http": 80, "https": 443}

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

#: IPv4 ranges that are not globally reachable, most specific first.
_IPV4_REFUSED: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "the unspecified address"),
    (_V4("255.255.255.255/32"), "the broadcast address"),
    (_V4("0.0.0.0/8"), "a 'this network' address"),
    (_V4("10.0.0.0/8"), "a private address"),
    (_V4("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("169.254.0.0/16"), "a link-local address"),
    (_V4("172.16.0.0/12"), "a private address"),
    (_V4("192.0.0.0/24"), "an IETF protocol assignment"),
    (_V4("192.0.2.0/24"), "a documentation address"),
    (_V4("192.88.99.0/24"), "a retired 6to4 relay address"),
    (_V4("192.168.0.0/16"), "a private address"),
    (_V4("198.18.0.0/15"), "a benchmarking address"),
    (_V4("198.51.100.0/24"), "a documentation address"),
    (_V4("203.0.113.0/24"), "a documentation address"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("240.0.0.0/4"), "a reserved address"),
)

#: IPv6 ranges that are not globally reachable, most specific first; checked after the
#: ranges that carry an IPv4 address (:func:`embedded_ipv4`).
_IPV6_REFUSED: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("100::/64"), "a discard-only address"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (_V6("2001:db8::/32"), "a documentation address"),
    (_V6("2001::/23"), "an IETF protocol assignment"),
    (_V6("3fff::/20"), "a documentation address"),
    (_V6("5f00::/16"), "an SRv6 segment identifier"),
    (_V6("fc00::/7"), "a unique-local address"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address"),
    (_V6("ff00::/8"), "a multicast address"),
)
_GLOBAL_UNICAST = _V6("2000::/3")

_IPV4_MAPPED = _V6("::ffff:0:0/96")
_IPV4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_SIXTOFOUR = _V6("2002::/16")

#: What a URL may be made of: printable ASCII, no space, no backslash (parsers disagree
#: on what a backslash means, and the transport must connect where this module looked).
_URL_CHARS = re.compile(r"[!-\[\]-~]+")
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>[/?#].*)?")
_PORT = re.compile(r"[0-9]{1,5}")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
#: A label that an IPv4 parser takes for a number (decimal, octal or hex).
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_MAX_HOSTNAME_CHARS = 253


def parse_networks(values: Iterable[str]) -> list[Network]:
    """The networks of ``--webhook-allow-net`` values ("127.0.0.0/8", "::1/128", "10.1.2.3").

    Raises ValueError naming the first value that is not a network in CIDR notation
    (host bits set, as in "10.0.0.1/8", count as a mistake).
    """
    networks: list[Network] = []
    for value in values:
        text = value.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError:
            raise ValueError(
                f"{shown(text)!r} is not a network in CIDR notation (e.g. 10.0.0.0/8 or fd00::/8)"
            ) from None
    return networks


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters (marked with "...") for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address leads to (mapped, compatible, NAT64, 6to4), if any."""
    if address in _IPV4_MAPPED or address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # "::" and "::1" are IPv6's own
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIXTOFOUR:
        return ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF)
    return None


def _ipv4_kind(address: ipaddress.IPv4Address) -> str | None:
    """The refused range an IPv4 address is in, or None for a global one."""
    for network, kind in _IPV4_REFUSED:
        if address in network:
            return kind
    return None


def _ipv6_kind(address: ipaddress.IPv6Address) -> str | None:
    """The refused range an IPv6 address (carrying no IPv4 address) is in, or None."""
    for network, kind in _IPV6_REFUSED:
        if address in network:
            return kind
    if address not in _GLOBAL_UNICAST:
        return "a reserved address"
    return None


def plain_address(host: str) -> Address | str | None:
    """What an IP-literal host is: its address, a reason it is refused, or None for a name.

    ``host`` is the host of a URL without brackets, lowercase. A host whose last label is
    a number is taken for an IPv4 address, as browsers and C libraries do, and must then
    be a plain dotted quad: "2130706433", "0x7f.1", "127.1" or "0177.0.0.1" reach
    127.0.0.1 on some stacks and are refused rather than guessed at.
    """
    if ":" in host:
        if "%" in host:
            return "an IPv6 address with a zone is not accepted"
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return f"{shown(host)!r} is not a valid IPv6 address"
    labels = host.split(".")
    last = labels[-1] if labels[-1] or len(labels) == 1 else labels[-2]
    if not _NUMBER.fullmatch(last):
        return None
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return f"{shown(host)!r} is not a plain IPv4 address (use four decimal numbers)"


def _hostname_refusal(host: str) -> str | None:
    """Why ``host`` (lowercase, not an IP literal) is not a hostname, or None."""
    name = host[:-1] if host.endswith(".") else host
    if not name:
        return "the URL has no host"
    if len(name) > _MAX_HOSTNAME_CHARS:
        return f"the host name is longer than {_MAX_HOSTNAME_CHARS} characters"
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return f"{shown(host)!r} is not a valid host name"
    return None


def _split_authority(authority: str) -> tuple[str, str | None] | str:
    """(host, port text or None) of a URL's authority, or why it is refused."""
    if "@" in authority:
        return "the URL may not carry user information (credentials leak into logs)"
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return "the URL has an unclosed '[' in its host"
        host, after = authority[1:end], authority[end + 1 :]
        if not host or ":" not in host:
            return "only an IPv6 address may be written in brackets"
        if after and not after.startswith(":"):
            return "the URL has text after its bracketed host"
        return host, after[1:] if after else None
    if authority.count(":") > 1:
        return "an IPv6 address must be written in brackets"
    host, colon, port = authority.partition(":")
    return host, port if colon else None


def _port(text: str | None, scheme: str) -> int | str:
    """The port a URL names (or its scheme's default), or why it is refused."""
    if text is None:
        return DEFAULT_PORTS[scheme]
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        return "the port must be a number from 1 to 65535"
    return int(text)


class EgressPolicy:
    """The addresses outgoing requests may reach: global ones, plus the allowed networks."""

    __slots__ = ("allow",)

    def __init__(self, allow: Sequence[Network] = ()) -> None:
        self.allow: tuple[Network, ...] = tuple(allow)

    def _allowed(self, address: Address) -> bool:
        return any(address in network for network in self.allow)

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be reached (e.g. "127.0.0.1 is a loopback address"), or None.

        Refused unless inside an allowed network: every range of the tables above, and an
        IPv6 address carrying an IPv4 address when that IPv4 address is refused. Allowed
        networks are matched against the address as given and the IPv4 address it carries.
        """
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            address = ipaddress.IPv6Address(int(address))  # the zone is no part of the range
        if self._allowed(address):
            return None
        if isinstance(address, ipaddress.IPv4Address):
            kind = _ipv4_kind(address)
            return None if kind is None else f"{address} is {kind}"
        carried = embedded_ipv4(address)
        if carried is None:
            kind = _ipv6_kind(address)
            return None if kind is None else f"{address} is {kind}"
        if self._allowed(carried):
            return None
        kind = _ipv4_kind(carried)
        return None if kind is None else f"{address} leads to {carried}, {kind}"

    def host_refusal(self, host: str) -> str | None:
        """Why the host of a URL (no brackets) may not be reached, or None.

        An IP literal is judged by :meth:`refusal` (odd IPv4 forms are refused); a name
        is accepted, for whoever resolves it to judge its addresses.
        """
        literal = plain_address(host.lower())
        if isinstance(literal, str):
            return literal
        return None if literal is None else self.refusal(literal)

    def check_url(self, url: str) -> tuple[str, str, int] | str:
        """(scheme, host, port) of an acceptable URL, else the reason it is refused.

        The scheme is http or https; the URL has a host and no user information, a port
        from 1 to 65535 if any, at most :data:`MAX_URL_CHARS` printable ASCII characters
        without spaces or backslashes. An IP-literal host is judged by :meth:`refusal`;
        a host name is accepted (its addresses are judged where it is resolved). The
        returned scheme and host are lowercase, an IPv6 host without brackets.
        """
        if len(url) > MAX_URL_CHARS:
            return f"the URL is longer than {MAX_URL_CHARS} characters"
        if not _URL_CHARS.fullmatch(url):
            return "the URL must be printable ASCII without spaces or backslashes"
        match = _URL.fullmatch(url)
        if match is None:
            return "the URL must be absolute, as in https://host/path"
        scheme = match["scheme"].lower()
        if scheme not in DEFAULT_PORTS:
            return "the URL scheme must be http or https"
        parts = _split_authority(match["authority"])
        if isinstance(parts, str):
            return parts
        host, port_text = parts[0].lower(), parts[1]
        port = _port(port_text, scheme)
        if isinstance(port, str):
            return port
        literal = plain_address(host)
        if literal is None:
            reason = _hostname_refusal(host)
        elif isinstance(literal, str):
            reason = literal
        else:
            reason = self.refusal(literal)
        return (scheme, host, port) if reason is None else reason
