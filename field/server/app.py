"""The composition root: one Field's server, built from its :class:`Config`.

:func:`create_app` is the one place that reads the configuration and wires the parts.
Every binding (HTTP, SSE, WebSocket, RAP, inbound sources, registration, metrics, MCP
over HTTP, the console, health) is built here once, with explicit arguments: the
:class:`~field.transports.runtime.Runtime` it reads the Field's parts from, the front
door, its limits; nothing is assigned to one afterwards, and no binding imports another.
When the app starts, the log, the single writer, the push hub, liveness, durable delivery
and the snapshotter are started in order and handed to the runtime at once
(:meth:`Runtime.start <field.transports.runtime.Runtime.start>`); when it stops, the
runtime lets go of them before the writer stops, and they stop in the reverse order.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import Route

from ..contract.ratelimit import Rate
from ..core.field import Field
from ..core.secrets import SecretBox
from ..engine.delivery import DeliveryEngine, Sinks
from ..engine.liveness import Liveness
from ..engine.push import PushHub
from ..engine.ratelimits import AgentRateLimits
from ..engine.router import PushCounts
from ..engine.service import FieldService
from ..engine.snapshotter import Snapshotter, snapshot_command
from ..ranking.embedding import Embedder, embeds_after_commit, load_embedder
from ..store import WEBHOOK_KEY_FILENAME, EventLog, open_log
from ..store.keys import load_or_create_key
from ..transports.access import no_responses
from ..transports.asgi import FastPaths, application
from ..transports.connections import ConnectionGuard
from ..transports.console import ConsoleBinding
from ..transports.door import FrontDoor, RegisterLimit
from ..transports.health import health_routes
from ..transports.http import HTTPBinding
from ..transports.index import OPENAPI_PATH, index_routes
from ..transports.mcp.deferred import DeferredMcp
from ..transports.metrics import Metrics, Observer
from ..transports.openapi import openapi_endpoint
from ..transports.rap import RapBinding
from ..transports.registration import RegistrationBinding
from ..transports.runtime import Running, Runtime
from ..transports.sources import SourcesBinding
from ..transports.sse import SSEBinding
from ..transports.streaming import WebSocketBinding
from .config import Config

if TYPE_CHECKING:
    from ..store.lease import Lease
    from ..store.presence import Presence
    from ..transports.mcp.streamable_http import McpHttpBinding

logger = logging.getLogger("field.http")


def webhook_key_of(config: Config) -> bytes:
    """The key that seals webhook secrets: from ``--webhook-key-file``, else from
    ``<data-dir>/webhook.key`` (made at first start), else (a log in memory, whose
    secrets die with the process anyway) a new one."""
    if config.webhook_key_file is not None:
        return load_or_create_key(config.webhook_key_file)
    if config.data_dir is not None:
        return load_or_create_key(config.data_dir / WEBHOOK_KEY_FILENAME)
    return secrets.token_bytes(32)


def _shared_presence(log: EventLog, service: FieldService, config: Config) -> Presence | None:
    """Presence shared with the other nodes of the Field on a PostgreSQL log; else None."""
    if log.backend != "postgresql":
        return None
    from ..store.presence import Presence  # the driver is an optional extra

    node_id = getattr(service, "node_id", None) or f"{socket.gethostname()}:{os.getpid()}"
    return Presence(
        log.url,  # type: ignore[attr-defined]
        node_id,
        interval=config.cluster_interval,
        forget_after=max(3600.0, 2 * (config.heartbeat_timeout + config.failure_grace)),
    )


def _delivery_lease(
    log: EventLog, service: FieldService, deliveries: DeliveryEngine, config: Config
) -> Lease:
    """The lease that makes this node the one sending the deliveries, not yet started: its
    terms go above the newest the log holds, and the engine claims each in the log."""
    from ..store.lease import DELIVERY_LEASE, Lease

    return Lease(
        log.url,  # type: ignore[attr-defined]
        name=DELIVERY_LEASE,
        holder=service.node_id,
        gained=deliveries.own,
        lost=deliveries.disown,
        interval=config.cluster_interval,
        newest=deliveries.newest_term,
    )


def _snapshotter(
    log: EventLog, service: FieldService, config: Config, lease: Lease | None
) -> Snapshotter | None:
    """What writes snapshots beside the server, if the log keeps them (not in memory)."""
    store = log.snapshots()
    if store is None:
        return None
    return Snapshotter(
        service,
        store,
        config.snapshot_policy(),
        snapshot_command(data_dir=config.data_dir, log_url=config.log, embedder=config.embedder),
        # several nodes: the holder of the deliveries' lease alone writes the snapshots
        may_write=None if lease is None else lease.valid,
    )


def _mcp_binding(runtime: Runtime, door: FrontDoor, config: Config) -> DeferredMcp | None:
    """MCP over HTTP at ``/mcp``, made at its first request, or None when the mcp extra
    is not installed."""
    if importlib.util.find_spec("mcp") is None:
        return None

    def build() -> McpHttpBinding:
        from ..transports.mcp.streamable_http import McpHttpBinding

        return McpHttpBinding(
            runtime,
            door,
            limits=config.limits,
            max_sessions=config.mcp_max_sessions,
            max_per_agent=config.max_push_per_agent,
            max_per_client=config.mcp_max_sessions_per_client,
            idle_timeout=config.mcp_idle_timeout,
        )

    return DeferredMcp(build)


def create_app(
    config: Config,
    *,
    log: EventLog | None = None,
    embedder: Embedder | None = None,
    webhook_key: bytes | None = None,
) -> Starlette:
    """The ASGI application serving one Field.

    Its log is ``log`` if given (the caller opened it, to report a busy data
    directory before the server starts), else the one ``config`` names,
    opened at start-up. The app closes the log when it stops. Likewise its
    embedder is ``embedder`` if given, else the one ``config`` names, and the
    key that seals webhook secrets ``webhook_key`` if given, else
    :func:`webhook_key_of` ``config``.
    """
    runtime = Runtime()
    # where webhooks may go (checked again, with DNS, before a SUBSCRIBE runs)
    egress = config.egress_policy()
    rate_limits = AgentRateLimits(config.agent_rate_limit())
    register_limit = RegisterLimit(Rate(config.register_rate, config.register_burst))
    # what the push hub's connections do, counted by the hub and read by GET /metrics
    counts = PushCounts() if config.metrics else None
    # HTTP responses by status class, counted by the ASGI layer and the connections' guard
    responses = no_responses() if config.metrics else None
    # the server's connection caps and deadlines (field serve's HTTP protocol enforces them)
    guard = ConnectionGuard(config.connection_limits(), responses=responses)
    metrics = None
    if counts is not None:
        metrics = Metrics(
            runtime,
            counts=counts,
            rate_limits=rate_limits,
            register_limit=register_limit,
            token=config.metrics_token,
            guard=guard,
            responses=responses,
        )
    observer = None
    if config.metrics or config.access_log:
        observer = Observer(metrics, access_log=config.access_log)
    door = FrontDoor(
        runtime, rate_limits=rate_limits, register_limit=register_limit, observer=observer
    )
    sources = SourcesBinding(runtime, tolerance=config.source_tolerance)
    http = HTTPBinding(runtime, door, limits=config.limits, sources=sources.status)
    sse = SSEBinding(runtime)
    rap = RapBinding(runtime, door, limits=config.limits, max_running=config.rap_max_invocations)
    registration = RegistrationBinding(runtime)
    console = ConsoleBinding(
        runtime, door, status=http.status, answered=None if metrics is None else metrics.answered
    )
    mcp = _mcp_binding(runtime, door, config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal log
        if log is None:
            log = open_log(config.data_dir, synchronous=config.sync, url=config.log)
        chosen = embedder or load_embedder(config.embedder)
        box = SecretBox(webhook_key or webhook_key_of(config))
        filter_time = config.filter_time()
        sinks = Sinks()  # the deliveries' progress, which SUBSCRIBE list shows
        service = FieldService(
            log,
            lambda: Field(
                limits=config.limits,
                persistent=log.persistent,
                operator_token=config.operator_token,
                embedder=chosen,
                egress=egress,
                secret_box=box,
                registration_policy=config.registration,
                max_agents=config.max_agents,
                filter_time=filter_time,
                delivery_progress=sinks,
            ),
            max_queue=config.max_queue,
            max_batch=config.max_batch,
            admission=config.admission_policy(),
            node_id=config.node_id or f"{socket.gethostname()}:{config.port}",
            embed_after_commit=chosen if embeds_after_commit(chosen) else None,
            on_batch=None if metrics is None else metrics.batch,
        )
        await service.start()
        presence = _shared_presence(log, service, config)
        liveness = Liveness(
            service,
            failure_grace=config.failure_grace,
            heartbeat_timeout=config.heartbeat_timeout,
            remote=presence,
        )
        # the monitor is built on the started service, so the service is told of it by the
        # method named for it rather than by its constructor
        service.tell_seen(liveness.seen)
        hub = PushHub(
            service,
            config.push,
            max_per_agent=config.max_push_per_agent,
            notify_rate=config.notify_rate_limit(),
            liveness=liveness,
            counts=counts,
        )
        service.listeners.add(rate_limits.published)
        if presence is not None:
            # the position each flush shares: the state's, whichever the writer holds now
            await presence.start(liveness.drain_changes, lambda: service.field.state.last_position)
        liveness.start()
        deliveries = DeliveryEngine(
            service,
            hub,
            config.delivery_settings(),
            policy=egress,
            secret_box=box,
            sinks=sinks,
        )
        # several nodes: the lease is built on the engine (it owns and disowns the sinks),
        # so the engine is given the lease's check as it starts, and the lease starts after
        lease = None if presence is None else _delivery_lease(log, service, deliveries, config)
        await deliveries.start(own=presence is None, sending=None if lease is None else lease.valid)
        if lease is not None:
            lease.start()
        if metrics is not None:
            metrics.instrument(service, hub)
        app.state.service = service
        app.state.push_hub = hub
        app.state.register_limit = register_limit
        app.state.rate_limits = rate_limits
        if mcp is not None:
            await mcp.start(service)
            app.state.mcp = mcp
        snapshotter = _snapshotter(log, service, config, lease)
        if snapshotter is not None:
            await snapshotter.start()
        nodes = None if presence is None else presence.nodes
        runtime.start(Running(service, hub, deliveries, snapshotter, nodes))
        await console.feed.start()  # the rates, sampled from now on for the console's charts
        state = service.field.state
        host = f"[{config.host}]" if ":" in config.host else config.host
        logger.info(
            "Field %s listening on http://%s:%d: %s log (%s) at position %d, epoch %d",
            state.field_id,
            host,
            config.port,
            log.backend,
            config.data_dir if config.data_dir is not None else "in memory",
            state.last_position,
            state.clock.value,
        )
        try:
            yield
        finally:
            if snapshotter is not None:
                await snapshotter.stop()
            if mcp is not None:
                await mcp.stop()
            await liveness.stop()
            await console.feed.stop_sampling()
            if presence is not None:
                await presence.stop()
            await rap.stop()
            await deliveries.stop()
            if lease is not None:  # let go only once no sink runs
                await lease.stop()
            hub.shutdown()
            runtime.stop()
            await service.stop()
            logger.info("Field %s stopped; log closed", state.field_id)

    routes = [
        *index_routes(metrics=metrics is not None, mcp=mcp is not None),
        *http.routes(),
        Route("/v1/subscriptions/{subscription_id}/events", sse.events, methods=["GET"]),
        *rap.routes(),
        *sources.routes(),
        *registration.routes(),
        *health_routes(runtime),
        *(metrics.routes() if metrics is not None else ()),
        Route(OPENAPI_PATH, openapi_endpoint, methods=["GET"]),
        *console.routes(),
    ]
    paths = FastPaths(
        operation=http.operation,
        subscription_events=sse.events,
        websocket=WebSocketBinding(runtime, door),
        source_event=sources.event,
        mcp=mcp,
    )
    app = application(
        paths, routes, lifespan, cors_origin=config.cors_origin, hosts=config.allowed_hosts()
    )
    # what uvicorn_config serves the app with: the guard, and the tally AccessLog counts in
    app.state.guard = guard
    app.state.responses = responses
    return app
