"""The host names the Field answers to (``--allowed-host``): its guard against DNS rebinding.

A page of any web site can reach a server on its visitor's machine: its
owner points the site's name at 127.0.0.1 once the page is loaded, and the
browser, which takes the Field for the site, sends it the page's requests
and lets the page read the answers. Those requests name the site in
``Host`` (and in ``Origin``, which then equals it), never a loopback name.
So a Field bound to loopback answers only requests whose ``Host`` is a
loopback name (``localhost``, an address of 127.0.0.0/8, ``[::1]``, with
any port or none) or one the operator allows with ``--allowed-host``; any
other is ``421 MISDIRECTED_REQUEST``, on every path, a WebSocket handshake
before it is accepted (:meth:`AllowedHosts.refusal`, the first thing the
app asks of every request). A request without ``Host`` comes from no browser
and is served.

Bound to another address (``--host 0.0.0.0``) the Field is meant to be
reached by names only its operator knows, so ``Host`` is not checked unless
``--allowed-host`` is given; then the allowed hosts and the loopback names
are the only ones answered. (No rebinding can make a browser send a loopback
name: the page would have to come from the visitor's own machine.)

A pattern of ``--allowed-host`` takes the forms of the MCP SDK's
``TransportSecuritySettings.allowed_hosts``, plus subdomains:

* ``field.example.com``: that name without a port (as browsers send it for
  the default port of the scheme);
* ``field.example.com:8765``: that name and port;
* ``field.example.com:*``: that name with any port or none;
* ``*.example.com`` (with a port or ``:*`` as above): any name that ends in
  ``.example.com``, at any depth (not ``example.com`` itself);
* an IPv4 address, or an IPv6 address in brackets (``[fd00::5]:8765``).

The same names decide which browser origins may call ``/mcp``
(:func:`field.transports.cors.mcp_refusal`) and which pages are the Field's
own for a WebSocket (:func:`field.transports.cors.websocket_refusal`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import Scope

from ..contract.errors import Code, FieldError

#: A port of a pattern that stands for any port, or none.
ANY_PORT = "*"
#: The longest ``Host`` the Field reads (a longer one is not a host name).
MAX_HOST_LENGTH = 300
#: Admitted ``Host`` values remembered, so that a client's next request is not parsed again.
_REMEMBERED = 64
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One ``--allowed-host``: a name (``*.`` first: its subdomains) and a port (``""``:
    none, ``*``: any or none, else its digits)."""

    name: str
    port: str

    def matches(self, name: str, port: str) -> bool:
        """Whether the host ``name`` and ``port`` (``""``: none) of a request match."""
        if self.port != ANY_PORT and self.port != port:
            return False
        if self.name.startswith("*."):
            return name.endswith(self.name[1:])
        return name == self.name

    def __str__(self) -> str:
        return self.name + (f":{self.port}" if self.port else "")


def parse_host_pattern(text: str) -> HostPattern:
    """``text`` as an allowed host (module docstring); ValueError for anything else."""
    shown = text[:100]
    split = split_host(text.strip().lower(), ports=True)
    if split is None:
        raise ValueError(
            f"{shown!r} is not an allowed host: a host name or address, maybe *. before a "
            "name, maybe a port or :* (any port), such as field.example.com:8765, "
            "*.example.com or field.example.com:*"
        )
    name, port = split
    if port not in ("", ANY_PORT) and not 0 < int(port) <= 65535:
        raise ValueError(f"{shown!r} is not an allowed host: its port is not 1 to 65535")
    return HostPattern(name, port)


def parse_allowed_hosts(texts: Iterable[str]) -> tuple[str, ...]:
    """Each of ``texts`` as :func:`parse_host_pattern` writes it, each once."""
    return tuple(dict.fromkeys(str(parse_host_pattern(text)) for text in texts))


def split_host(value: str, *, ports: bool = False) -> tuple[str, str] | None:
    """A ``Host`` value (lower case) as (name, port digits or ``""``), the name as written
    for comparing (an IPv6 address compressed, in brackets; no final dot); None if it is
    not one. ``ports``: a port may be ``*`` and a name begin with ``*.`` (a pattern)."""
    if not value or len(value) > MAX_HOST_LENGTH:
        return None
    if value.startswith("["):
        address, bracket, port = value[1:].partition("]")
        try:
            name = f"[{ipaddress.IPv6Address(address).compressed}]"
        except ValueError:
            return None
        if not bracket or (port and not port.startswith(":")):
            return None
        port = port[1:]
    else:
        name, _, port = value.partition(":")
        name = name.removesuffix(".")
        if _NAME.fullmatch(name) is None or (name.startswith("*") and not ports):
            return None
    if port == ANY_PORT and ports:
        return name, port
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return name, port and str(int(port))


def is_loopback(name: str) -> bool:
    """Whether the host ``name`` (as :func:`split_host` writes it) is a loopback name."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_bind(host: str) -> bool:
    """Whether ``--host`` binds to loopback alone."""
    host = host.strip().lower()
    return is_loopback(f"[{host}]" if ":" in host else host)


class AllowedHosts:
    """The host names one Field answers to: the loopback names and ``--allowed-host``."""

    def __init__(self, bind: str, patterns: Iterable[str] = ()) -> None:
        self.patterns = tuple(parse_host_pattern(text) for text in patterns)
        #: whether ``Host`` is checked: bound to loopback, or hosts named
        self.checking = is_loopback_bind(bind) or bool(self.patterns)
        self._admitted: set[str] = set()

    def allows(self, name: str, port: str) -> bool:
        """Whether the host ``name`` and ``port`` (as :func:`split_host` writes them) is one
        of these, whether or not ``Host`` is checked."""
        return is_loopback(name) or any(pattern.matches(name, port) for pattern in self.patterns)

    def admits(self, host: str) -> bool:
        """Whether a request whose ``Host`` is ``host`` is served."""
        if not self.checking or host in self._admitted:
            return True
        split = split_host(host.strip().lower())
        if split is None or not self.allows(*split):
            return False
        if len(self._admitted) < _REMEMBERED:
            self._admitted.add(host)
        return True

    def refusal(self, scope: Scope) -> FieldError | None:
        """Why the request or WebSocket handshake of ``scope`` is not served for its ``Host``
        (``421 MISDIRECTED_REQUEST``); None if it is, or is neither. A request without
        ``Host`` comes from no browser: it is served."""
        if not self.checking or scope["type"] not in ("http", "websocket"):
            return None
        host = _host_of(scope)
        return None if host is None or self.admits(host) else misdirected(host)

    def allows_origin(self, origin: str) -> bool:
        """Whether the host of ``origin`` (as :func:`~field.transports.cors.parse_origin`
        writes it: no default port) is one of these."""
        split = split_host(origin.partition("://")[2])
        return split is not None and self.allows(*split)


def misdirected(host: str) -> FieldError:
    """The refusal of a request whose ``Host`` the Field does not answer to."""
    return FieldError(
        f"this Field does not answer to the host name {host[:100]!r}",
        code=Code.MISDIRECTED_REQUEST,
        recoverable=False,
        suggested_action="Send the request to a loopback address or localhost, or ask the "
        "operator to allow this host name (--allowed-host).",
    )


def _host_of(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"host":
            return str(value.decode("latin-1"))
    return None
