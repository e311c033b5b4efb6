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
            reason = self.failure(agent_id, now)
            if reason is not None:
                found.append((agent_id, reason))
        return found

    def failure(self, agent_id: str, now: float) -> str | None:
        """Why ``agent_id``, holding no push connection, is failed at ``now``; None while it
        is live (heard from within ``heartbeat_timeout``, or its last connection closed
        within ``failure_grace``)."""
        heard = self._heard.get(agent_id, self._started)
        dropped = self._dropped.get(agent_id)
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


def _seconds(duration: float) -> str:
    """A duration for a reason: whole seconds, tenths below 10 s."""
    return f"{duration:.0f}" if duration >= 10 else f"{duration:.1f}"
