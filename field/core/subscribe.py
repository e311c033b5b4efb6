"""SUBSCRIBE (spec 6.7), and the durable deliveries it may create.

A subscription is read by its agent (``stream``: WebSocket, SSE, polling)
or delivered by the Field (``webhook``, ``rap``; see
:mod:`field.subscriptions.delivery`). For a durable delivery the
``subscription.created`` entry carries, beside the public subscription,
the delivery's record: the webhook URL and its secret *sealed* with the
server's key (the log never holds a secret the Field signs with), or the
RAP call it answers. The delivery's progress is in the log too:
``delivery.acked`` entries (the cursor each delivery has been acknowledged
up to, many per entry) and ``delivery.changed`` entries (its state).

The delivery engine (``field/engine/delivery.py``) reports progress
through :func:`ack_entries` and :func:`change_entries`, which write
those entries like any operation: durable before they count. With several
nodes on one log, the sender's entries carry the term under which it holds
the deliveries' lease, claimed first by a ``delivery.term`` entry
(:func:`term_entries`); the Field refuses an entry whose term the log holds
a newer one than (:meth:`Field.ack_deliveries <field.core.field.Field.ack_deliveries>`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..contract.errors import AuthError, Code, InvalidPayload, NotFound, StateError
from ..contract.model import Limits, LogEntry
from ..subscriptions import delivery as deliveries
from ..subscriptions.events import SUBSCRIPTION_EVENTS
from ..subscriptions.filtering import compile_filter
from ..subscriptions.stream import format_cursor
from . import validation
from .authority import OPERATOR_ID
from .context import Context, Outcome
from .secrets import secret_key

if TYPE_CHECKING:
    from .field import Field
    from .state import FieldState


def subscribe(field: Field, ctx: Context) -> Outcome:
    """SUBSCRIBE: subscribe, unsubscribe, resume a delivery, or list."""
    request = validation.subscribe_payload(ctx.envelope.payload, field.limits, SUBSCRIPTION_EVENTS)
    assert ctx.agent is not None  # guaranteed by handle(): SUBSCRIBE is authenticated
    agent_id = ctx.agent.id
    state = field.state
    action = request["action"]
    if action == "list":
        mine = sorted(state.active_subscriptions.get(agent_id, ()))
        subscriptions = [subscription_wire(field, s) for s in mine]
        return Outcome({"status": "ok", "subscriptions": subscriptions, "epoch": ctx.epoch})
    # the operator may cancel or resume any agent's subscription (an extension)
    owner = _owner_for(state, request["id"], ctx) if action in ("unsubscribe", "resume") else ""
    if action == "unsubscribe":
        subscription = active_subscription(state, request["id"], owner)
        reason = "unsubscribed" if owner == agent_id else "cancelled by the operator"
        data = {"subscription_id": subscription["id"], "reason": reason}
        entry = LogEntry(ctx.epoch, "subscription.cancelled", data, agent_id, ctx.now)
        cancelled = {**subscription_wire(field, subscription["id"]), "status": "cancelled"}
        return Outcome(_answer(subscription["id"], cancelled, ctx), [entry])
    if action == "resume":
        subscription = owned_subscription(state, request["id"], owner)
        record = state.deliveries.get(subscription["id"])
        if record is None:
            raise StateError(
                f"subscription {subscription['id']} is read by its agent: there is no "
                "delivery to resume",
                code=Code.INVALID_TRANSITION,
                recoverable=False,
                suggested_action="Reconnect to its stream with your last cursor instead.",
            )
        deliveries.step(record["state"], "resume", subscription["id"])
        data = {"subscription_id": subscription["id"], "action": "resume", "reason": None}
        entry = LogEntry(ctx.epoch, "delivery.changed", data, agent_id, ctx.now)
        body = _answer(subscription["id"], subscription_wire(field, subscription["id"]), ctx)
        body["subscription"]["delivery"]["state"] = "active"
        body["resumed"] = True
        return Outcome(body, [entry])
    return _create(field, ctx, request)


def _owner_for(state: FieldState, subscription_id: Any, ctx: Context) -> str:
    """Whose subscription ``subscription_id`` the caller may act on: the caller's own, or,
    for the operator, that of the agent it belongs to (refusals are the owner checks')."""
    assert ctx.agent is not None
    subscription = state.subscriptions.get(subscription_id)
    if ctx.agent.id == OPERATOR_ID and subscription is not None:
        return str(subscription["agent_id"])
    return ctx.agent.id


def _answer(subscription_id: str, wire: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {
        "status": "ok",
        "subscription_id": subscription_id,
        "subscription": wire,
        "epoch": ctx.epoch,
    }


def _create(field: Field, ctx: Context, request: dict[str, Any]) -> Outcome:
    assert ctx.agent is not None
    agent_id = ctx.agent.id
    state = field.state
    active = state.active_subscriptions.get(agent_id, set())
    if ctx.rap is not None:
        sent = _rap_subscription(field, agent_id, ctx.rap.group_id, ctx.rap.tool_call_id)
        if sent is not None:  # the runtime sent the call again: one subscription, one result
            return Outcome(_answer(sent, subscription_wire(field, sent), ctx))
    if request["name"] is not None:
        named = _named(field, agent_id, request["name"])
        if named is not None:  # subscribing again by name: the one it already has
            return Outcome(_existing(field, ctx, request, named))
    cap = field.limits.max_subscriptions_per_agent
    if len(active) >= cap:
        raise StateError(
            f"agent {agent_id!r} already has {cap} active subscriptions",
            code=Code.SUBSCRIPTION_LIMIT,
            suggested_action="Unsubscribe from one first, or widen an existing one.",
        )
    if request["filter"] is not None:
        compile_filter(request["filter"])  # INVALID_FILTER; the log keeps the text only
    subscription_id = field.new_id("sub")
    subscription: dict[str, Any] = {
        "id": subscription_id,
        "agent_id": agent_id,
        "events": request["events"],
        "min_relevance": request["min_relevance"],
        "debounce_ms": request["debounce_ms"],
        "include_own": request["include_own"],
        "status": "active",
        "created_epoch": ctx.epoch,
    }
    if request["timeout"] is not None:
        subscription["timeout"] = request["timeout"]
    for key in ("filter", "bindings", "name"):  # absent when not given: older entries lack them
        if request[key] is not None:
            subscription[key] = request[key]
    data: dict[str, Any] = {"subscription": subscription}
    secret: str | None = None
    if ctx.rap is not None:
        record = _rap_record(field, ctx, agent_id)
    elif request["delivery"]["type"] == "webhook":
        secret = request["delivery"]["secret"] or field.new_secret()
        record = _webhook_record(field, request["delivery"]["url"], secret, subscription_id)
    else:
        record = None
    if record is not None:
        subscription["delivery"] = deliveries.public_delivery(record)
        data["delivery"] = record
    entry = LogEntry(ctx.epoch, "subscription.created", data, agent_id, ctx.now)
    shown = _with_filter(subscription, None)
    if secret is not None:  # the secret is shown this once, and kept only sealed
        shown["delivery"] = {**subscription["delivery"], "secret": secret}
    response: dict[str, Any] = {
        "status": "ok",
        "subscription_id": subscription_id,
        "subscription": shown,
        "epoch": ctx.epoch,
        "cursor": None,
        "ws_url": "/v1/ws",
        "sse_url": f"/v1/subscriptions/{subscription_id}/events",
        "created": True,
    }

    def with_cursor(positions: list[int]) -> None:
        response["cursor"] = format_cursor(field.field_tag, positions[0])

    return Outcome(response, [entry], on_durable=with_cursor)


def _named(field: Field, agent_id: str, name: str) -> str | None:
    """The agent's active subscription called ``name``, if it has one."""
    subscriptions = field.state.subscriptions
    for subscription_id in field.state.active_subscriptions.get(agent_id, ()):
        if subscriptions[subscription_id].get("name") == name:
            return subscription_id
    return None


def _existing(
    field: Field, ctx: Context, request: dict[str, Any], subscription_id: str
) -> dict[str, Any]:
    """SUBSCRIBE's answer for a named subscription the agent already has: the same one if
    the definition is the same (``created: false``), else ``SUBSCRIPTION_NAME_TAKEN``."""
    subscription = field.state.subscriptions[subscription_id]
    record = field.state.deliveries.get(subscription_id)
    differs = sorted(
        key
        for key, value in _definition(request).items()
        if value != _definition_of(field, subscription, record).get(key)
    )
    if differs:
        raise StateError(
            f"this agent already has a subscription named {request['name']!r} "
            f"({subscription_id}) with another {', '.join(differs)}",
            code=Code.SUBSCRIPTION_NAME_TAKEN,
            recoverable=False,
            details={"subscription_id": subscription_id, "differs": differs},
            suggested_action="Unsubscribe it first to change its definition, or choose "
            "another name.",
        )
    return {
        **_answer(subscription_id, subscription_wire(field, subscription_id), ctx),
        "cursor": format_cursor(field.field_tag, subscription["created_position"]),
        "ws_url": "/v1/ws",
        "sse_url": f"/v1/subscriptions/{subscription_id}/events",
        "created": False,
    }


def _definition(request: dict[str, Any]) -> dict[str, Any]:
    """What makes two SUBSCRIBE requests of one name the same subscription."""
    delivery = request["delivery"]
    return {
        "events": request["events"],
        "min_relevance": request["min_relevance"],
        "debounce_ms": request["debounce_ms"],
        "include_own": request["include_own"],
        "timeout": request["timeout"],
        "filter": request["filter"],
        "bindings": request["bindings"],
        "delivery": {k: v for k, v in delivery.items() if k != "secret"},
        # a secret left out is the one the Field made; a secret given must be the one kept
        **({"secret": delivery["secret"]} if delivery.get("secret") is not None else {}),
    }


def _definition_of(
    field: Field, subscription: dict[str, Any], record: dict[str, Any] | None
) -> dict[str, Any]:
    """:func:`_definition` of a stored subscription and its delivery record."""
    if record is None:
        delivery: dict[str, Any] = {"type": "stream"}
    elif record["type"] == "webhook":
        delivery = {"type": "webhook", "url": record["url"]}
    else:
        delivery = {"type": record["type"]}
    definition = {
        "events": subscription["events"],
        "min_relevance": subscription["min_relevance"],
        "debounce_ms": subscription["debounce_ms"],
        "include_own": subscription["include_own"],
        "timeout": subscription.get("timeout"),
        "filter": subscription.get("filter"),
        "bindings": subscription.get("bindings"),
        "delivery": delivery,
    }
    if record is not None and record["type"] == "webhook":
        definition["secret"] = field.secret_box.open(record["secret"], context=subscription["id"])
    return definition


def _webhook_record(field: Field, url: str, secret: str, subscription_id: str) -> dict[str, Any]:
    """A webhook delivery: its URL, if the Field may reach it, and its secret, sealed."""
    checked = field.egress.check_url(url)
    if isinstance(checked, str):
        raise refused_url(checked)
    try:
        secret_key(secret)
    except ValueError as exc:
        raise InvalidPayload(
            f"subscription.delivery.secret is not a webhook secret: {exc}",
            suggested_action='Leave it out (the Field makes one), or send "whsec_" and the '
            "base64 of 24 to 64 random bytes.",
        ) from None
    return {
        "type": "webhook",
        "url": url,
        "secret": field.secret_box.seal(secret, context=subscription_id),
    }


def refused_url(reason: str, name: str = "subscription.delivery.url") -> InvalidPayload:
    """The error of a webhook URL (or a RAP ``callback_url``) the Field may not deliver
    to, saying why."""
    return InvalidPayload(
        f"{name} is refused: {reason}",
        operation="SUBSCRIBE",
        details={"reason": reason},
        suggested_action="Give a public http(s) URL, or ask the operator to allow its "
        "network (--webhook-allow-net).",
    )


def _rap_record(field: Field, ctx: Context, agent_id: str) -> dict[str, Any]:
    """A RAP delivery: the call this subscription answers, within the thread's cap."""
    call = ctx.rap
    assert call is not None
    checked = field.egress.check_url(call.callback_url)
    if isinstance(checked, str):
        raise refused_url(checked, "callback_url")
    cap = field.limits.max_subscriptions_per_thread
    held = [
        s
        for s in field.state.active_subscriptions.get(agent_id, ())
        if field.state.deliveries.get(s, {}).get("group_id") == call.group_id
    ]
    if len(held) >= cap:
        raise StateError(
            f"thread {call.group_id!r} already has {cap} active subscriptions",
            code=Code.SUBSCRIPTION_LIMIT,
            suggested_action="Cancel one of the thread's subscriptions first.",
        )
    return {
        "type": "rap",
        "callback_url": call.callback_url,
        "group_id": call.group_id,
        "tool_call_id": call.tool_call_id,
        "user_id": call.user_id,
        "associative": call.associative,
        "call_id": call.call_id,
    }


def _rap_subscription(field: Field, agent_id: str, group_id: str, call: str) -> str | None:
    """The agent's active subscription made by RAP call ``call`` of thread ``group_id``."""
    for subscription_id in field.state.active_subscriptions.get(agent_id, ()):
        record = field.state.deliveries.get(subscription_id)
        if record and (record.get("group_id"), record.get("tool_call_id")) == (group_id, call):
            return subscription_id
    return None


def owned_subscription(state: FieldState, subscription_id: str, agent_id: str) -> dict[str, Any]:
    """The caller's subscription ``subscription_id``; refuses other agents'."""
    subscription = state.subscriptions.get(subscription_id)
    if subscription is None:
        raise NotFound(
            f"no subscription {subscription_id!r} in this Field",
            code=Code.SUBSCRIPTION_NOT_FOUND,
            suggested_action='List your subscriptions with action "list".',
        )
    if subscription["agent_id"] != agent_id:
        raise AuthError(
            f"subscription {subscription_id!r} belongs to another agent",
            code=Code.FORBIDDEN,
            recoverable=False,
            suggested_action="Only the agent that subscribed can read or cancel it.",
        )
    return subscription


def active_subscription(state: FieldState, subscription_id: str, agent_id: str) -> dict[str, Any]:
    """The caller's subscription, which must still be active (INVALID_TRANSITION if not)."""
    subscription = owned_subscription(state, subscription_id, agent_id)
    if subscription["status"] != "active":
        raise StateError(
            f"subscription {subscription_id} is cancelled",
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action="It no longer notifies; subscribe again if needed. A stream "
            "resumed from a cursor before its cancellation still gets what it owed.",
        )
    return subscription


#: What the Field keeps of a subscription but does not show.
_UNSHOWN = frozenset({"cancel_reason", "ended_position", "created_position"})


def streamable_subscription(
    field: Field, subscription_id: str, agent_id: str, cursor: str | None
) -> dict[str, Any]:
    """The caller's subscription a stream may read from ``cursor``: an active one, or a
    cancelled one resumed from a cursor (the stream gets what the subscription owed after
    that cursor up to its end, if anything, then ends)."""
    subscription = owned_subscription(field.state, subscription_id, agent_id)
    if cursor is not None and subscription.get("ended_position") is not None:
        return subscription
    return active_subscription(field.state, subscription_id, agent_id)


def subscription_wire(field: Field, subscription_id: str) -> dict[str, Any]:
    """A subscription as ``list`` shows it; a durable delivery with its progress."""
    subscription = field.state.subscriptions[subscription_id]
    wire = {k: v for k, v in subscription.items() if k not in _UNSHOWN}
    wire = _with_filter(wire, field.filters.status(subscription_id))
    record = field.state.deliveries.get(subscription_id)
    if record is not None:
        shown = deliveries.public_delivery(record)
        shown["state"] = record["state"]
        shown["acked_cursor"] = format_cursor(field.field_tag, record["acked"])
        sending = field.delivery_progress
        progress = sending.progress(subscription_id) if sending is not None else None
        shown.update(progress or deliveries.IDLE_PROGRESS)
        if shown.get("last_error") is None and record["reason"] is not None:
            shown["last_error"] = record["reason"]
        wire["delivery"] = shown
    return wire


# -- lifetimes --------------------------------------------------------------------------


def effective_timeout(subscription: dict[str, Any], limits: Limits) -> float | None:
    """Seconds of its agent's inactivity after which a subscription expires: the smaller of
    its own ``timeout`` and the Field's ``max_subscription_timeout_s``; None: never."""
    own = subscription.get("timeout")
    seconds = [
        value
        for value in (
            validation.duration_seconds(own) if own is not None else None,
            float(limits.max_subscription_timeout_s) or None,
        )
        if value is not None
    ]
    return min(seconds) if seconds else None


def expiry_entries(
    field: Field, agent_id: str, idle: float, epoch: int, now: float
) -> list[LogEntry]:
    """``subscription.cancelled`` for each of the agent's active subscriptions whose
    effective timeout ``idle`` seconds of inactivity have reached."""
    state = field.state
    entries = []
    for subscription_id in sorted(state.active_subscriptions.get(agent_id, ())):
        timeout = effective_timeout(state.subscriptions[subscription_id], field.limits)
        if timeout is None or idle < timeout:
            continue
        data = {"subscription_id": subscription_id, "reason": expiry_reason(timeout)}
        entries.append(LogEntry(epoch, "subscription.cancelled", data, agent_id, now))
    return entries


def expiry_reason(timeout: float) -> str:
    return f"{EXPIRED}: no activity from its agent for {timeout:g} s"


#: How the ``reason`` of an expired subscription's cancellation begins.
EXPIRED = "expired"


def _with_filter(subscription: dict[str, Any], status: dict[str, Any] | None) -> dict[str, Any]:
    """The wire form's ``filter``: ``{expression, errors, last_error}`` (only when the
    subscription has a filter; ``bindings`` likewise appear only when given)."""
    text = subscription.get("filter")
    if text is None:
        return dict(subscription)  # a copy: the caller may add to it (a webhook's secret)
    if status is None:
        status = {"expression": text, "errors": 0, "last_error": None}
    return {**subscription, "filter": status}


# -- what the delivery engine reports (no envelope: the server decides these) ----------


def term_entries(field: Field, term: int, node: str, epoch: int, now: float) -> list[LogEntry]:
    """A ``delivery.term`` entry: ``node`` sends the deliveries under ``term`` from here on
    (none if the log holds that term already: a claim written twice)."""
    if term <= field.state.delivery_term:
        return []
    return [LogEntry(epoch, "delivery.term", {"term": term, "node": node}, None, now)]


def ack_entries(
    field: Field, positions: dict[str, int], epoch: int, now: float, term: int | None = None
) -> list[LogEntry]:
    """A ``delivery.acked`` entry for the deliveries ``positions`` moves forward, if any
    (the entry's ``cursors`` key is the log's format, kept as written), with the sender's
    ``term`` (None: a Field of one node)."""
    records = field.state.deliveries
    moved = {
        subscription_id: position
        for subscription_id, position in sorted(positions.items())
        if subscription_id in records
        and records[subscription_id]["state"] != "ended"
        and position > records[subscription_id]["acked"]
    }
    if not moved:
        return []
    return [LogEntry(epoch, "delivery.acked", _termed({"cursors": moved}, term), None, now)]


def change_entries(
    field: Field,
    subscription_id: str,
    action: str,
    reason: str | None,
    epoch: int,
    now: float,
    term: int | None = None,
) -> list[LogEntry]:
    """A ``delivery.changed`` entry moving the delivery by ``action`` (none if it is gone),
    with the sender's ``term``."""
    record = field.state.deliveries.get(subscription_id)
    if record is None:
        return []
    deliveries.step(record["state"], action, subscription_id)
    data = {"subscription_id": subscription_id, "action": action, "reason": reason}
    return [LogEntry(epoch, "delivery.changed", _termed(data, term), None, now)]


def _termed(data: dict[str, Any], term: int | None) -> dict[str, Any]:
    """``data`` with the sender's ``term``, if it has one."""
    if term is not None:
        data["term"] = term
    return data


def cancel_entries(
    field: Field,
    agent_id: str,
    group_id: str,
    tool_call_id: str | None,
    reason: str,
    epoch: int,
    now: float,
) -> list[LogEntry]:
    """The runtime's ``/cancel_tool_call`` or ``/close_thread``: the agent's active RAP
    subscriptions of a thread (only the one ``tool_call_id`` created, if given) are
    cancelled, and their deliveries end with them (:func:`_let_go`)."""
    state = field.state
    entries = []
    for subscription_id in sorted(state.active_subscriptions.get(agent_id, ())):
        record = state.deliveries.get(subscription_id)
        if record is None or record["type"] != "rap" or record["group_id"] != group_id:
            continue
        if tool_call_id is not None and record["tool_call_id"] != tool_call_id:
            continue
        entries += _let_go(field, subscription_id, agent_id, reason, epoch, now)
    return entries


def forgotten_entries(
    field: Field,
    subscription_id: str,
    reason: str,
    epoch: int,
    now: float,
    term: int | None = None,
) -> list[LogEntry]:
    """A RAP runtime refused a message of a subscription (a 4xx: it no longer knows it):
    the subscription is cancelled, if it is still active, and its delivery ends (the
    ``delivery.changed`` entry with the sender's ``term``)."""
    record = field.state.deliveries.get(subscription_id)
    if record is None or record["type"] != "rap" or record["state"] == "ended":
        return []
    return _let_go(field, subscription_id, record["agent_id"], reason, epoch, now, term)


def _let_go(
    field: Field,
    subscription_id: str,
    agent_id: str,
    reason: str,
    epoch: int,
    now: float,
    term: int | None = None,
) -> list[LogEntry]:
    """The RAP runtime let go of a subscription: it is cancelled (if it is still active)
    and, in the same write, its delivery ends. RAP forbids a tool to send anything after the
    runtime cancelled a subscription, so it owes nothing from then on: not what it matched
    before, not a final event; and a restart finds it ended."""
    state = field.state
    entries = []
    if state.subscriptions[subscription_id]["status"] == "active":
        data = {"subscription_id": subscription_id, "reason": reason}
        entries.append(LogEntry(epoch, "subscription.cancelled", data, agent_id, now))
    deliveries.step(state.deliveries[subscription_id]["state"], "end", subscription_id)
    ended = {"subscription_id": subscription_id, "action": "end", "reason": reason}
    entries.append(LogEntry(epoch, "delivery.changed", _termed(ended, term), agent_id, now))
    return entries
