"""The composition root: one Field's server, built from its :class:`Config`.

:func:`create_app` is the one place that reads the configuration and wires the parts:
the HTTP binding and the bindings beside it (RAP, inbound sources, registration, metrics,
MCP over HTTP, the console, health), each given what it needs; and, when the app starts,
the log, the single writer, the push hub, liveness, durable delivery and the snapshotter,
stopped in the reverse order when it stops. No binding imports another to build it.
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
from ..engine.service import FieldService
from ..engine.snapshotter import Snapshotter, snapshot_command
from ..ranking.embedding import Embedder, embeds_after_commit, load_embedder
from ..store import WEBHOOK_KEY_FILENAME, EventLog, open_log
from ..store.keys import load_or_create_key
from ..transports.console import ConsoleBinding
from ..transports.health import health_routes
from ..transports.http import OPERATION_ROUTES, HTTPBinding, application
from ..transports.index import OPENAPI_PATH, index_routes
from ..transports.metrics import Metrics, Observer
from ..transports.openapi import openapi_endpoint
from ..transports.rap import RapBinding
from ..transports.registration import RegisterLimit, RegistrationBinding
from ..transports.sources import SourcesBinding
from .config import Config

if TYPE_CHECKING:
    from ..store.lease import Lease
    from ..store.presence import Presence

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


def http_binding(config: Config) -> HTTPBinding:
    """The HTTP binding ``config`` describes, not yet serving a Field."""
    return HTTPBinding(
        limits=config.limits,
        egress=config.egress_policy(),
        rate_limits=AgentRateLimits(config.agent_rate_limit()),
        register_limit=RegisterLimit(Rate(config.register_rate, config.register_burst)),
    )


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


def _delivery_lease(log: EventLog, deliveries: DeliveryEngine, config: Config) -> Lease:
    """The lease that makes this node the one sending the deliveries, started."""
    from ..store.lease import DELIVERY_LEASE, Lease

    lease = Lease(
        log.url,  # type: ignore[attr-defined]
        key=DELIVERY_LEASE,
        name="deliveries",
        gained=deliveries.own,
        lost=deliveries.disown,
        interval=config.cluster_interval,
    )
    deliveries.sending = lease.valid
    lease.start()
    return lease


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
    binding = http_binding(config)
    rap = RapBinding(binding, limits=config.limits, max_running=config.rap_max_invocations)
    binding.sources = SourcesBinding(binding, tolerance=config.source_tolerance)
    registration = RegistrationBinding(binding)
    if config.metrics:
        binding.metrics = Metrics(binding, token=config.metrics_token)
    if config.metrics or config.access_log:
        binding.door.observer = Observer(binding.metrics, access_log=config.access_log)
    if importlib.util.find_spec("mcp") is not None:  # the mcp extra
        from ..transports.mcp.streamable_http import McpHttpBinding

        binding.mcp = McpHttpBinding(
            binding,
            limits=config.limits,
            max_sessions=config.mcp_max_sessions,
            max_per_agent=config.max_push_per_agent,
            max_per_client=config.mcp_max_sessions_per_client,
            idle_timeout=config.mcp_idle_timeout,
        )

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
                egress=binding.egress,
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
        )
        await service.start()
        binding.service = service
        presence = _shared_presence(log, service, config)
        liveness = Liveness(
            service,
            failure_grace=config.failure_grace,
            heartbeat_timeout=config.heartbeat_timeout,
            remote=presence,
        )
        service.on_seen = liveness.seen
        binding.hub = PushHub(
            service,
            config.push,
            max_per_agent=config.max_push_per_agent,
            notify_rate=config.notify_rate_limit(),
            liveness=liveness,
            counts=None if binding.metrics is None else binding.metrics.counts,
        )
        service.listeners.add(binding.door.rate_limits.published)
        if presence is not None:
            await presence.start(liveness.drain_changes)
        liveness.start()
        deliveries = DeliveryEngine(
            service,
            binding.hub,
            config.delivery_settings(),
            policy=binding.egress,
            secret_box=box,
            sinks=sinks,
        )
        await deliveries.start(own=presence is None)
        binding.deliveries = deliveries
        lease = None if presence is None else _delivery_lease(log, deliveries, config)
        if binding.metrics is not None:
            binding.metrics.instrument()
        app.state.service = service
        app.state.push_hub = binding.hub
        app.state.register_limit = binding.door.register_limit
        app.state.rate_limits = binding.door.rate_limits
        if binding.mcp is not None:
            await binding.mcp.start()
            app.state.mcp = binding.mcp
        store = log.snapshots()
        if store is not None:
            binding.snapshotter = Snapshotter(
                service,
                store,
                config.snapshot_policy(),
                snapshot_command(
                    data_dir=config.data_dir, log_url=config.log, embedder=config.embedder
                ),
            )
            if lease is not None:  # several nodes: one writes the snapshots
                binding.snapshotter.may_write = lease.valid
            await binding.snapshotter.start()
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
            if binding.snapshotter is not None:
                await binding.snapshotter.stop()
            if binding.mcp is not None:
                await binding.mcp.stop()
            await liveness.stop()
            if presence is not None:
                await presence.stop()
            await rap.stop()
            await deliveries.stop()
            if lease is not None:  # let go only once no sink runs
                await lease.stop()
            binding.hub.shutdown()
            binding.service = None
            await service.stop()
            logger.info("Field %s stopped; log closed", state.field_id)

    routes = [
        *index_routes(metrics=binding.metrics is not None, mcp=binding.mcp is not None),
        Route("/v1/field/status", binding.field_status, methods=["GET"]),
        Route("/v1/agents", binding.agents, methods=["GET"]),
        Route("/v1/conflicts", binding.conflicts, methods=["GET"]),
        Route(
            "/v1/subscriptions/{subscription_id}/events",
            binding.subscription_events,
            methods=["GET"],
        ),
        *(
            Route(f"/v1/{name}", binding.operation_endpoint(operation), methods=["POST"])
            for name, operation in OPERATION_ROUTES.items()
        ),
        *rap.routes(),
        *binding.sources.routes(),
        *registration.routes(),
        *health_routes(binding),
        *(binding.metrics.routes() if binding.metrics is not None else ()),
        Route(OPENAPI_PATH, openapi_endpoint, methods=["GET"]),
        *ConsoleBinding(binding).routes(),
    ]
    return application(
        binding, routes, lifespan, cors_origin=config.cors_origin, hosts=config.allowed_hosts()
    )
