"""The router decides every push with no event loop: plain calls in, frames and requests out.

Each test here is a plain function (no loop runs, and none is needed): a Field is
written to synchronously, its entries handed to a :class:`Router`, and what the router
did is read from plain queues and from the requests its driver recorded (a replay, a
catch-up, a deadline, an action once the batch is answered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest

from field.contract.model import StoredEntry
from field.core.field import Field
from field.engine.router import BEHIND, Binding, Frame, PushCounts, PushLimits, Router
from field.store.memory import MemoryEventLog
from field.subscriptions.stream import parse_cursor

from .test_service import envelope


@dataclass
class Plain:
    """A bounded queue as the router sees one: a list, no waiting."""

    most: int = 100
    frames: list[Frame] = field(default_factory=list)
    closed: bool = False

    def put(self, frame: Frame) -> bool:
        if self.closed or len(self.frames) >= self.most:
            return False
        self.frames.append(frame)
        return True

    def close_with(self, frame: Frame | None) -> None:
        if not self.closed and frame is not None:
            self.frames.append(frame)
        self.closed = True

    def room(self) -> int:
        return self.most - len(self.frames)

    def take(self) -> list[tuple[str, Any]]:
        """What was queued, decoded, and the queue emptied: (kind, body) for each frame."""
        taken, self.frames = self.frames, []
        return [(f.kind, orjson.loads(f.body)) for f in taken]


@dataclass
class Requests:
    """The router's driver: it only writes down what it was asked to do."""

    replays: list[tuple[Binding[Plain], int, int]] = field(default_factory=list)
    catch_ups: list[tuple[Binding[Plain], int]] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)
    soonest: list[float | None] = field(default_factory=list)
    answered: list[tuple[Callable[..., object], tuple[object, ...]]] = field(default_factory=list)
    departed: list[str] = field(default_factory=list)

    def replay(self, binding: Binding[Plain], after: int, until: int) -> None:
        self.replays.append((binding, after, until))

    def catch_up(self, binding: Binding[Plain], after: int) -> None:
        self.catch_ups.append((binding, after))

    def schedule(self, deadline: float) -> None:
        self.deadlines.append(deadline)

    def rescheduled(self, deadline: float | None) -> None:
        self.soonest.append(deadline)

    def after_answers(self, callback: Callable[..., object], *args: object) -> None:
        self.answered.append((callback, args))

    def left(self, agent_id: str) -> None:
        self.departed.append(agent_id)


class Writer:
    """The single writer, without a loop: each call applies, appends and routes."""

    def __init__(self) -> None:
        self.log = MemoryEventLog()
        self.field = Field()
        self.tokens: dict[str, str] = {}
        self.driver = Requests()
        self.counts = PushCounts()
        self.router: Router[Plain] = Router(
            lambda: self.field,
            self.driver,
            PushLimits(replay_hold=3),
            counts=self.counts,
        )
        genesis = self.field.genesis()
        if genesis:
            self.route(self.append(genesis))

    def append(self, entries: list[Any]) -> list[StoredEntry]:
        positions = self.log.append(entries)
        state = self.field.state
        state.last_position = state.applied_position = positions[-1]
        return [
            StoredEntry(p, e.epoch, e.kind, e.data, e.agent_id, e.ts)
            for p, e in zip(positions, entries, strict=True)
        ]

    def route(self, stored: list[StoredEntry]) -> None:
        for _ in self.router.route(stored):
            pass

    def call(self, operation: str, agent_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Run one operation and route what it wrote; its response."""
        token = self.tokens.get(agent_id)
        outcome = self.field.handle(envelope(operation, agent_id, payload), token=token)
        if outcome.entries:
            stored = self.append(list(outcome.entries))
            if outcome.on_durable is not None:
                outcome.on_durable([e.position for e in stored])
            self.route(stored)
        if operation == "REGISTER":
            self.tokens[agent_id] = outcome.response["token"]
        return dict(outcome.response)

    def register(self, agent_id: str) -> None:
        self.call("REGISTER", agent_id, {"id": agent_id, "role": "analyst", "interests": ["x"]})

    def subscribe(self, agent_id: str, debounce_ms: int = 0) -> str:
        subscription = {"events": ["memory.recorded"], "debounce_ms": debounce_ms}
        response = self.call(
            "SUBSCRIBE", agent_id, {"action": "subscribe", "subscription": subscription}
        )
        return str(response["subscription_id"])

    def record(self, agent_id: str, content: str) -> str:
        payload = {
            "type": "finding",
            "content": content,
            "intent": {"purpose": "testing the router"},
            "confidence": {"score": 0.8, "reasoning": "a test"},
        }
        return str(self.call("RECORD", agent_id, payload)["memory_unit_id"])


@pytest.fixture
def writer() -> Writer:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # these tests run with no event loop at all
    w = Writer()
    for agent_id in ("writer", "a"):
        w.register(agent_id)
    return w


def notified(frames: list[tuple[str, Any]]) -> list[str]:
    return [body["memory_unit_id"] for kind, body in frames if kind == "memory.recorded"]


def test_a_live_stream_gets_each_matching_unit_once_in_its_queue(writer: Writer) -> None:
    sid = writer.subscribe("a")
    queue = Plain()
    connection = writer.router.connect("a", "sse", queue)
    writer.router.attach(connection, sid, None)
    assert [kind for kind, _ in queue.take()] == ["resume", "live"]

    first, second = writer.record("writer", "one"), writer.record("writer", "two")

    frames = queue.frames
    assert notified(queue.take()) == [first, second]
    positions = [frame.position or 0 for frame in frames]
    assert positions == sorted(positions) and 0 not in positions
    assert all(
        parse_cursor(frame.cursor or "", writer.router.tag)[0] == frame.position for frame in frames
    )
    assert writer.driver.replays == [] and writer.driver.deadlines == []


def test_a_debounced_stream_asks_for_its_deadline_and_holds_its_window_until_flushed(
    writer: Writer,
) -> None:
    sid = writer.subscribe("a", debounce_ms=60_000)
    queue = Plain()
    writer.router.attach(writer.router.connect("a", "sse", queue), sid, None)
    queue.take()

    first = writer.record("writer", "one")
    second = writer.record("writer", "two")

    assert queue.take() == []  # the window is open: nothing yet
    deadline = writer.driver.deadlines[-1]
    writer.router.flush(deadline - 1)
    assert queue.take() == []
    writer.router.flush(deadline)
    assert notified(queue.take()) == [first, second]  # each unit is its own entity
    assert writer.driver.soonest[-1] is None  # no window left open


def test_attaching_behind_the_log_asks_for_a_replay_and_holds_live_ones_until_released(
    writer: Writer,
) -> None:
    sid = writer.subscribe("a")
    after = writer.field.state.last_position
    missed = writer.record("writer", "missed")
    queue = Plain()
    connection = writer.router.connect("a", "sse", queue)
    writer.router.attach(connection, sid, after)

    [(binding, replay_after, until)] = writer.driver.replays
    assert (replay_after, until) == (after, writer.field.state.last_position)
    assert [kind for kind, _ in queue.take()] == ["resume"]
    live = writer.record("writer", "live")
    assert queue.take() == []  # held while the replay runs

    # the driver's replay: the page it read from the log, then the release
    page = writer.log.read(replay_after, until - replay_after)
    row = np.array([writer.router.field.state.registry_row(sid)])
    replayed = writer.router.offer_entries(binding, page, row)
    assert writer.router.release(binding)
    writer.router.take_live(binding, replayed, None)

    frames = queue.take()
    assert notified(frames) == [missed, live]
    assert frames[-1] == (
        "live",
        {"subscription_id": sid, "replayed": 1, "cursor": frames[-1][1]["cursor"]},
    )


def test_a_cursor_from_a_node_further_on_starts_there_or_sends_the_client_back(
    writer: Writer,
) -> None:
    """On a log several nodes append to, a node behind a client's cursor (which another
    node handed out) neither replays what the client saw nor says the cursor is lost."""
    sid = writer.subscribe("a")
    behind = writer.field.state.last_position
    writer.record("writer", "seen through the node further on")
    cursor = writer.field.state.last_position
    node = Field()  # another node, which has applied the log up to ``behind`` only
    node.state.replay(writer.log.read(0, behind))
    router: Router[Plain] = Router(lambda: node, Requests(), PushLimits())

    queue = Plain()
    sent_back = router.connect("a", "sse", queue)
    router.attach(sent_back, sid, cursor, head=behind)  # the node knows of nothing further
    assert sent_back.ended == BEHIND and queue.closed and queue.frames == []

    connection = router.connect("a", "sse", queue := Plain())
    router.attach(connection, sid, cursor, head=cursor)
    frames = queue.take()
    assert [kind for kind, _ in frames] == ["resume", "live"]
    assert frames[0][1]["recovered"] is True
    assert parse_cursor(frames[0][1]["from"], router.tag)[0] == cursor

    def follow() -> None:  # the node applies and routes what the log holds past it
        stored = writer.log.read(node.state.last_position, 100)
        for entry in stored:
            node.state.apply(entry)
        for _ in router.route(stored):
            pass

    follow()
    assert notified(queue.take()) == []  # the client saw those through the other node
    after = writer.record("writer", "recorded after the cursor")
    follow()
    assert notified(queue.take()) == [after]


def test_a_replaying_stream_that_holds_too_much_overflows_with_its_resume_cursor(
    writer: Writer,
) -> None:
    sid = writer.subscribe("a")
    after = writer.field.state.last_position
    writer.record("writer", "missed")
    queue = Plain()
    connection = writer.router.connect("a", "sse", queue)
    writer.router.attach(connection, sid, after)
    queue.take()
    for n in range(4):  # the hold is 3
        writer.record("writer", f"live {n}")

    assert connection.ended == (4008, "outbox overflow")
    [(kind, body)] = queue.take()
    assert kind == "overflow"
    position, problem = parse_cursor(body["cursors"][sid], writer.router.tag)
    assert (position, problem) == (after, None)  # nothing was queued past the cursor
    assert connection not in writer.router.connections
    assert writer.counts.overflows[("sse", "outbox overflow")] == 1


def test_a_full_queue_ends_the_connection_with_what_it_can_resume_from(writer: Writer) -> None:
    sid = writer.subscribe("a")
    queue = Plain(most=3)
    connection = writer.router.connect("a", "ws", queue)
    writer.router.attach(connection, sid, None)
    first = writer.record("writer", "one")  # resume, live, one: full
    writer.record("writer", "two")

    frames = queue.take()
    assert notified(frames) == [first]
    kind, body = frames[-1]
    assert kind == "overflow" and connection.ended == (4008, "outbox overflow")
    assert body["cursors"][sid] == frames[2][1]["cursor"]  # the last one it was given


def test_cancelling_ends_the_stream_and_deregistering_asks_to_close_after_the_answer(
    writer: Writer,
) -> None:
    sid = writer.subscribe("a")
    queue = Plain()
    connection = writer.router.connect("a", "ws", queue)
    writer.router.attach(connection, sid, None)
    queue.take()

    writer.call("SUBSCRIBE", "a", {"action": "unsubscribe", "subscription": {"id": sid}})
    [(kind, body)] = queue.take()
    assert (kind, body["reason"]) == ("end", "subscription cancelled")
    assert writer.router.by_subscription == {}

    writer.call("DEREGISTER", "a", {"agent_id": "a"})
    assert writer.driver.departed == ["a"]
    [(callback, args)] = writer.driver.answered
    assert connection.ended is None  # not before its DEREGISTER is answered
    callback(*args)
    assert connection.ended == (4409, "agent deregistered")


def test_too_many_connections_of_one_agent_are_refused_and_a_sink_is_not_counted(
    writer: Writer,
) -> None:
    router = writer.router
    router.max_per_agent = 2
    for _ in range(2):
        router.connect("a", "ws", Plain())
    with pytest.raises(Exception, match="push connections") as refused:
        router.connect("a", "sse", Plain())
    assert getattr(refused.value, "code", None) == "TOO_MANY_CONNECTIONS"
    router.connect_sink("a", "webhook", Plain())  # a durable sink has no cap
    assert len(router.by_agent["a"]) == 2
