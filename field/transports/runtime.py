"""What the bindings serve: the parts of a started Field, and the one moment they change.

Every binding is built before the Field starts, with a :class:`Runtime` among its
arguments; the Field's parts exist only once the app has started. The composition root
alone moves the runtime: :meth:`Runtime.start` with every part (:class:`Running`) once
all have started, :meth:`Runtime.stop` as the Field stops, before its writer does.
Between the two a handler reads the parts through :meth:`Runtime.running` (``OVERLOADED``
outside them) or :attr:`Runtime.current` (None outside them): never a part that is
missing while another is there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..contract.errors import Code, FieldError

if TYPE_CHECKING:
    from ..engine.delivery import DeliveryEngine
    from ..engine.push import PushHub
    from ..engine.service import FieldService
    from ..engine.snapshotter import Snapshotter


@dataclass(frozen=True, slots=True)
class Running:
    """The started parts of one Field, which the bindings read."""

    #: the single writer and the state it keeps
    service: FieldService
    #: every push connection and the router of committed batches
    hub: PushHub
    #: durable delivery to webhooks and RAP runtimes (and the client RAP answers with)
    deliveries: DeliveryEngine
    #: writes snapshots of the state beside the server (None: a log in memory)
    snapshotter: Snapshotter | None = None
    #: the Field's nodes as this one knows them, itself included: (id, applied position,
    #: seconds since it last said so or None for this node, live); None: a Field of one
    nodes: Callable[[], list[tuple[str, int, float | None, bool]]] | None = None


class Runtime:
    """Whether the Field runs, and its parts while it does (see the module docstring)."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: Running | None = None

    @property
    def current(self) -> Running | None:
        """The started parts, or None while the Field is starting or stopping."""
        return self._running

    def running(self) -> Running:
        """The started parts; ``OVERLOADED`` (recoverable) while the Field is starting or
        stopping."""
        running = self._running
        if running is None:
            raise FieldError("the Field is starting", code=Code.OVERLOADED, recoverable=True)
        return running

    def start(self, running: Running) -> None:
        """The Field has started: serve ``running`` (once; the root's lifespan calls this)."""
        if self._running is not None:
            raise RuntimeError("the Field has started already")
        self._running = running

    def stop(self) -> None:
        """The Field is stopping: nothing new reaches its parts from now on."""
        self._running = None
