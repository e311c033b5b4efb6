"""Bounds on the delivery client's requests under way: slots, and who gets the next one.

Two kinds, both handing a released slot straight to the waiter it is for, so that
a free slot and a waiter never coexist and a release wakes one task without
looking through the others (``asyncio.Semaphore``, in Python 3.11, looks through
its waiters on every release, past those it woke that have not run yet: with
hundreds of deliveries waiting, that was tens of microseconds a release):

* :class:`Slots`: first come, first served, in constant time. One agent's share of
  the client: each delivery has at most one request at a time, so among one
  agent's deliveries first come is round robin.
* :class:`FairSlots`: waiters are grouped by agent, and a released slot goes to the
  waiting agent that holds the fewest slots (max-min fair), in turn among those
  that hold as many, first come first served within an agent. Ten thousand
  requests of one agent, held or waiting, do not delay another agent's request
  past the next release. A release costs constant time, but for the search of the
  lowest level held, which is at most an agent's share long.

A waiter cancelled while it waits gives up its turn, never a slot; one handed a
slot and cancelled before it ran passes the slot on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque


class Slots:
    """At most ``limit`` holders at once; the others wait, first come, first served."""

    __slots__ = ("_free", "_waiters", "users")

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: tasks holding a slot or waiting for one
        self.users = 0

    async def __aenter__(self) -> None:
        if not self.take():
            await self.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def take(self) -> bool:
        """Hold a slot if one is free now (then no one is waiting): whether it did."""
        if self._free > 0:
            self._free -= 1
            self.users += 1
            return True
        return False

    async def wait(self) -> None:
        """Wait for a slot (after :meth:`take` found none); :meth:`release` it after."""
        self.users += 1
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self.users -= 1
            if waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            else:  # handed a slot, then cancelled before it ran: pass the slot on
                self._release()
            raise

    def release(self) -> None:
        self.users -= 1
        self._release()

    def _release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class FairSlots:
    """At most ``limit`` holders at once; a released slot goes to the waiting agent that
    holds the fewest, in turn among those that hold as many.

    Each waiting agent is in ``_levels[n]``, ``n`` the slots it holds, in the order of
    its next turn, with its waiters in arrival order in ``_queues``. A release takes the
    first agent of the lowest level, hands the slot to its first waiter still waiting
    and, if it has more, puts it at the end of the level above. So an agent that holds
    nothing is served at the next release however many the others hold or wait for,
    and agents that hold as many take turns (round robin). ``_lowest`` is at or below
    the lowest level with an agent: the search for it starts there.
    """

    __slots__ = ("_free", "_held", "_queues", "_levels", "_lowest", "users")

    def __init__(self, limit: int) -> None:
        self._free = limit
        #: agents holding slots: how many each
        self._held: dict[str, int] = {}
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._levels: dict[int, OrderedDict[str, None]] = {}
        self._lowest = 0
        #: tasks holding a slot or waiting for one
        self.users = 0

    @property
    def free(self) -> int:
        """Slots no one holds (never more than 0 while someone waits)."""
        return self._free

    @property
    def waiting(self) -> bool:
        """Whether some agent waits for a slot."""
        return bool(self._queues)

    def held(self, agent: str) -> int:
        """The slots ``agent`` holds."""
        return self._held.get(agent, 0)

    async def acquire(self, agent: str) -> None:
        """Hold a slot for ``agent`` (wait for its turn); :meth:`release` it after."""
        if not self.take(agent):
            await self.wait(agent)

    def take(self, agent: str) -> bool:
        """Hold a slot for ``agent`` if one is free now (then no one is waiting): whether
        it did."""
        if self._free > 0:
            self._free -= 1
            self._held[agent] = self._held.get(agent, 0) + 1
            self.users += 1
            return True
        return False

    async def wait(self, agent: str) -> None:
        """Wait for the turn of ``agent`` (after :meth:`take` found no slot)."""
        self.users += 1
        waiter = asyncio.get_running_loop().create_future()
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = deque()
            self._enter(agent)
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self.users -= 1
            if waiter.cancelled():
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                if not queue and self._queues.get(agent) is queue:
                    del self._queues[agent]
                    self._leave(agent)
            else:  # handed a slot, then cancelled before it ran: pass the slot on
                self._give_back(agent)
            raise

    def release(self, agent: str) -> None:
        """Give back a slot ``agent`` holds."""
        self.users -= 1
        self._give_back(agent)

    def _give_back(self, agent: str) -> None:
        held = self._held[agent] - 1
        if held:
            self._held[agent] = held
        else:
            del self._held[agent]
        if not self._queues:  # no one waits: the slot is free
            self._free += 1
            return
        if agent in self._queues:  # it waits too: one level down, at its end
            self._leave(agent, held + 1)
            self._enter(agent)
        self._hand_on()

    def _hand_on(self) -> None:
        queues, levels = self._queues, self._levels
        while queues:  # then some level has an agent
            while self._lowest not in levels:
                self._lowest += 1
            held = self._lowest
            level = levels[held]
            agent, _ = level.popitem(last=False)
            if not level:
                del levels[held]
            queue = queues[agent]
            while queue:
                waiter = queue.popleft()
                if not waiter.done():  # (one cancelled that has not run yet is done)
                    waiter.set_result(None)
                    self._held[agent] = held + 1
                    if queue:
                        self._enter(agent)
                    else:
                        del queues[agent]
                    return
            del queues[agent]  # it had only waiters cancelled that have not run yet
        self._free += 1

    def _enter(self, agent: str) -> None:
        """A waiting agent takes its place at the end of the level of what it holds."""
        held = self._held.get(agent, 0)
        level = self._levels.get(held)
        if level is None:
            level = self._levels[held] = OrderedDict()
        level[agent] = None
        self._lowest = min(self._lowest, held)

    def _leave(self, agent: str, held: int | None = None) -> None:
        """A waiting agent leaves its level (the level of ``held``, or of what it holds)."""
        if held is None:
            held = self._held.get(agent, 0)
        level = self._levels[held]
        del level[agent]
        if not level:
            del self._levels[held]
