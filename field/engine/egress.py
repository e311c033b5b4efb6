"""The egress policy where names are resolved and connections are made.

:class:`~field.core.egress.EgressPolicy` judges addresses; this module applies
it at the two moments that matter for an outgoing request:

* **When a URL is accepted** (SUBSCRIBE with a webhook or callback URL),
  :func:`check_destination` checks the URL and resolves its host name: the
  URL is refused if *any* address of the name is refused, so an agent learns
  at once that its URL cannot work.
* **At every connection**, a name may resolve elsewhere than it did when it
  was accepted (DNS rebinding: a short-lived record that first answers a
  public address, then 127.0.0.1). :class:`PolicyConnector` is the aiohttp
  connector the delivery client must use: its :class:`PolicyResolver` keeps
  only the addresses the policy allows, and its :meth:`PolicyConnector.connect`
  judges IP-literal hosts, which aiohttp never passes to a resolver. Either
  way a refused destination fails before a connection is opened, so not a
  byte reaches it.

Use it as ``aiohttp.ClientSession(connector=PolicyConnector(policy))``, with no
proxy (a proxy would connect on the Field's behalf, unchecked; the connector
refuses proxied requests) and ``allow_redirects=False`` (a redirect is a new
destination; the connector would judge its host too, but a delivery should
report a redirect, not follow it). A refusal surfaces as
:class:`aiohttp.ClientConnectorError` whose ``os_error`` is an
:class:`EgressRefused`; :func:`refusal_of` gets the reason back from it.

Host names are resolved on the default executor (``getaddrinfo`` blocks);
:func:`check_destination` stops waiting after ``timeout`` seconds, though the
lookup itself runs on in its thread until the C library gives up.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp.abc import AbstractResolver

from field.core.egress import EgressPolicy, plain_address, shown

if TYPE_CHECKING:  # aiohttp 3.10 and later name the answer's type
    from aiohttp.abc import ResolveResult

#: Resolves (host, port) to the addresses it names, as text ("93.184.216.34", "::1").
Resolve = Callable[[str, int], Awaitable[Sequence[str]]]

#: How long :func:`check_destination` waits for a name lookup, in seconds.
LOOKUP_TIMEOUT = 5.0
#: Hosts whose verdict a :class:`PolicyConnector` keeps (then it starts over).
MAX_VERDICTS = 4096


class EgressRefused(OSError):
    """A destination the egress policy refuses; ``reason`` says why (safe to show)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.strerror = reason  # what aiohttp's ClientConnectorError shows


def refusal_of(error: BaseException) -> str | None:
    """The egress policy's reason behind a failed request, or None if it was not refused."""
    if isinstance(error, aiohttp.ClientConnectorError):
        error = error.os_error
    return error.reason if isinstance(error, EgressRefused) else None


def _answer_refusal(policy: EgressPolicy, host: str, answer: str) -> str | None:
    """Why ``host`` may not be reached at ``answer``, an address its lookup gave, or None.

    An IPv6 answer may carry a zone ("fe80::1%eth0"); the policy judges the address.
    """
    try:
        address = ipaddress.ip_address(answer.partition("%")[0])
    except ValueError:
        return f"{shown(host)} has an answer that is not an address"
    reason = policy.refusal(address)
    return None if reason is None else f"{shown(host)} resolves to a refused address: {reason}"


async def _getaddrinfo(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the C library's resolver (on the default executor)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


async def check_destination(
    policy: EgressPolicy,
    url: str,
    *,
    timeout: float = LOOKUP_TIMEOUT,
    resolve: Resolve | None = None,
) -> str | None:
    """None if ``url`` may be used now, else the reason (short, safe to show).

    :meth:`EgressPolicy.check_url` first; then a host name is resolved (``resolve``,
    by default the C library's ``getaddrinfo``, bounded by ``timeout`` seconds) and
    refused if the lookup fails, finds nothing, or finds ANY address the policy
    refuses.
    """
    checked = policy.check_url(url)
    if isinstance(checked, str):
        return checked
    _, host, port = checked
    if plain_address(host) is not None:
        return None  # an IP literal, judged by check_url
    try:
        async with asyncio.timeout(timeout):
            found = await (resolve or _getaddrinfo)(host, port)
    except TimeoutError:
        return f"looking up {shown(host)} took longer than {timeout:g} s"
    except OSError as exc:
        detail = f": {shown(exc.strerror)}" if exc.strerror else ""
        return f"cannot look up {shown(host)}{detail}"
    if not found:
        return f"{shown(host)} has no address"
    for answer in found:
        reason = _answer_refusal(policy, host, answer)
        if reason is not None:
            return reason
    return None


class PolicyResolver(AbstractResolver):
    """An aiohttp resolver that keeps only the addresses the egress policy allows.

    Resolves with aiohttp's default resolver (or ``resolver``); if no address is
    left, raises :class:`EgressRefused` with the reason, so the connection fails
    before any byte is sent. This is the connect-time check that stops DNS
    rebinding. Create it inside the running event loop, as aiohttp's resolvers;
    as they do, it closes the resolver it made, not one it was given.
    """

    def __init__(self, policy: EgressPolicy, resolver: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._owner = resolver is None
        self._resolver = resolver if resolver is not None else aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        kept: list[ResolveResult] = []
        reasons: list[str] = []
        for result in results:
            reason = _answer_refusal(self._policy, host, result["host"])
            if reason is None:
                kept.append(result)
            else:
                reasons.append(reason)
        if not kept:
            raise EgressRefused(reasons[0] if reasons else f"{shown(host)} has no address")
        return kept

    async def close(self) -> None:
        if self._owner:
            await self._resolver.close()


class PolicyConnector(aiohttp.TCPConnector):
    """The TCP connector of the delivery client: every destination passes the policy.

    Host names are resolved by a :class:`PolicyResolver` (``resolver`` is the one it
    wraps); IP-literal hosts, which aiohttp connects to without a resolver, are judged
    here before a connection is taken from the pool or opened. Other keyword arguments
    go to :class:`aiohttp.TCPConnector`.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        resolver: AbstractResolver | None = None,
        **kwargs: Any,
    ) -> None:
        self._policy = policy
        self._policy_resolver = PolicyResolver(policy, resolver)
        #: the policy's verdict on each host seen lately (it judges every request's host,
        #: also on a kept-alive connection; the policy never changes, so neither does it)
        self._verdicts: dict[str, str | None] = {}
        super().__init__(resolver=self._policy_resolver, **kwargs)

    async def close(self, **kwargs: Any) -> None:
        """Close the connections, then the resolver (aiohttp leaves a given one open)."""
        await super().close(**kwargs)
        await self._policy_resolver.close()

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        reason = self._refusal(req)
        if reason is not None:
            raise aiohttp.ClientConnectorError(req.connection_key, EgressRefused(reason))
        return await super().connect(req, traces, timeout)

    def _refusal(self, req: aiohttp.ClientRequest) -> str | None:
        """Why this request may not connect (before any name is resolved), or None."""
        if req.proxy is not None:
            return "requests through a proxy are not allowed by the egress policy"
        host = req.url.raw_host or ""
        verdicts = self._verdicts
        if host in verdicts:
            return verdicts[host]
        if len(verdicts) >= MAX_VERDICTS:
            verdicts.clear()
        verdict = verdicts[host] = self._policy.host_refusal(host)
        return verdict
