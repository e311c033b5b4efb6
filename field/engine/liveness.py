"""Liveness: agents that go silent are declared failed.

One rule (documented in ``protocol/README.md``, "Liveness"). An agent is
**live** while any of these holds:

* it holds a push connection (WebSocket or SSE);
* it was *heard from* (a request that succeeded, or opening a push
  connection) less than ``heartbeat_timeout`` seconds ago;
* its last push connection closed less than ``failure_grace`` seconds ago.

Otherwise the :class:`Liveness` monitor runs :meth:`Field.fail_agent`
through the service like any operation: an ``agent.failed`` entry whose
``reason`` says which of these ran out, made durable, pushed to
subscribers. So an agent heard from within ``heartbeat_timeout`` is never
failed because a connection closed, and one whose connection closed gets
at least ``failure_grace`` to come back. ``heartbeat_timeout`` 0 turns the
second rule off for silence alone: an agent is then failed only when its
last push connection closed and nothing was heard from it since, for
``failure_grace``. A failed agent that is heard from again recovers
(``agent.recovered``).

The same monitor expires subscriptions: one whose agent has had no activity
for its effective timeout (its own ``timeout``, at most
``--max-subscription-timeout``) is cancelled with the reason ``expired``;
the agent is not failed for it. Activity is what the agent does: a request
(any operation, on any transport) or opening a push connection; holding a
connection open is not (a listener with nothing to do lets its timed
subscriptions expire, as a hibernating one does).

What was last heard is not logged: an agent this node has not heard from
counts as heard from when this node first knew of it (at start-up, or at the
first check after the agent registered, on this node or another). So
after a restart every live agent gets a fresh ``heartbeat_timeout`` (and
subscription timeout), and an agent that registered on another node gets a
whole one before this node may fail it, whatever that node has yet shared.

**Several nodes.** When several processes serve one Field (a PostgreSQL
log), an agent may hold its connection on one node and send its requests
to another. The monitor is then given a *remote* presence source
(:class:`RemotePresence`, :class:`field.store.presence.Presence`): an
agent holds a push connection if it holds one on any live node, and was
heard from, or last dropped a connection, at the latest time any node
saw; this node's own changes go the other way, through
:meth:`Liveness.drain_changes`. The rules are the same; the remote source
says which node decides (:meth:`RemotePresence.decides`), so one node
fails silent agents and expires subscriptions at a time. An agent that
holds a connection to this node but was failed all the same (a decision
made on presence a second old) recovers on the next check. Without a
remote source (one process) nothing of this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from ..contract.errors import FieldError
from ..core import subscribe
from ..core.field import Field
from .service import FieldService

logger = logging.getLogger("field.liveness")

#: What this node knows of an agent, for the other nodes: (push connections open here,
#: seconds since heard from here, seconds since its last connection here closed; None:
#: never), or None for an agent no longer registered.
PresenceReport = tuple[int, float | None, float | None] | None


class RemotePresence(Protocol):
    """What the other nodes of the Field know of each agent (several nodes only)."""

    def presence(self, agent_id: str) -> tuple[int, float | None, float | None]:
        """Push connections ``agent_id`` holds on the other live nodes, and seconds since
        it was last heard from and since its last connection closed there (None: never)."""
        ...

    def decides(self) -> bool:
        """Whether this node fails silent agents and expires subscriptions now."""
        ...


class Liveness:
    """Watches agents' connections and requests; fails the silent ones."""

    def __init__(
        self,
        service: FieldService,
        *,
        failure_grace: float,
        heartbeat_timeout: float,
        clock: Callable[[], float] | None = None,
        remote: RemotePresence | None = None,
    ) -> None:
        self.service = service
        #: the other nodes' presence; None: this process is the whole Field
        self.remote = remote
        self.failure_grace = failure_grace
        #: 0 disables failing agents for silence alone
        self.heartbeat_timeout = heartbeat_timeout
        self._clock = clock or asyncio.get_running_loop().time
        self._started = self._clock()
        self._heard: dict[str, float] = {}
        #: when this node first knew of each agent it has not heard from (see above): the
        #: agents of the first check were known from the start
        self._known: dict[str, float] = {}
        self._checked = False
        self._dropped: dict[str, float] = {}
        self._connections: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._recoveries: set[asyncio.Task[None]] = set()
        self._recovering: set[str] = set()
        #: agents whose presence here changed since :meth:`drain_changes` (remote only)
        self._changed: set[str] | None = None if remote is None else set()
        #: agents forgotten since :meth:`drain_changes` (remote only)
        self._departed: set[str] = set()
        #: each agent's shortest effective subscription timeout, as of a registry version
        self._soonest: dict[str, float] = {}
        self._soonest_as_of: int | None = None

    # -- what the transports and the service report ---------------------------

    def seen(self, agent_id: str) -> None:
        self._heard[agent_id] = self._clock()
        if self._changed is not None:
            self._changed.add(agent_id)

    def connected(self, agent_id: str) -> None:
        self._connections[agent_id] += 1
        self.seen(agent_id)
        agent = self.service.field.state.agents.get(agent_id)
        if agent is not None and agent.status == "failed":
            self._spawn_recovery(agent_id)

    def disconnected(self, agent_id: str) -> None:
        self._connections[agent_id] -= 1
        if self._connections[agent_id] <= 0:
            del self._connections[agent_id]
            self._dropped[agent_id] = self._clock()
        if self._changed is not None:
            self._changed.add(agent_id)

    def drain_changes(self) -> dict[str, PresenceReport]:
        """This node's presence that changed since the last call, by agent (see
        :data:`PresenceReport`), for the other nodes; empty without a remote source."""
        if not self._changed and not self._departed:
            return {}
        now = self._clock()
        changes: dict[str, PresenceReport] = {}
        for agent_id in self._changed or ():
            heard = self._heard.get(agent_id)
            dropped = self._dropped.get(agent_id)
            changes[agent_id] = (
                self._connections.get(agent_id, 0),
                None if heard is None else now - heard,
                None if dropped is None else now - dropped,
            )
        changes.update(dict.fromkeys(self._departed))
        if self._changed is not None:
            self._changed.clear()
        self._departed.clear()
        return changes

    # -- the monitor -----------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="field-liveness")

    async def stop(self) -> None:
        for task in list(self._recoveries):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def due(self) -> list[tuple[str, str]]:
        """The live agents that have gone silent for too long, with the reason."""
        now = self._clock()
        found = []
        for agent_id, agent in self.service.field.state.agents.items():
            if agent.status == "failed" or agent_id in self._connections:
                continue
            if agent_id not in self._heard:
                self._known.setdefault(agent_id, now if self._checked else self._started)
            reason = self.failure(agent_id, now)
            if reason is not None:
                found.append((agent_id, reason))
        self._checked = True
        return found

    def presence_of(self, agent_id: str, now: float) -> tuple[bool, float, float | None]:
        """Whether ``agent_id`` holds a push connection (on any node), when it was last
        heard from and when its last connection closed (None: never), in this monitor's
        clock: the latest of this node's and the other nodes'."""
        heard = self._heard.get(agent_id)
        if heard is None:
            heard = self._known.get(agent_id, self._started)
        dropped = self._dropped.get(agent_id)
        connected = agent_id in self._connections
        if self.remote is None:
            return connected, heard, dropped
        connections, heard_ago, dropped_ago = self.remote.presence(agent_id)
        if heard_ago is not None:
            heard = max(heard, now - heard_ago)
        if dropped_ago is not None:
            dropped = now - dropped_ago if dropped is None else max(dropped, now - dropped_ago)
        return connected or connections > 0, heard, dropped

    def failure(self, agent_id: str, now: float) -> str | None:
        """Why ``agent_id`` is failed at ``now``; None while it is live (it holds a push
        connection, was heard from within ``heartbeat_timeout``, or its last connection
        closed within ``failure_grace``)."""
        connected, heard, dropped = self.presence_of(agent_id, now)
        if connected:
            return None
        grace, timeout = self.failure_grace, self.heartbeat_timeout
        if dropped is not None and now - dropped < grace:
            return None
        if timeout:
            if now - heard < timeout:
                return None
        elif dropped is None or heard > dropped:
            return None  # silence alone never fails an agent
        silent = _seconds(now - heard)
        if dropped is None or (timeout and heard + timeout >= dropped + grace):
            return (
                f"not heard from for {silent} s (heartbeat_timeout {timeout:g} s) "
                "and no push connection open"
            )
        closed = _seconds(now - dropped)
        if heard <= dropped:
            return (
                f"no request in the {closed} s since its last push connection closed "
                f"(failure_grace {grace:g} s)"
            )
        return (
            f"no push connection for {closed} s (failure_grace {grace:g} s) and no request "
            f"for {silent} s (heartbeat_timeout {timeout:g} s)"
        )

    async def _run(self) -> None:
        tick = max(0.01, min(self.failure_grace, self.heartbeat_timeout or 60.0) / 4)
        while True:
            if self.remote is None or self.remote.decides():
                await self._fail_silent()
                await self._expire_idle()
            self._recover_connected()
            self.forget_departed()
            await asyncio.sleep(tick)

    async def _fail_silent(self) -> None:
        for agent_id, reason in self.due():
            try:
                outcome = await self.service.execute(
                    functools.partial(Field.fail_agent, agent_id=agent_id, reason=reason),
                    operation="LIVENESS",
                )
            except FieldError as error:  # e.g. the log is full: try again next tick
                logger.warning("could not declare %s failed: %s", agent_id, error.message)
                continue
            if outcome.entries:
                logger.info("agent %s failed: %s", agent_id, reason)

    async def _expire_idle(self) -> None:
        for agent_id, idle in self.expiring():
            try:
                outcome = await self.service.execute(
                    functools.partial(Field.expire_subscriptions, agent_id=agent_id, idle=idle),
                    operation="LIVENESS",
                )
            except FieldError as error:
                logger.warning("could not expire %s's subscriptions: %s", agent_id, error)
                continue
            for entry in outcome.entries:
                logger.info(
                    "subscription %s of %s expired", entry.data["subscription_id"], agent_id
                )

    def _recover_connected(self) -> None:
        """An agent holding a push connection here is live: if it was failed all the same
        (by a node deciding on presence a moment old), it recovers."""
        agents = self.service.field.state.agents
        for agent_id in self._connections:
            agent = agents.get(agent_id)
            if agent is not None and agent.status == "failed":
                self._spawn_recovery(agent_id)

    def expiring(self) -> list[tuple[str, float]]:
        """Agents with a subscription whose timeout their inactivity has reached, and how
        long (seconds) they have been inactive."""
        state = self.service.field.state
        if self._soonest_as_of != state.registry.version:
            self._soonest = {}
            for agent_id, mine in state.active_subscriptions.items():
                timeouts = [
                    subscribe.effective_timeout(state.subscriptions[s], self.service.field.limits)
                    for s in mine
                ]
                known = [t for t in timeouts if t is not None]
                if known:
                    self._soonest[agent_id] = min(known)
            self._soonest_as_of = state.registry.version
        now = self._clock()
        found = []
        for agent_id, soonest in self._soonest.items():
            idle = now - self.presence_of(agent_id, now)[1]
            if idle >= soonest:
                found.append((agent_id, idle))
        return found

    def forget_departed(self) -> None:
        """Drop what is known of agents no longer registered: the tables stay bounded."""
        agents = self.service.field.state.agents
        for agent_id in [a for a in self._known if a not in agents]:
            del self._known[agent_id]
        for table in (self._heard, self._dropped):
            for agent_id in [a for a in table if a not in agents]:
                del table[agent_id]
                if self._changed is not None:  # the other nodes forget it too
                    self._changed.discard(agent_id)
                    self._departed.add(agent_id)

    def _spawn_recovery(self, agent_id: str) -> None:
        if agent_id in self._recovering:
            return

        async def recover() -> None:
            try:
                with contextlib.suppress(FieldError):
                    await self.service.execute(
                        lambda field: field.recover_agent(agent_id),
                        operation="LIVENESS",
                    )
            finally:
                self._recovering.discard(agent_id)

        self._recovering.add(agent_id)
        task = asyncio.create_task(recover())
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)


def _seconds(duration: float) -> str:
    """A duration for a reason: whole seconds, tenths below 10 s."""
    return f"{duration:.0f}" if duration >= 10 else f"{duration:.1f}"
