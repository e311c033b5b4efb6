"""``GET /metrics``: the Field's numbers in the Prometheus text format.

Each server has a registry of its own (never prometheus-client's global one),
so several servers in one process keep their numbers apart. Most numbers are
read at scrape time from the state the server keeps anyway (:class:`_FieldCollector`):
the log's position and epoch, the writer's queue, agents by status, connections
by transport, outbox depths, admission and rate-limit refusals, webhook
deliveries. The few counted as they happen are kept cheap:

* operations (:meth:`Metrics.operation`): one counter and one histogram per
  (transport, operation, outcome), whose labelled children are looked up once
  and cached, so a request costs a dict lookup, an increment and an observation;
* the writer's group commits and the push hub's routing of each committed batch
  (a histogram observation per batch, not per operation or notification);
* notifications written and streams resumed: plain integers the push hub and
  the senders keep (:class:`~field.engine.push.PushCounts`), turned into
  counters at scrape time;
* each notification's latency, from its entry's commit to its write on the socket
  (to the MCP read that hands it out; to the receiver's 2xx, for a webhook or RAP): a
  bucket count and a sum kept by the senders (:class:`~field.engine.latency.Latency`),
  turned into the histogram ``field_notification_latency_seconds`` at scrape time.

Measured: 1.2 us per operation, 24 ns per notification, 0.6 us per committed
batch (``benchmarks/README.md``, "Metrics on the hot path").

**Cardinality is bounded**: no label names an agent, a subscription or a
client. Every label value is from a closed set (the operations, the error
codes, the transports, the event names, the close reasons); anything else is
counted as ``other``.

A scrape runs on the event loop and walks every agent (their statuses) and
every push connection (their outbox depths) once: its cost grows with both,
and nothing else's does.

A scrape shows no ``_created`` sample, and in the text format the outbox's gauge
histogram is a histogram (:class:`_Exposed`).

``--no-metrics`` turns all of it off: no ``/metrics`` route, nothing counted.
``--metrics-token-file`` makes ``/metrics`` ask for that bearer token;
without it anyone who reaches the port may read the numbers (no secret is
among them; the default address is loopback).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..contract.errors import HTTP_STATUS, Code, FieldError
from ..contract.model import AGENT_STATUSES, OPERATIONS, StoredEntry
from ..core.context import Outcome
from ..engine.admission import Mode
from ..engine.latency import LATENCY_BUCKETS as NOTIFICATION_BUCKETS
from ..engine.latency import Latency
from ..engine.listeners import Listener
from ..subscriptions.events import SUBSCRIPTION_EVENTS
from .access import Access, Responses, no_responses
from .index import METRICS_PATH

if TYPE_CHECKING:
    from ..engine.delivery import DeliveryEngine
    from ..engine.push import PushHub
    from ..engine.ratelimits import AgentRateLimits
    from ..engine.router import PushCounts
    from ..engine.service import FieldService
    from .connections import ConnectionGuard
    from .door import RegisterLimit
    from .runtime import Runtime

operation_logger = logging.getLogger("field.operation")

#: What a label value is when it is none of its set's.
OTHER = "other"
#: The outcome label of an operation that succeeded (else its error code).
OK = "ok"
_OPERATIONS = frozenset(OPERATIONS)
_CODES = frozenset(HTTP_STATUS)
_EVENTS = frozenset(SUBSCRIPTION_EVENTS)
_AGENT_STATUSES = frozenset(AGENT_STATUSES)
#: The transports operations come in by.
OPERATION_TRANSPORTS = frozenset({"http", "websocket", "mcp", "rap"})
#: The hub's connection kinds, as the ``transport`` label names them.
TRANSPORTS = {"ws": "websocket", "sse": "sse", "webhook": "webhook", "rap": "rap"}
#: The connection kinds whose notifications' latency is shown, as the label names them:
#: each of :data:`TRANSPORTS` always, ``mcp`` once a subscription resource's reads report it.
LATENCY_TRANSPORTS = {**TRANSPORTS, "mcp": "mcp"}
#: The bounds a push connection is ended at (its close reason).
_OVERFLOW_REASONS = frozenset({"outbox overflow", "send timed out", "keepalive ping timeout"})
#: Seconds: an operation answers in well under a millisecond to a few seconds.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Operations per group commit: 1 up to ``--max-batch`` (512 by default).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Seconds to route one committed batch to every subscription.
ROUTING_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
#: Frames queued in one push connection's outbox (``--outbox-frames``: 10,000).
OUTBOX_BUCKETS = (0, 1, 10, 100, 1000, 10_000, 100_000)


def _bounded(value: str | None, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


class Metrics:
    """The numbers of one server, and its registry."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        counts: PushCounts,
        rate_limits: AgentRateLimits,
        register_limit: RegisterLimit | None = None,
        token: str | None = None,
        guard: ConnectionGuard | None = None,
        responses: Responses | None = None,
    ) -> None:
        """``guard``: the server's connection guard, whose counts are exposed (None: not
        served by ``field serve``'s protocol); ``responses``: the tally of HTTP responses
        by status class, shared with the guard and the ASGI layer (None: a new one)."""
        #: the Field's parts, read at scrape time while it runs
        self.runtime = runtime
        #: the bearer token ``/metrics`` asks for (None: open)
        self.token = token
        #: what the push hub's connections do, counted by the hub and read at scrape time
        self.counts = counts
        #: the per-agent limit on operations and REGISTER's per-client rate, whose
        #: refusals are counted
        self.rate_limits = rate_limits
        self.register_limit = register_limit
        #: the server's connection counts
        self.guard = guard
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._operations = Counter(
            "field_operations",
            "Operations answered, by transport, operation and outcome (ok or the error code).",
            ["transport", "operation", "outcome"],
            registry=registry,
        )
        self._latency = Histogram(
            "field_operation_duration_seconds",
            "Seconds from a request's arrival to its answer (queue, run, commit), by operation.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._batches = Histogram(
            "field_writer_batch_operations",
            "Operations the single writer ran and committed together (one group commit).",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self._routing = Histogram(
            "field_push_match_seconds",
            "Seconds to match one committed batch against every subscription and queue "
            "its notifications.",
            buckets=ROUTING_BUCKETS,
            registry=registry,
        )
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        #: HTTP responses sent, by status class (``access.count_response``): counted by
        #: the ASGI layer around the app and by the connections' own refusals
        self.responses = no_responses() if responses is None else responses
        registry.register(_FieldCollector(self))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)

    # -- counted as it happens --------------------------------------------------------

    def operation(
        self, transport: str, operation: str | None, outcome: str, seconds: float
    ) -> None:
        """One operation answered (``outcome``: ``ok`` or its error code)."""
        key = (transport, operation or OTHER, outcome)
        children = self._children.get(key)
        if children is None:
            children = self._child(*key)
        children[0].inc()
        children[1].observe(seconds)

    def _child(self, transport: str, operation: str, outcome: str) -> tuple[Any, Any]:
        """The labelled counter and histogram of one key, made once; every label bounded
        (a key of unknown values shares the ``other`` children, and is not kept)."""
        name = _bounded(operation, _OPERATIONS)
        result = outcome if outcome == OK else _bounded(outcome, _CODES)
        via = transport if transport in OPERATION_TRANSPORTS else OTHER
        children = (self._operations.labels(via, name, result), self._latency.labels(name))
        if (via, name, result) == (transport, operation, outcome):
            self._children[(transport, operation, outcome)] = children
        return children

    def instrument(self, service: FieldService, hub: PushHub) -> None:
        """Time the push hub's routing of every batch ``service`` commits, from now on
        (once both have started)."""
        service.listeners.wrap(hub.publish, self.timed_listener)

    def batch(self, operations: int) -> None:
        """The writer committed ``operations`` together (the service's ``on_batch``)."""
        self._batches.observe(operations)

    def timed_listener(self, listener: Listener) -> Listener:
        """``listener`` (the push hub's ``publish``), its steps timed together into
        ``field_push_match_seconds`` (the time between them is not counted)."""
        observe = self._routing.observe
        clock = time.perf_counter

        def timed(entries: list[StoredEntry]) -> Iterator[None]:
            spent = 0.0
            steps = listener(entries) or iter(())
            try:
                while True:
                    started = clock()
                    try:
                        next(steps)
                    except StopIteration:
                        return
                    finally:
                        spent += clock() - started
                    yield
            finally:
                observe(spent)

        return timed

    def answered(self) -> tuple[float, float]:
        """Operations answered since start-up (every transport and outcome) and the seconds
        they took in all: what the console samples once a second."""
        count = seconds = 0.0
        for metric in self._latency.collect():
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    count += sample.value
                elif sample.name.endswith("_sum"):
                    seconds += sample.value
        return count, seconds

    # -- the endpoint -------------------------------------------------------------------

    def routes(self) -> list[Route]:
        return [Route(METRICS_PATH, self.endpoint, methods=["GET"])]

    async def endpoint(self, request: Request) -> Response:
        if self.token is not None and not _authorized(request, self.token):
            error = FieldError(
                "/metrics needs the metrics token as a bearer token",
                code=Code.UNAUTHENTICATED,
                recoverable=True,
                suggested_action="Send 'Authorization: Bearer <the --metrics-token-file token>'.",
            )
            headers = {"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"}
            body = orjson.dumps(error.to_response())
            return Response(body, error.http_status, headers, media_type="application/json")
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        exposed = _Exposed(self.registry, text=not content_type.startswith(_OPENMETRICS))
        return Response(encoder(exposed), media_type=None, headers=_type(content_type))


#: The media type of the OpenMetrics exposition (else it is the text format, 0.0.4).
_OPENMETRICS = "application/openmetrics-text"
#: The metric types whose prometheus-client metrics make a ``_created`` sample.
_CREATED = frozenset({"counter", "histogram", "summary"})


class _Exposed(Collector):
    """The registry as a scrape shows it, in either format:

    * without the ``_created`` samples prometheus-client makes for each counter and
      histogram (one series more for each of their series, which no dashboard reads).
      Dropped here, for this registry alone: ``disable_created_metrics()`` and
      ``PROMETHEUS_DISABLE_CREATED_SERIES`` would change every registry of the process,
      those of an application that embeds the Field included;
    * in the text format (``text``), each gauge histogram as a histogram of the same name,
      its ``_gcount`` and ``_gsum`` as ``_count`` and ``_sum``: the format has no gauge
      histogram, and prometheus-client writes one as a histogram of buckets alone beside
      two gauges, which text parsers read as three families."""

    def __init__(self, registry: CollectorRegistry, *, text: bool) -> None:
        self._registry = registry
        self._text = text

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if metric.type in _CREATED:
                created = metric.name + "_created"
                samples = [s for s in metric.samples if s.name != created]
                if len(samples) < len(metric.samples):
                    metric = _copy(metric, metric.type, samples)
            elif self._text and metric.type == "gaugehistogram":
                renamed = {f"{metric.name}_gcount": "_count", f"{metric.name}_gsum": "_sum"}
                samples = [
                    s._replace(name=metric.name + renamed[s.name]) if s.name in renamed else s
                    for s in metric.samples
                ]
                metric = _copy(metric, "histogram", samples)
            yield metric


def _copy(metric: Metric, kind: str, samples: list[Sample]) -> Metric:
    """``metric`` as a metric of type ``kind`` with ``samples``."""
    copy = Metric(metric.name, metric.documentation, kind, metric.unit)
    copy.samples = samples
    return copy


def _authorized(request: Request, token: str) -> bool:
    """Whether ``request`` carries ``token`` as its bearer token (compared in constant time)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _type(content_type: str) -> dict[str, str]:
    return {"Content-Type": content_type, "Cache-Control": "no-store"}


class Observer:
    """What the transports tell of every operation they answer: counted (:class:`Metrics`)
    and, with ``--access-log``, logged: in the access line of the HTTP request it came in
    (:class:`~.access.Access`), else in a line of its own (logger ``field.operation``)."""

    __slots__ = ("metrics", "access_log")

    def __init__(self, metrics: Metrics | None, *, access_log: bool) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def operation(
        self,
        transport: str,
        operation: str | None,
        started: float,
        result: Outcome | FieldError,
        body: Any = None,
        *,
        access: Access | None = None,
        request_id: str | None = None,
    ) -> None:
        """An operation that arrived at ``started`` (``time.perf_counter``) was answered.

        ``access``: the record of the HTTP request it was the whole of, whose access line
        tells of it. Without one (an envelope on a WebSocket, a RAP invocation run once its
        request was answered) it has a line of its own, naming ``request_id``: the id of
        the request it came in (the WebSocket's handshake, the invocation)."""
        seconds = time.perf_counter() - started
        outcome = result.code if isinstance(result, FieldError) else OK
        if self.metrics is not None:
            self.metrics.operation(transport, operation, outcome, seconds)
        if not self.access_log:
            return
        agent = result.agent_id if isinstance(result, Outcome) else None
        message_id = message_id_of(body)
        if access is not None:
            access.operated(operation, outcome, agent, message_id)
            return
        status = result.http_status if isinstance(result, FieldError) else 200
        operation_logger.info(
            "%s %s %d %s %.1f ms%s%s%s",
            transport,
            operation or "-",
            status,
            outcome,
            seconds * 1000,
            f" agent={agent}" if agent else "",
            f" message_id={message_id}" if message_id else "",
            f" request_id={request_id}" if request_id else "",
            extra={
                "transport": transport,
                "operation": operation,
                "status": status,
                "outcome": outcome,
                "duration_ms": round(seconds * 1000, 3),
                "agent": agent,
                "message_id": message_id,
                "request_id": request_id,
            },
        )


#: Longest envelope id shown in a log line.
MAX_MESSAGE_ID = 128


def message_id_of(body: Any) -> str | None:
    """An envelope's ``id``, if it is one a log line may show: visible ASCII, bounded."""
    if not isinstance(body, dict):
        return None
    value = body.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_MESSAGE_ID:
        return None
    return value if value.isascii() and value.isprintable() and " " not in value else None


class _FieldCollector(Collector):
    """The numbers read from the server's state at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()  # generated at scrape time: nothing to check against the registry

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        info = GaugeMetricFamily(
            "field_build_info", "The server's version (always 1).", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info
        yield from _guard_metrics(metrics.guard)
        yield _responses(metrics.responses)
        running = metrics.runtime.current
        if running is None:  # starting or stopping
            return
        yield from _service_metrics(running.service, metrics)
        yield from _push_metrics(running.hub, metrics.counts, metrics.guard)
        yield from _delivery_metrics(running.deliveries)


def _responses(responses: Responses) -> Metric:
    counted = CounterMetricFamily(
        "field_http_responses",
        "HTTP responses the server sent, by status class (1xx: WebSocket handshakes "
        "accepted), refusals at accept and before a request was read whole included.",
        labels=["class"],
    )
    for n in range(1, 6):
        counted.add_metric([f"{n}xx"], responses[n])
    if responses[0]:
        counted.add_metric([OTHER], responses[0])
    return counted


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _service_metrics(service: FieldService, metrics: Metrics) -> Iterator[Metric]:
    state = service.field.state
    yield _gauge("field_log_position", "The log's last durable position.", state.last_position)
    yield _gauge("field_epoch", "The Field's Lamport clock (its epoch).", state.clock.value)
    yield _gauge(
        "field_node_lag",
        "Log entries other nodes appended that this node has not applied yet (0 on one node).",
        service.lag,
    )
    yield _gauge(
        "field_log_writable",
        "1 while the log takes writes; 0 while it refuses them (disk full, locked).",
        1 if service.refusing is None else 0,
    )
    yield _gauge("field_writer_running", "1 while the single writer runs.", int(service.running))
    yield _gauge(
        "field_writer_queue_depth", "Operations waiting for the single writer.", service.queued
    )
    yield _gauge(
        "field_embedding_queue_units",
        "Units committed but not embedded yet (a sentence model embeds after the commit).",
        state.index.waiting if service.embeddings is not None else 0,
    )
    yield _gauge(
        "field_publish_held_entries",
        "Committed entries whose push waits for their units' embeddings.",
        service.held,
    )
    yield CounterMetricFamily(
        "field_writer_rebuilds",
        "Times the state was rebuilt from the log (a failed append or apply).",
        value=service.rebuilds,
    )
    admission = service.admission
    yield _gauge(
        "field_admission_delay_seconds",
        "The last sampled delay: the event loop's lag or the oldest queued job's wait.",
        admission.delay,
    )
    shedding = GaugeMetricFamily(
        "field_admission_shedding",
        "1 while a class of work is refused with OVERLOADED (admission control).",
        labels=["work"],
    )
    refused = CounterMetricFamily(
        "field_admission_refused",
        "Requests refused with 503 OVERLOADED by admission control, by class of work.",
        labels=["work"],
    )
    for work, controller in admission.controllers.items():
        shedding.add_metric([work.value], int(controller.mode is Mode.SHEDDING))
        refused.add_metric([work.value], controller.shed)
    yield shedding
    yield refused
    limited = CounterMetricFamily(
        "field_rate_limited",
        "Requests refused with 429 RATE_LIMITED: an agent's operations over --agent-rate, "
        "REGISTER over --register-rate.",
        labels=["limit"],
    )
    limited.add_metric(["agent"], metrics.rate_limits.refused)
    if metrics.register_limit is not None:
        limited.add_metric(["register"], metrics.register_limit.refused)
    yield limited
    statuses = Tally(
        agent.status if agent.status in _AGENT_STATUSES else OTHER
        for agent in state.agents.values()
    )
    agents = GaugeMetricFamily("field_agents", "Registered agents, by status.", labels=["status"])
    for status in AGENT_STATUSES:
        agents.add_metric([status], statuses.get(status, 0))
    if statuses.get(OTHER):
        agents.add_metric([OTHER], statuses[OTHER])
    yield agents
    yield _gauge(
        "field_subscriptions_active",
        "Active subscriptions.",
        sum(len(ids) for ids in state.active_subscriptions.values()),
    )


def _guard_metrics(guard: ConnectionGuard | None) -> Iterator[Metric]:
    if guard is None:
        return
    yield _gauge(
        "field_connections_open",
        "Open TCP connections the server counts (HTTP and WebSocket together).",
        guard.open,
    )
    refused = CounterMetricFamily(
        "field_connections_refused",
        "Connections refused at accept: past --max-connections (503 OVERLOADED) or a "
        "client's --max-connections-per-client (429).",
        labels=["cap"],
    )
    for cap, count in guard.refused_total.items():
        refused.add_metric([cap], count)
    yield refused


def _push_metrics(
    hub: PushHub, counts: PushCounts, guard: ConnectionGuard | None
) -> Iterator[Metric]:
    kinds: Tally[str] = Tally()
    depths = [0] * (len(OUTBOX_BUCKETS) + 1)
    queued = 0
    for connection in hub.connections:
        kinds[TRANSPORTS.get(connection.kind, OTHER)] += 1
        depth = len(connection.outbox)
        queued += depth
        depths[_bucket(depth, OUTBOX_BUCKETS)] += 1
    connections = GaugeMetricFamily(
        "field_connections",
        "Open connections by transport: push connections (websocket, sse), durable "
        "deliveries holding a stream (webhook, rap), and http: every other open TCP "
        "connection.",
        labels=["transport"],
    )
    if guard is not None:
        connections.add_metric(["http"], max(0, guard.open - kinds["websocket"] - kinds["sse"]))
    for transport in TRANSPORTS.values():
        connections.add_metric([transport], kinds[transport])
    yield connections
    cumulative, buckets = 0, []
    for bound, count in zip((*OUTBOX_BUCKETS, float("inf")), depths, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
    yield GaugeHistogramMetricFamily(
        "field_outbox_frames",
        "Frames queued per push connection (its outbox), over every open connection.",
        buckets=buckets,
        gsum_value=queued,
    )
    overflows = CounterMetricFamily(
        "field_outbox_overflows",
        "Push connections ended for falling behind (then close 4008 or an overflow event), "
        "by transport and the bound reached.",
        labels=["transport", "reason"],
    )
    for (kind, reason), count in sorted(_merged(counts.overflows, _OVERFLOW_REASONS).items()):
        overflows.add_metric([TRANSPORTS.get(kind, OTHER), reason], count)
    yield overflows
    set_aside = CounterMetricFamily(
        "field_streams_set_aside",
        "Streams set aside for new events because their agent used its share of filter "
        "time (each then catches up from the log on its connection), by transport.",
        labels=["transport"],
    )
    by_transport: Tally[str] = Tally(dict.fromkeys(TRANSPORTS.values(), 0))
    for kind, count in counts.set_aside.items():
        by_transport[TRANSPORTS.get(kind, OTHER)] += count
    for transport, count in sorted(by_transport.items()):
        set_aside.add_metric([transport], count)
    yield set_aside
    sent = CounterMetricFamily(
        "field_notifications_sent",
        "Notifications written to push connections and delivered to webhooks and RAP "
        "runtimes, by transport and event.",
        labels=["transport", "event"],
    )
    for kind, events in sorted(counts.sent.items()):
        by_event: Tally[str] = Tally()
        for event, count in events.items():
            by_event[_bounded(event, _EVENTS)] += count
        for event, count in sorted(by_event.items()):
            sent.add_metric([TRANSPORTS.get(kind, OTHER), event], count)
    yield sent
    resumes = CounterMetricFamily(
        "field_stream_resumes",
        "Streams attached with a cursor, by transport and whether the cursor was honoured "
        "(recovered false: the client missed what happened in between).",
        labels=["transport", "recovered"],
    )
    for (kind, recovered), count in sorted(counts.resumes.items()):
        resumes.add_metric([TRANSPORTS.get(kind, OTHER), str(recovered).lower()], count)
    yield resumes
    yield _notification_latency(counts.latency)


def _notification_latency(by_kind: dict[str, Latency]) -> Metric:
    """The senders' latency tallies as one histogram by transport: each of
    :data:`TRANSPORTS` shown, another kind once it has notifications (a console's never
    does), as ``other`` if it is none of :data:`LATENCY_TRANSPORTS`."""
    merged = {transport: Latency() for transport in TRANSPORTS.values()}
    for kind, latency in by_kind.items():
        transport = LATENCY_TRANSPORTS.get(kind, OTHER)
        if transport not in merged and not latency.count:
            continue
        into = merged.setdefault(transport, Latency())
        into.counts = [a + b for a, b in zip(into.counts, latency.counts, strict=True)]
        into.sum += latency.sum
    histogram = HistogramMetricFamily(
        "field_notification_latency_seconds",
        "Seconds from a notification's log entry (its commit) to its write on the socket "
        "(websocket, sse), the MCP read that hands it out (mcp) or its receiver's 2xx "
        "(webhook, rap), by transport; replays and debounce windows included.",
        labels=["transport"],
    )
    bounds = [*(repr(bound) for bound in NOTIFICATION_BUCKETS), "+Inf"]
    for transport, latency in merged.items():
        buckets = list(zip(bounds, latency.cumulative(), strict=True))
        histogram.add_metric([transport], buckets, latency.sum)
    return histogram


def _merged(counts: Tally[tuple[str, str]], reasons: frozenset[str]) -> Tally[tuple[str, str]]:
    """``counts`` with every reason not in ``reasons`` counted as ``other``."""
    merged: Tally[tuple[str, str]] = Tally()
    for (kind, reason), count in counts.items():
        merged[(kind, _bounded(reason, reasons))] += count
    return merged


def _bucket(value: int, bounds: tuple[int, ...]) -> int:
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)


def _delivery_metrics(engine: DeliveryEngine) -> Iterator[Metric]:
    states: Tally[tuple[str, str]] = Tally(
        (sink.kind, sink.state) for sink in engine.sinks.values()
    )
    deliveries = GaugeMetricFamily(
        "field_deliveries",
        "Durable deliveries (webhook, rap) by state: active, failing, suspended.",
        labels=["transport", "state"],
    )
    for kind in ("webhook", "rap"):
        for state in ("active", "failing", "suspended"):
            deliveries.add_metric([kind, state], states.get((kind, state), 0))
    yield deliveries
    attempts = CounterMetricFamily(
        "field_delivery_attempts",
        "POSTs to webhooks and RAP runtimes, by result: delivered (2xx), retry (no answer, "
        "408, 429, 5xx: tried again later) or refused (any other answer).",
        labels=["transport", "result"],
    )
    for (kind, result), count in sorted(engine.attempts.items()):
        attempts.add_metric([kind, result], count)
    yield attempts
    changes = CounterMetricFamily(
        "field_delivery_state_changes",
        "Deliveries that became failing (fail), active again (recover), suspended "
        "(suspend) or ended (end).",
        labels=["transport", "action"],
    )
    for (kind, action), count in sorted(engine.changes.items()):
        changes.add_metric([kind, action], count)
    yield changes
