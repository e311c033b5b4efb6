"""Random histories of a Field, and what to compare of two states, for the snapshot tests.

:func:`play` runs one step of a history on a :class:`~tests.core_util.Harness`:
every operation and every entry kind the projection folds (agents come and
go and fail, units are recorded, superseded, contested, archived, purged,
conflicts detected and merged, subscriptions made, cancelled and expired,
durable deliveries acknowledged and changed, sessions, tasks, handoffs,
sources and their events, registration tokens). A step that the Field
refuses changes nothing and is part of the history all the same.

:func:`canonical` is every registry of a state as plain data, the same for
two states that answer every read alike (the matcher's registry by
subscription, never by row); :func:`observe` is what the reads answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import struct
from collections import ChainMap, Counter, OrderedDict
from typing import Any

import numpy as np
from hypothesis import strategies as st

from field.contract.clock import iso_timestamp
from field.contract.errors import FieldError
from field.contract.model import CONFLICT_STRATEGIES, StoredEntry
from field.core import snapshot
from field.core.field import Field
from field.core.registration import SECRET_PREFIX
from field.core.snapshot import Header
from field.core.sources import Event, body_digest
from field.core.state import OPERATOR_RECORD, FieldState
from field.ranking.relevance import Column, Interner, Matrix
from field.subscriptions.events import SUBSCRIPTION_EVENTS, event_of
from field.subscriptions.matcher import Matcher
from field.subscriptions.registry import SubscriptionRegistry

from .core_util import Harness

OPERATOR_TOKEN = "operator-token-for-snapshots-0123456"
AGENTS = ("ann", "bob", "cat", "dan")
ROLES = ("analyst", "market_researcher", "strategist")
INTERESTS: tuple[list[str], ...] = (["market size"], ["pricing", "churn in europe"], [])
WORDS = (
    "market size growth pricing churn retention revenue forecast hiring risk europe saas "
    "budget segment channel partner roadmap launch adoption support security audit"
).split()
TYPES = ("finding", "decision", "observation", "question", "assumption", "constraint")
EVENTS = sorted(SUBSCRIPTION_EVENTS)
FILTERS = (
    None,
    "event.unit.intent.task_id in parameters.task_id",
    "has(event.unit) && event.unit.intent.task_id == subscriber.current_task",
    "event.entity.id in parameters.session_id || subscriber.id != event.actor",
)
SESSION_ACTIONS = ("join", "leave", "pause", "resume", "end", "invite")
TASK_ACTIONS = ("assign", "start", "complete", "cancel", "block", "fail")
DELIVERY_ACTIONS = ("fail", "recover", "suspend", "resume", "end")


def harness() -> Harness:
    """A Field with an operator, a lead (authority 8) who may merge and compact, and three
    of the four agents."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.tokens["operator"] = OPERATOR_TOKEN
    h.register("lead", "lead", via=OPERATOR_TOKEN, authority=8)
    for i, agent in enumerate(AGENTS[:3]):
        h.register(agent, ROLES[i], interests=INTERESTS[i])
    return h


#: One step: its kind and three numbers that pick its agent, its target and its details.
step = st.tuples(
    st.sampled_from(
        (
            "register",
            "register",
            "deregister",
            "record",
            "record",
            "record",
            "attune",
            "subscribe",
            "subscribe",
            "webhook",
            "unsubscribe",
            "ack",
            "delivery",
            "session",
            "session_act",
            "task",
            "task_act",
            "handoff",
            "detect",
            "merge",
            "compact",
            "source",
            "source_remove",
            "ingest",
            "token",
            "token_revoke",
            "fail",
            "recover",
            "expire",
            "later",
        )
    ),
    st.integers(0, 999),
    st.integers(0, 999),
    st.integers(0, 999),
)
histories = st.lists(step, min_size=30, max_size=150)


def random_history(seed: int, length: int) -> list[tuple[str, int, int, int]]:
    """A long history drawn at random (``random.Random(seed)``): deeper than the ones
    Hypothesis shrinks, with conflicts merged, units purged and deliveries moved along."""
    draw = random.Random(seed)
    kinds = sorted(_STEPS)
    return [
        (draw.choice(kinds), draw.randrange(1000), draw.randrange(1000), draw.randrange(1000))
        for _ in range(length)
    ]


def pick(values: Any, n: int) -> Any:
    """The ``n``-th of ``values`` (wrapping), or None when there are none."""
    values = list(values)
    return values[n % len(values)] if values else None


def play(h: Harness, step: tuple[str, int, int, int]) -> Any:
    """Run ``step`` on ``h``: the response, or the error code when the Field refuses it."""
    kind, a, b, c = step
    try:
        return _STEPS[kind](h, a, b, c)
    except FieldError as error:
        return {"error": error.code}


def _agent(h: Harness, n: int) -> str:
    return AGENTS[n % len(AGENTS)]


def _register(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    return h.register(agent, ROLES[b % len(ROLES)], interests=INTERESTS[c % len(INTERESTS)])


def _deregister(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    return h.send("DEREGISTER", agent, {"agent_id": agent})


def _record(h: Harness, a: int, b: int, c: int) -> Any:
    state = h.field.state
    agent = _agent(h, a) if c % 7 else "lead"
    content = " ".join(WORDS[(b + 5 * i) % len(WORDS)] for i in range(3 + c % 5))
    task_id = pick(state.tasks, b) if c % 3 == 0 else None
    relations = []
    target = pick(state.units, b + c)
    if target is not None and c % 5 in (2, 3):
        relation = "supersedes" if c % 5 == 2 else "contradicts"
        relations = [{"type": relation, "target_id": target}]
    payload = {
        "type": TYPES[c % len(TYPES)],
        "content": content,
        "intent": {"purpose": "to learn " + WORDS[a % len(WORDS)], "task_id": task_id},
        "confidence": {"score": (b % 10) / 10, "reasoning": "measured"},
        "relations": relations,
    }
    session_id = pick(state.sessions, a) if c % 4 == 1 else None
    return h.send("RECORD", agent, payload, session_id=session_id)


def _attune(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    hint = " ".join(WORDS[(b + i) % len(WORDS)] for i in range(2)) if c % 2 else None
    payload: dict[str, Any] = {"scope": {"role": ROLES[b % 3], "max_units": 1 + c % 20}}
    if hint is not None:
        payload["context_hint"] = hint
    return h.send("ATTUNE", agent, payload)


def _subscription(b: int, c: int) -> dict[str, Any]:
    events = [EVENTS[(b + i * 3) % len(EVENTS)] for i in range(1 + c % 4)]
    subscription: dict[str, Any] = {
        "events": sorted(set(events)),
        "min_relevance": (c % 5) / 10,
        "include_own": bool(b % 2),
    }
    text = FILTERS[(b + c) % len(FILTERS)]
    if text is not None:
        subscription["filter"] = text
    return subscription


def _subscribe(h: Harness, a: int, b: int, c: int) -> Any:
    payload = {"action": "subscribe", "subscription": _subscription(b, c)}
    return h.send("SUBSCRIBE", _agent(h, a), payload)


def _webhook(h: Harness, a: int, b: int, c: int) -> Any:
    subscription = {
        **_subscription(b, c),
        "delivery": {"type": "webhook", "url": f"https://hooks.example.com/{a % 3}"},
    }
    payload = {"action": "subscribe", "subscription": subscription}
    return h.send("SUBSCRIBE", _agent(h, a), payload)


def _unsubscribe(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    mine = sorted(h.field.state.active_subscriptions.get(agent, ()))
    target = pick(mine, b) or "sub-none"
    return h.send("SUBSCRIBE", agent, {"action": "unsubscribe", "subscription": {"id": target}})


def _outcome(h: Harness, outcome: Any) -> Any:
    h.entries.extend(outcome.entries)
    return outcome.response


def _ack(h: Harness, a: int, b: int, c: int) -> Any:
    deliveries = h.field.state.deliveries
    target = pick(sorted(deliveries), a)
    if target is None:
        return None
    position = min(len(h.entries), deliveries[target]["acked"] + 1 + b % 5)
    return _outcome(h, h.field.ack_deliveries({target: position}))


def _delivery(h: Harness, a: int, b: int, c: int) -> Any:
    target = pick(sorted(h.field.state.deliveries), a)
    if target is None:
        return None
    action = DELIVERY_ACTIONS[b % len(DELIVERY_ACTIONS)]
    return _outcome(h, h.field.change_delivery(target, action, f"reason {c % 3}"))


def _session(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    payload: dict[str, Any] = {"action": "create", "name": f"session {b % 4}", "purpose": "x"}
    if c % 2:
        payload["invitees"] = [_agent(h, a + 1)]
    return h.send("SESSION", agent, payload)


def _session_act(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a) if c % 5 else "lead"
    session_id = pick(h.field.state.sessions, b) or "session-none"
    action = SESSION_ACTIONS[c % len(SESSION_ACTIONS)]
    payload: dict[str, Any] = {"action": action, "session_id": session_id}
    if action == "invite":
        payload["invitees"] = [_agent(h, b)]
    return h.send("SESSION", agent, payload)


def _task(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a) if c % 3 else "lead"
    payload: dict[str, Any] = {"action": "create", "title": f"task {b % 7}"}
    if c % 2:
        payload["assignee"] = agent
    dependency = pick(h.field.state.tasks, b)
    if dependency is not None and c % 4 == 3:
        payload["depends_on"] = [dependency]
    return h.send("COORDINATE", agent, payload)


def _task_act(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a) if c % 4 else "lead"
    task_id = pick(h.field.state.tasks, b) or "task-none"
    action = TASK_ACTIONS[c % len(TASK_ACTIONS)]
    payload: dict[str, Any] = {"action": action, "task_id": task_id}
    if action == "assign":
        payload["assignee"] = _agent(h, b)
    return h.send("COORDINATE", agent, payload)


def _handoff(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    task_id = pick(h.field.state.tasks, b) or "task-none"
    payload = {"task_id": task_id, "to_agent_id": _agent(h, c), "notes": "over to you"}
    return h.send("HANDOFF", agent, payload)


def _detect(h: Harness, a: int, b: int, c: int) -> Any:
    target = pick(h.field.state.units, b)
    if target is None or c % 2:
        return h.send("DETECT", _agent(h, a), {"mode": "list"})
    return h.send("DETECT", _agent(h, a), {"mode": "check", "target_id": target})


def _merge(h: Harness, a: int, b: int, c: int) -> Any:
    state = h.field.state
    conflict_id = pick(state.conflicts, b) or "conflict-none"
    conflict = state.conflicts.get(conflict_id)
    strategy = CONFLICT_STRATEGIES[c % len(CONFLICT_STRATEGIES)]
    resolution: dict[str, Any] = {"rationale": "because the data says so"}
    if conflict is not None and strategy in ("vote", "authority"):
        resolution["winner_id"] = conflict["unit_a" if a % 2 else "unit_b"]
    if strategy == "synthesis":
        resolution["synthesis"] = "both hold in part"
    agent = "operator" if a % 3 == 0 else "lead"
    payload = {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}
    return h.send("MERGE", agent, payload)


def _compact(h: Harness, a: int, b: int, c: int) -> Any:
    strategy = ("archive", "purge")[c % 2]
    flt: dict[str, Any] = {"types": [TYPES[b % len(TYPES)]]}
    if a % 2:
        flt["status"] = ["active", "superseded", "archived", "contested"][: 1 + a % 4]
    return h.send("COMPACT", "lead", {"strategy": strategy, "filter": flt})


def _source(h: Harness, a: int, b: int, c: int) -> Any:
    body = {
        "name": f"src{a % 2}",
        "scheme": ("github", "standard")[b % 2],
        "unit": {
            "type": TYPES[c % len(TYPES)],
            "content": "event {payload.n} about {payload.topic}",
            "purpose": "to hear of {headers.x-kind}",
            "confidence": 0.5,
        },
    }
    if c % 3 == 0:
        body["filter"] = "payload.n > 2"
    return _outcome(h, h.field.define_source(OPERATOR_TOKEN, body))


def _source_remove(h: Harness, a: int, b: int, c: int) -> Any:
    return _outcome(h, h.field.remove_source(OPERATOR_TOKEN, f"src{a % 2}"))


def _ingest(h: Harness, a: int, b: int, c: int) -> Any:
    source = h.field.state.sources.get(f"src{a % 2}")
    if source is None:
        return None
    delivery_id = f"delivery-{b % 6}" if c % 3 else None
    timestamp = int(h.time) if source.scheme == "standard" else None
    payload = {"n": b % 5, "topic": WORDS[c % len(WORDS)]}
    digest = body_digest(repr(payload).encode())  # payloads repeat: github refuses some
    event = Event(source, delivery_id, timestamp, payload, {"x-kind": "push"}, digest)
    return _outcome(h, h.field.ingest_event(event))


def _token(h: Harness, a: int, b: int, c: int) -> Any:
    body: dict[str, Any] = {"uses": 1 + a % 3, "note": f"for {b % 4}"}
    if c % 2:
        body["expires_at"] = iso_timestamp(h.time + 60 * (1 + c % 5))
    return _outcome(h, h.field.issue_registration_token(OPERATOR_TOKEN, body))


def _token_revoke(h: Harness, a: int, b: int, c: int) -> Any:
    token_id = pick(h.field.state.registration_tokens.by_id, a) or "rtok-none"
    return _outcome(h, h.field.revoke_registration_token(OPERATOR_TOKEN, token_id))


def _fail(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    if agent not in h.field.state.agents:
        return None
    return _outcome(h, h.field.fail_agent(agent, "silent"))


def _recover(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    if agent not in h.field.state.agents:
        return None
    return _outcome(h, h.field.recover_agent(agent))


def _expire(h: Harness, a: int, b: int, c: int) -> Any:
    agent = _agent(h, a)
    if agent not in h.field.state.agents:
        return None
    return _outcome(h, h.field.expire_subscriptions(agent, float(60 * (b % 100))))


def _later(h: Harness, a: int, b: int, c: int) -> Any:
    h.time += 1 + a * 7
    return None


_STEPS = {
    "register": _register,
    "deregister": _deregister,
    "record": _record,
    "attune": _attune,
    "subscribe": _subscribe,
    "webhook": _webhook,
    "unsubscribe": _unsubscribe,
    "ack": _ack,
    "delivery": _delivery,
    "session": _session,
    "session_act": _session_act,
    "task": _task,
    "task_act": _task_act,
    "handoff": _handoff,
    "detect": _detect,
    "merge": _merge,
    "compact": _compact,
    "source": _source,
    "source_remove": _source_remove,
    "ingest": _ingest,
    "token": _token,
    "token_revoke": _token_revoke,
    "fail": _fail,
    "recover": _recover,
    "expire": _expire,
    "later": _later,
}


# -- what to compare ------------------------------------------------------------------

#: Attributes that are configuration or caches, not what the log folds to.
_NOT_STATE = {
    ("FieldState", "embedder"),
    ("FieldState", "limits"),
    ("FieldState", "known_units"),  # units and purged, compared on their own
    ("UnitIndex", "embedder"),
    ("UnitIndex", "weights"),
    ("UnitIndex", "_texts"),
    ("UnitIndex", "_role_factors"),
    ("_List", "maps"),
}
#: Per-agent indexes whose empty sets a snapshot leaves out.
_SPARSE = ("active_subscriptions", "open_tasks_by_agent", "sessions_by_member", "invitations")


def canonical(state: FieldState) -> dict[str, Any]:
    """Every registry of ``state`` as plain data (see the module docstring)."""
    state.index.vectors  # noqa: B018 - embeds what waits in the queue, as any read does
    dump: dict[str, Any] = _plain(state)
    for name in _SPARSE:
        dump[name] = {k: v for k, v in dump[name].items() if v}
    dump["registry"] = registry_by_subscription(state)
    return dump


def registry_by_subscription(state: FieldState) -> dict[str, Any]:
    """The matcher's registry, subscription by subscription: what each row matches with.

    Every subscription's row is looked up as readers do (``registry_row``), so a
    cancelled one a snapshot left out is added again: it must come back the same.
    """
    registry = state.registry
    agents = _codes(registry.agents)
    roles, tasks, filters = _codes(registry.roles), _codes(registry.tasks), registry.filter_texts
    found = {}
    for subscription_id in sorted(state.subscriptions):
        row = state.registry_row(subscription_id)
        profile = int(registry.profile.view[row])
        task = int(registry.task.view[profile])
        code = int(registry.filter.view[row])
        found[subscription_id] = {
            "active": bool(registry.active.view[row]),
            "event_mask": int(registry.event_mask.view[row]),
            "min_relevance": float(registry.min_relevance.view[row]),
            "include_own": bool(registry.include_own.view[row]),
            "created_epoch": int(registry.created_epoch.view[row]),
            "agent": agents[int(registry.agent.view[row])],
            "filter": None if code < 0 else filters[code],
            "profile": {
                "role": roles[int(registry.role.view[profile])],
                "task": None if task < 0 else tasks[task],
                "role_word_count": float(registry.role_word_count.view[profile]),
                "interest_unit": float(registry.interest_unit.view[profile]),
                "words": [sorted(words) for words in registry.profile_words[profile]],
                "agent": registry.profile_agent[profile],
                "interests": [
                    (registry.vectors.view[i].tolist(), float(registry.squares.view[i]))
                    for i in range(
                        int(registry.interest_start.view[profile]),
                        int(registry.interest_start.view[profile])
                        + int(registry.interest_count.view[profile]),
                    )
                ],
                "key": [k for k, p in registry.profiles.items() if p == profile],
            },
        }
    return found


def _codes(interner: Interner) -> dict[int, str]:
    return {code: value for value, code in interner._codes.items()}


def _plain(value: Any, owner: str = "") -> Any:
    if isinstance(value, SubscriptionRegistry):
        return None  # compared by subscription (registry_by_subscription)
    if isinstance(value, Column | Matrix):
        return value.view.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Counter):
        return {"counter": sorted(value.items())}
    if isinstance(value, OrderedDict):
        return {"ordered": [[k, _plain(v)] for k, v in value.items()]}
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, ChainMap):
        return None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=repr)
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return value
    kind = type(value).__name__
    if dataclasses.is_dataclass(value):
        names = [f.name for f in dataclasses.fields(value)]
    elif hasattr(value, "__dict__"):
        names = list(vars(value))
    else:
        names = list(type(value).__slots__)
    if hasattr(value, "definition") and hasattr(value, "deliveries"):  # a source
        names = ["definition", "deliveries", "accepted"]
    return {
        "class": kind,
        **{n: _plain(getattr(value, n), kind) for n in names if (kind, n) not in _NOT_STATE},
    }


def _key(key: Any) -> Any:
    return key if isinstance(key, str) else repr(key)


def observe(field: Field, tokens: dict[str, str]) -> dict[str, Any]:
    """What reads answer, for every agent registered (``tokens``: their bearer tokens):
    ATTUNE (with and without a hint), the lists of SUBSCRIBE, SESSION, COORDINATE and
    DETECT, REPLAY of units, listings of agents, conflicts, sources and registration
    tokens, and the status."""
    seen: dict[str, Any] = {}
    reads: list[tuple[str, dict[str, Any]]] = [
        ("ATTUNE", {"scope": {"role": "analyst", "max_units": 50}}),
        ("ATTUNE", {"scope": {"role": "strategist", "max_units": 10}, "context_hint": "pricing"}),
        ("SUBSCRIBE", {"action": "list"}),
        ("SESSION", {"action": "list"}),
        ("COORDINATE", {"action": "list"}),
        ("DETECT", {"mode": "list"}),
    ]
    for unit_id in list(field.state.units)[:3]:
        reads.append(
            ("REPLAY", {"target_type": "memory_unit", "target_id": unit_id, "depth": "full"})
        )
    for agent in sorted(field.state.agents):
        for operation, payload in reads:
            seen[f"{operation} {agent} {payload}"] = read(field, tokens, operation, agent, payload)
    seen["agents"] = field.list_agents()
    seen["conflicts"] = field.list_conflicts(OPERATOR_RECORD)
    seen["sources"] = [s.public() for s in field.list_sources(OPERATOR_TOKEN)]
    seen["tokens"] = field.registration_tokens(OPERATOR_TOKEN)
    seen["status"] = field.status()
    observed: dict[str, Any] = unsealed(seen)
    return observed


def read(
    field: Field, tokens: dict[str, str], operation: str, agent: str, payload: dict[str, Any]
) -> Any:
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-read",
        "operation": operation,
        "agent_id": agent,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }
    try:
        return field.handle(envelope, token=tokens.get(agent), operation=operation).response
    except FieldError as error:
        return {"error": error.code}


def unsealed(value: Any) -> Any:
    """``value`` with every secret masked: secrets are made at random and sealed with a
    random nonce, so two runs of one history differ there alone (webhook and source
    secrets, registration tokens and their hashes, by which the state also keys them)."""
    if isinstance(value, dict):
        masked = {k: "<secret>" if _secret(k, v) else unsealed(v) for k, v in value.items()}
        if value.get("class") == "Tokens":
            masked["by_hash"] = sorted(value["by_hash"].values())
        return masked
    if isinstance(value, list):
        return [unsealed(v) for v in value]
    return value


def _secret(key: str, value: Any) -> bool:
    if key in ("secret", "hash"):
        return True
    return key == "token" and isinstance(value, str) and value.startswith(SECRET_PREFIX)


def matches(state: FieldState, field: Field, entries: list[StoredEntry]) -> list[Any]:
    """What the matcher tells each subscription of ``entries`` (as the push hub matches
    them live), and what each cancelled subscription's replay to its end would get."""
    matcher = Matcher(state.registry, state.index, state.known_units, screen=field.filters.screen)
    events = [e for e in (event_of(entry, state.known_units) for entry in entries) if e]
    told: list[Any] = []
    ids = state.registry.ids
    for match in matcher.match(events):
        told.append(
            [
                match.event.position,
                sorted(
                    (ids[row], round(float(r), 12), bool(a), match.reason(i))
                    for i, (row, r, a) in enumerate(
                        zip(
                            match.rows.tolist(), match.relevance, match.requires_action, strict=True
                        )
                    )
                ),
            ]
        )
    for subscription_id in sorted(state.subscriptions):
        if state.subscriptions[subscription_id]["status"] == "active":
            continue
        row = np.array([state.registry_row(subscription_id)])
        for match in matcher.match(events, only=row, inactive=True):
            told.append([subscription_id, match.event.position, float(match.relevance[0])])
    return told


# -- forged snapshots -------------------------------------------------------------------


def rewritten(good: bytes, **header: Any) -> bytes:
    """``good`` with its header changed and its checksum made again (a forgery the digest
    cannot tell from a snapshot: what follows the digest must still refuse it)."""
    old = snapshot.read_header(good)
    fields = {**{f: getattr(old, f) for f in Header.__dataclass_fields__}, **header}
    body = good[snapshot.header_size(good) : -40]
    return sealed(Header(**fields).to_json(), body)


def sealed(head: bytes, body: bytes) -> bytes:
    """A snapshot of header ``head`` and body ``body``, its lengths and digest right."""
    data = b"FIELDSNP" + struct.pack(">I", len(head)) + head + body + struct.pack(">Q", len(body))
    return data + hashlib.sha256(data).digest()
