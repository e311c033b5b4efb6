"""Liveness: agents that go silent are declared failed.

An agent is live while it holds a push connection (WebSocket or SSE) or
has been heard from (any authenticated request) within
``heartbeat_timeout`` seconds. When its last connection drops, it has
``failure_grace`` seconds to come back (reconnect or send anything);
otherwise, and when it stays silent past ``heartbeat_timeout`` with no
connection, the :class:`Liveness` monitor runs :meth:`Field.fail_agent`
through the service like any operation: an ``agent.failed`` entry, made
durable, pushed to subscribers. A failed agent that is heard from again
recovers (``agent.recovered``).

The same monitor expires subscriptions: one whose agent has had no activity
for its effective timeout (its own ``timeout``, at most
``--max-subscription-timeout``) is cancelled with the reason ``expired``;
the agent is not failed for it. Activity is what the agent does: a request
(any operation, on any transport) or opening a push connection; holding a
connection open is not (a listener with nothing to do lets its timed
subscriptions expire, as a hibernating one does).

What was last heard is not logged: after a restart every live agent gets
a fresh ``heartbeat_timeout`` (and subscription timeout) from the moment
the server started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable

from .core import subscribe
from .core.field import Field
from .errors import FieldError
from .service import FieldService

logger = logging.getLogger("field.liveness")


class Liveness:
    """Watches agents' connections and requests; fails the silent ones."""

    def __init__(
        self,
        service: FieldService,
        *,
        failure_grace: float,
        heartbeat_timeout: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.service = service
        self.failure_grace = failure_grace
        #: 0 disables failing agents for silence alone
        self.heartbeat_timeout = heartbeat_timeout
        self._clock = clock or asyncio.get_running_loop().time
        self._started = self._clock()
        self._heard: dict[str, float] = {}
        self._dropped: dict[str, float] = {}
        self._connections: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._recoveries: set[asyncio.Task[None]] = set()
        #: each agent's shortest effective subscription timeout, as of a registry version
        self._soonest: dict[str, float] = {}
        self._soonest_as_of: int | None = None

    # -- what the transports and the service report ---------------------------

    def seen(self, agent_id: str) -> None:
        self._heard[agent_id] = self._clock()
        self._dropped.pop(agent_id, None)

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
            heard = self._heard.get(agent_id, self._started)
            dropped = self._dropped.get(agent_id)
            if dropped is not None and now - max(dropped, heard) >= self.failure_grace:
                found.append(
                    (agent_id, f"connection lost and not back within {self.failure_grace:g} s")
                )
            elif self.heartbeat_timeout and now - heard >= self.heartbeat_timeout:
                found.append((agent_id, f"not heard from for {self.heartbeat_timeout:g} s"))
        return found

    async def _run(self) -> None:
        tick = max(0.01, min(self.failure_grace, self.heartbeat_timeout or 60.0) / 4)
        while True:
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
                self._dropped.pop(agent_id, None)
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
            self.forget_departed()
            await asyncio.sleep(tick)

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
            idle = now - self._heard.get(agent_id, self._started)
            if idle >= soonest:
                found.append((agent_id, idle))
        return found

    def forget_departed(self) -> None:
        """Drop what is known of agents no longer registered: the tables stay bounded."""
        agents = self.service.field.state.agents
        for table in (self._heard, self._dropped):
            for agent_id in [a for a in table if a not in agents]:
                del table[agent_id]

    def _spawn_recovery(self, agent_id: str) -> None:
        async def recover() -> None:
            with contextlib.suppress(FieldError):
                await self.service.execute(
                    lambda field: field.recover_agent(agent_id), operation="LIVENESS"
                )

        task = asyncio.create_task(recover())
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)
