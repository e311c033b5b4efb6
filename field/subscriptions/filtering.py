"""Subscription filters: the CEL stage after the vectorized matcher.

A subscription may carry ``filter``, a CEL expression (compiled and checked
by :mod:`field.expressions.filters`). The :class:`~field.subscriptions.matcher.Matcher`
first decides, for all subscriptions at once, which ones an event notifies
(events, thresholds, visibility); :meth:`FilterStage.screen` then drops the
rows whose filter is not true. The matcher calls it on every match it
returns, live and in a replay alike, so every stream (WebSocket, SSE,
webhook, RAP) gets the same answer, and the answer is a function of the
log: of the event (built from its entry), the subscription (its entry)
and the allow lists as of the event's position.

What an expression reads (documented in ``protocol/README.md``, "Filters"):

* ``event``: :func:`event_context`, built once per event and shared by
  every subscription the event reaches;
* ``subscriber``: the subscribing agent as registered (``id``, ``role``,
  ``interests``, ``authority``, ``current_task``). A subscription lives
  within one registration of its agent (REGISTER of a registered id is
  refused; DEREGISTER ends its subscriptions), so this is the agent as of
  every event the subscription can be told of;
* ``parameters``: the agent's allow lists (:mod:`field.subscriptions.allow_lists`)
  as of the event's position, each as a map ``{value: true}``, or the
  values the subscription's ``bindings`` seal it to. Only the lists the
  expression names are built. An unsealed list the expression names that
  is empty means "no match", without evaluating (as a tool event whose
  allow list is empty is discarded).

Cost: what a filter may cost is estimated before it is accepted (with the
largest values of :func:`filter_shapes`) and bounded as it runs
(:mod:`field.expressions.filters`). An expression that reads only ``event`` runs
once per event whatever the number of subscriptions holding it (texts are
compiled once and shared); one that reads ``subscriber`` or ``parameters``
runs once per event and distinct input: the ``subscriber`` fields it reads
(all of them unless it reads them only as ``subscriber.<field>``) and the
allow lists it reads (the same map for one agent's list as of one position,
and for equal bindings). The time each evaluation takes is charged to the
agent that needed it (:class:`FilterTime`); see :class:`FilterStage` for
what happens to an agent past its share.

A failed evaluation (a missing field, a wrong type, a result that is not a
boolean, its budget spent) is "no match" for that subscription; the stage
counts it, in memory, once per event position (a replay of events already
counted adds nothing), and :meth:`FilterStage.status` shows the count and
the last error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ..contract.model import Limits
from ..contract.ratelimit import KeyedLimiter, Rate
from ..expressions import costs
from ..expressions.filters import (
    Context,
    Expression,
    InvalidFilter,
    Path,
    TooLarge,
    check_types,
    compile_expression,
    path_of,
)
from ..expressions.tree import Has, Ident, Node, Operator, Select
from .allow_lists import ALLOW_LIST_NAMES, AllowLists
from .events import FieldEvent
from .matcher import Match

if TYPE_CHECKING:
    from .registry import SubscriptionRegistry


class SubscribedState(Protocol):
    """What the filter stage reads of the Field's state (the core's ``FieldState``): the
    subscriptions, their registry and the agents' allow lists."""

    @property
    def subscriptions(self) -> dict[str, dict[str, Any]]: ...

    @property
    def registry(self) -> SubscriptionRegistry: ...

    @property
    def allow_lists(self) -> AllowLists: ...


#: The longest a step of a filter's estimated cost takes, in seconds (benchmarks/
#: filters_hostile.py measures it: at most about 70 ns on the machines of benchmarks/README.md).
STEP_SECONDS = 1e-7
#: The variables a subscription filter may read.
FILTER_VARIABLES: tuple[str, ...] = ("event", "subscriber", "parameters")
#: Most characters of a ``last_error`` kept.
ERROR_CHARS = 200


def event_context(event: FieldEvent, cursor: str) -> dict[str, Any]:
    """The ``event`` a filter reads: the event's own fields and the entity as of it."""
    context: dict[str, Any] = {
        "name": event.name,
        "epoch": event.epoch,
        "cursor": cursor,
        "actor": event.actor,
        "summary": event.summary,
        "entity": {"type": event.entity_type, "id": event.entity_id},
        "memory_unit_id": event.memory_unit_id,
        "conflict_id": event.conflict_id,
    }
    if event.facts:
        context.update(event.facts)
    return context


def filter_shapes(limits: Limits) -> dict[str, costs.Shape]:
    """The largest values a filter can be given (:mod:`field.expressions.costs`): a unit by the
    RECORD limits, every other entity (and a unit's payload) as any JSON document of a
    request's size, the subscriber as registered, allow lists by their cap."""
    string, record = costs.string, costs.record
    document = costs.document(limits.max_body_bytes, limits.max_json_items)
    ident, text = string(limits.max_id_chars), string(limits.max_text_chars)
    word = string(64)
    unit = record(
        {
            "id": ident,
            "type": word,
            "content": string(limits.max_content_chars),
            "confidence": record({"score": costs.DOUBLE, "reasoning": text}),
            "intent": record({"purpose": text, "task_id": ident, "rationale": text}),
            "source": record(
                {
                    "agent_id": ident,
                    "agent_role": string(limits.max_role_chars),
                    "session_id": ident,
                }
            ),
            "relations": costs.list_of(
                record({"type": word, "target_id": ident, "description": text}),
                limits.max_relations,
            ),
            "status": word,
            "epoch": costs.INT,
            "timestamp": word,
            "visibility": word,
            "payload": document,
        },
        rest=document,
    )
    event = record(
        {
            "name": word,
            "epoch": costs.INT,
            "cursor": string(128),
            "actor": ident,
            "summary": text,
            "entity": record({"type": word, "id": ident}),
            "memory_unit_id": ident,
            "conflict_id": ident,
            "unit": unit,
            "conflict": record(
                {
                    "id": ident,
                    "unit_a": ident,
                    "unit_b": ident,
                    "status": word,
                    "type": word,
                    "description": text,
                    "detected_by": ident,
                    "resolution": text,
                },
                rest=document,
            ),
            "task": record(
                {
                    "id": ident,
                    "title": text,
                    "description": text,
                    "status": word,
                    "assignee": ident,
                    "created_by": ident,
                    "depends_on": costs.list_of(ident, limits.max_list_items),
                },
                rest=document,
            ),
            "handoff": record(
                {"id": ident, "task_id": ident, "from_agent_id": ident, "to_agent_id": ident},
                rest=document,
            ),
            "agent": record(
                {
                    "id": ident,
                    "role": string(limits.max_role_chars),
                    "interests": costs.list_of(
                        string(limits.max_interest_chars), limits.max_list_items
                    ),
                    "current_task_id": ident,
                    "registered_epoch": costs.INT,
                    "authority": costs.INT,
                    "status": word,
                },
                rest=document,
            ),
            "session": record(
                {
                    "id": ident,
                    "name": text,
                    "status": word,
                    "members": costs.list_of(ident, limits.max_list_items),
                },
                rest=document,
            ),
        }
    )
    interest = string(limits.max_interest_chars)
    subscriber = record(
        {
            "id": ident,
            "role": string(limits.max_role_chars),
            "interests": costs.list_of(interest, limits.max_list_items),
            "authority": costs.INT,
            "current_task": ident,
        }
    )
    allow_list = costs.map_of(string(MAX_BINDING_CHARS), costs.BOOL, MAX_LIST_VALUES)
    parameters = record(dict.fromkeys(ALLOW_LIST_NAMES, allow_list))
    return {"event": event, "subscriber": subscriber, "parameters": parameters}


#: An allow list's cap and the longest value a binding seals (field.subscriptions.allow_lists and
#: SUBSCRIBE's validation hold them to these).
MAX_LIST_VALUES = 1000
MAX_BINDING_CHARS = 256
_SHAPES = filter_shapes(Limits())


@dataclass(frozen=True, slots=True)
class _Program:
    expression: Expression
    #: reads neither ``subscriber`` nor ``parameters``: one result per event
    event_only: bool
    #: the allow lists it reads
    parameters: tuple[str, ...]
    #: the ``subscriber`` fields it reads, when it reads them only as ``subscriber.<f>``
    #: (None: it may read all of it); subscribers alike in those share one evaluation
    subscriber_fields: tuple[str, ...] | None = None
    #: when it reads ``subscriber`` and ``parameters`` only through :class:`Probe` s:
    #: those; the result then depends on the subscriber only through their answers
    probes: tuple[Probe, ...] | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """``<event path> in parameters.<name>``, ``<event path> in subscriber.<field>``,
    ``<event path> == subscriber.<field>`` or its ``!=`` (either side): all a filter reads
    of the subscriber there is whether the event's value is in (or equals) its value."""

    path: tuple[str, ...]  # into the event context, after ``event``
    target: str  # "parameters" or "subscriber"
    name: str  # the allow list or the subscriber field
    membership: bool  # ``in`` (else equality)


def compile_filter(
    text: Any, field: str = "subscription.filter", *, stored: bool = False
) -> _Program:
    """Compile a subscription filter, refusing what the Field will not run
    (``INVALID_FILTER``): see :func:`~field.expressions.filters.compile_expression` (and its
    ``stored``); also an allow list that does not exist, and a type error no event can
    avoid."""
    expression = compile_expression(
        text, FILTER_VARIABLES, field=field, shapes=_SHAPES, stored=stored
    )
    names: tuple[str, ...] = ()
    if "parameters" in expression.variables:
        paths = expression.paths["parameters"]
        named = None if paths is None else {path[0] for path in paths}
        unknown = sorted((named or set()) - set(ALLOW_LIST_NAMES))
        if unknown:
            raise InvalidFilter(
                f"{field} reads unknown allow list(s) parameters.{', parameters.'.join(unknown)}; "
                f"the Field keeps {', '.join(ALLOW_LIST_NAMES)}",
                details={"field": field, "unknown_parameters": unknown},
            )
        # read otherwise than by name (``size(parameters)``): it may read any of them
        names = (
            ALLOW_LIST_NAMES if named is None else tuple(n for n in ALLOW_LIST_NAMES if n in named)
        )
    check_types(expression, _SAMPLES, field)
    fields: tuple[str, ...] | None = ()
    if "subscriber" in expression.variables:
        paths = expression.paths["subscriber"]
        fields = None if paths is None else tuple(sorted({path[0] for path in paths}))
    event_only = expression.variables <= {"event"}
    probes = None if event_only else _probes(expression.tree)
    return _Program(expression, event_only, names, fields, probes)


def _probes(tree: Node) -> tuple[Probe, ...] | None:
    """The probes of an expression that reads ``subscriber`` and ``parameters`` only
    through them, or None (then every distinct input is evaluated)."""
    found: list[Probe] = []

    def visit(node: Node) -> bool:  # False: reads the subscriber some other way
        probe = _probe(node)
        if probe is not None:
            found.append(probe)
            return True
        if isinstance(node, Ident):
            return node.name not in ("subscriber", "parameters")
        return all(visit(child) for child in node.children())

    return tuple(found) if visit(tree) else None


def _probe(node: Node) -> Probe | None:
    if not (isinstance(node, Operator) and node.op in ("in", "==", "!=")):
        return None
    left, right = node.args
    if node.op == "in":
        path, target = _event_path(left), _target(right)
        if path is None or target is None:
            return None
        return Probe(path, target[0], target[1], membership=True)
    for one, other in ((left, right), (right, left)):
        path, target = _event_path(one), _target(other)
        if path is not None and target is not None and target[0] == "subscriber":
            return Probe(path, "subscriber", target[1], membership=False)
    return None


def _event_path(node: Node) -> Path | None:
    """The path ``node`` reads of ``event`` (a value, not ``has``: a probe compares it)."""
    return None if isinstance(node, Has) else path_of(node, "event")


def _target(node: Node) -> tuple[str, str] | None:
    if (
        isinstance(node, Select)
        and isinstance(node.operand, Ident)
        and node.operand.name in ("parameters", "subscriber")
    ):
        return node.operand.name, node.name
    return None


class FilterTime:
    """Each agent's share of the time its subscriptions' filters take to evaluate: a
    token bucket of seconds per agent, ``share`` of a second every second and ``burst``
    at once, spent by what each evaluation measured (so it may run into debt, which
    time pays back). An agent whose bucket is empty has its filters set aside
    (:meth:`FilterStage.screen`) until it refills."""

    def __init__(
        self, share: float, burst: float, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        # counted in microseconds: a bucket's burst is at least one token
        self._limiter = KeyedLimiter(Rate(share * 1e6, max(1.0, burst * 1e6)), clock=clock)
        self.burst = burst
        #: seconds charged in all, to every agent
        self.spent = 0.0
        self.clock = clock

    def available(self, agent_id: str) -> bool:
        return self._limiter.wait(agent_id) == 0.0

    def wait(self, agent_id: str) -> float:
        """Seconds until ``agent_id`` has time again (0.0: it has)."""
        return self._limiter.wait(agent_id)

    def spend(self, agent_id: str, seconds: float) -> None:
        self._limiter.charge(agent_id, seconds * 1e6)
        self.spent += seconds

    def forget(self, agent_id: str) -> None:
        self._limiter.forget(agent_id)


@dataclass(slots=True)
class _Errors:
    count: int = 0
    last_error: str | None = None
    #: the newest event position counted (a replay does not count it again)
    position: int = 0


class _EventRun:
    """One event's evaluations: the ``event`` each program reads (what it reads of it,
    converted once per event and program), the subscriber's inputs through a resolver."""

    __slots__ = ("_contexts", "_event", "_cursor", "_current", "_values")

    def __init__(self, event: FieldEvent, cursor: Callable[[int], str]) -> None:
        self._event = event
        self._cursor = cursor
        self._contexts: dict[int, Context | str] = {}
        self._current: dict[str, Any] = {}
        self._values: dict[str, Any] | None = None

    @property
    def values(self) -> dict[str, Any]:
        """The ``event`` variable, as Python values."""
        if self._values is None:
            event = self._event
            self._values = event_context(event, self._cursor(event.position))
        return self._values

    def run(
        self,
        program: _Program,
        subscriber: dict[str, Any] | None,
        parameters: dict[str, Any] | None,
    ) -> tuple[bool, str | None]:
        context = self._contexts.get(id(program))
        expression = program.expression
        if context is None:
            try:
                event = expression.bind("event", self.values)
            except TooLarge as error:
                context = self._contexts[id(program)] = str(error)
            else:
                context = self._contexts[id(program)] = Context(event)
                # per subscriber: read through the resolver, converted only when read
                context.set_variable_resolver(self._current.get)
        if isinstance(context, str):  # the event is larger than the program may read
            return False, context
        self._current.clear()
        try:
            if subscriber is not None:
                self._current.update(expression.bind("subscriber", subscriber))
            if parameters is not None:
                self._current.update(expression.bind("parameters", parameters))
        except TooLarge as error:
            return False, str(error)
        return expression.outcome(context)


class FilterStage:
    """Drops the notifications whose subscription filter is not true.

    With a :class:`FilterTime`, the time each evaluation takes is charged to the agent
    whose subscription needed it. When the screening of newly written events is asked to
    (``screen(..., defer=True)``), the rows of an agent that has used its share are not
    evaluated: they are set aside in :attr:`deferred` (subscription id → the first
    position set aside), and the caller has those subscriptions' streams catch up from the
    log, at the pace the agent's share allows; until one of them has (:attr:`lagging`),
    their rows are set aside whatever the agent's time. What reaches a subscription stays
    a function of the log; only when it arrives depends on the agent's filters.
    """

    def __init__(
        self,
        state: SubscribedState,
        cursor: Callable[[int], str],
        *,
        time: FilterTime | None = None,
    ) -> None:
        self.state = state
        self._cursor = cursor
        self.time = time
        #: subscriptions set aside by the last screenings with ``defer`` (see above)
        self.deferred: dict[str, int] = {}
        #: subscriptions whose streams are catching up (:meth:`lag`, :meth:`unlag`)
        self.lagging: set[str] = set()
        self._lagging_changes = 0
        self._lagging_key: tuple[int, ...] | None = None
        self._lagging_mask: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        #: registry rows set aside in the screening under way
        self._deferred_rows: set[int] = set()
        self._deferring = False
        #: compiled programs by the registry's filter code (the log keeps the text)
        self._programs: dict[int, _Program | None] = {}
        self._errors: dict[str, _Errors] = {}
        #: sealed allow lists by subscription: ``{name: {value: True}}``
        self._sealed: dict[str, dict[str, dict[str, bool]]] = {}
        self._bound: dict[frozenset[str], dict[str, bool]] = {}
        #: per program with probes: each registry row's class (-1: not yet known), and
        #: each class's inputs; rows of one class give every probe the same answer
        self._class_of: dict[int, npt.NDArray[np.int32]] = {}
        self._classes: dict[int, list[tuple[int, str, dict[str, dict[str, bool]]]]] = {}
        self._class_ids: dict[int, dict[tuple[Any, ...], int]] = {}
        #: per program with probes: the id of each distinct set of answers, and the answers
        #: of the classes whose answers depend only on the event's values, by those values
        self._keys: dict[int, dict[tuple[Any, ...], int]] = {}
        self._answers: dict[int, dict[tuple[Any, ...], npt.NDArray[np.int32]]] = {}
        self._answer_cells = 0
        #: how many evaluations ran (for measurements)
        self.evaluations = 0

    def status(self, subscription_id: str) -> dict[str, Any] | None:
        """``{expression, errors, last_error}`` of a subscription's filter (None: it has none)."""
        text = self.state.subscriptions[subscription_id].get("filter")
        if text is None:
            return None
        errors = self._errors.get(subscription_id) or _Errors()
        return {"expression": text, "errors": errors.count, "last_error": errors.last_error}

    def screen(self, matches: list[Match], *, defer: bool = False) -> list[Match]:
        """The matches without the rows whose filter is false or failed (and, with
        ``defer``, without the rows set aside: :attr:`deferred`)."""
        registry = self.state.registry
        if not registry.filter_texts:
            return matches
        self._deferring = defer and self.time is not None
        self._deferred_rows.clear()
        codes_of = registry.filter.view
        screened = []
        for match in matches:
            codes = codes_of[match.rows]
            if codes.max(initial=-1) < 0:
                screened.append(match)
                continue
            keep = self._keep(match, codes)
            if keep.all():
                screened.append(match)
            elif keep.any():
                screened.append(
                    Match(
                        match.event,
                        match.rows[keep],
                        match.relevance[keep],
                        match.requires_action[keep],
                        match.flags[keep],
                    )
                )
        return screened

    def replay_page(self, subscription_id: str, most: int) -> int:
        """How many entries a replay of ``subscription_id`` may screen at once: as many as
        its filter's worst cost lets run within its agent's burst of filter time."""
        if self.time is None:
            return most
        text = self.state.subscriptions[subscription_id].get("filter")
        if text is None:
            return most
        code = self.state.registry.filters.find(text)
        program = self._program(code) if code >= 0 else None
        if program is None:
            return most
        worst = program.expression.cost * STEP_SECONDS
        return max(1, min(most, int(self.time.burst / worst)))

    def take_deferred(self) -> dict[str, int]:
        """The subscriptions set aside since the last call, and where each was."""
        deferred, self.deferred = self.deferred, {}
        return deferred

    def _agent_of(self, row: int) -> str:
        registry = self.state.registry
        return registry.agents.names[int(registry.agent.view[row])]

    def _set_aside(self, match: Match, at: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """``at`` without the rows set aside: those of agents out of time (added to
        :attr:`deferred`), of subscriptions set aside earlier in this screening, and of
        those whose streams are catching up (:attr:`lagging`)."""
        if not self._deferring or self.time is None:
            return at
        registry = self.state.registry
        rows = match.rows[at]
        aside = self._lagging_rows()[rows]
        codes = registry.agent.view[rows]
        names = registry.agents.names
        out = [code for code in np.unique(codes).tolist() if not self.time.available(names[code])]
        if out:
            aside |= np.isin(codes, out)
        if self._deferred_rows:
            aside |= np.isin(rows, list(self._deferred_rows))
        if not aside.any():
            return at
        for row in rows[aside].tolist():
            subscription_id = registry.ids[row]
            if subscription_id not in self.lagging:
                self.deferred.setdefault(subscription_id, match.event.position)
                self._deferred_rows.add(row)
        return at[~aside]

    def _lagging_rows(self) -> npt.NDArray[np.bool_]:
        """Whether each registry row's subscription is catching up (kept while neither
        the set nor the registry changes)."""
        registry = self.state.registry
        key = (registry.version, len(registry), len(self.lagging), self._lagging_changes)
        if self._lagging_key != key:
            mask = np.zeros(len(registry), dtype=bool)
            rows = [registry.rows[sid] for sid in self.lagging if sid in registry.rows]
            mask[rows] = True
            self._lagging_mask, self._lagging_key = mask, key
        return self._lagging_mask

    def lag(self, subscription_id: str) -> None:
        """The subscription's streams catch up from the log: set its rows aside."""
        if subscription_id not in self.lagging:
            self.lagging.add(subscription_id)
            self._lagging_changes += 1

    def unlag(self, subscription_id: str) -> None:
        """One of the subscription's streams takes live events again."""
        if subscription_id in self.lagging:
            self.lagging.discard(subscription_id)
            self._lagging_changes += 1

    def _out_of_time(self, agent_id: str) -> bool:
        return self._deferring and self.time is not None and not self.time.available(agent_id)

    def _run(
        self,
        run: _EventRun,
        program: _Program,
        subscriber: dict[str, Any] | None,
        parameters: dict[str, Any] | None,
        agent_id: str,
    ) -> tuple[bool, str | None]:
        """One evaluation, its time charged to ``agent_id``."""
        self.evaluations += 1
        if self.time is None:
            return run.run(program, subscriber, parameters)
        began = time.perf_counter()
        try:
            return run.run(program, subscriber, parameters)
        finally:
            self.time.spend(agent_id, time.perf_counter() - began)

    def _keep(self, match: Match, codes: npt.NDArray[np.int32]) -> npt.NDArray[np.bool_]:
        event = match.event
        keep = codes < 0
        filtered = self._set_aside(match, np.flatnonzero(~keep))
        run = _EventRun(event, self._cursor)
        of_filtered = codes[filtered]
        for code in np.unique(of_filtered).tolist():
            at = filtered[of_filtered == code]
            program = self._program(code)
            if program is None:  # cannot happen with a log this Field wrote
                self._failed(match, at, "the filter no longer compiles")
                continue
            if program.event_only:
                agent_id = self._agent_of(int(match.rows[at[0]]))
                passed, error = self._run(run, program, None, None, agent_id)
                if passed:
                    keep[at] = True
                elif error is not None:
                    self._failed(match, at, error)
                continue
            if program.probes is None or not self._keep_probed(match, at, code, program, run, keep):
                self._keep_each(match, at, program, run, keep)
        return keep

    def _keep_probed(
        self,
        match: Match,
        at: npt.NDArray[np.intp],
        code: int,
        program: _Program,
        run: _EventRun,
        keep: npt.NDArray[np.bool_],
    ) -> bool:
        """A program whose reading of the subscriber is all in its probes: rows are grouped
        in classes (alike in what the probes read: profile, sealed lists or agent), each
        class answers the probes, and each distinct set of answers is evaluated once, with
        the inputs of the first class that gave it. False: the event's values cannot be
        probed (a list or a map), and nothing was done."""
        assert program.probes is not None
        values = tuple(_at_path(run.values, probe.path) for probe in program.probes)
        if not all(isinstance(v, _PROBED) or v is _MISSING for v in values):
            return False
        rows = match.rows[at]
        classes = self._classes_for(code, program, rows)
        unique, inverse = np.unique(classes, return_inverse=True)
        inputs = self._classes[code]
        position = match.event.position
        keys = self._keys.setdefault(code, {})
        # each class's set of answers (a key id) to these values: kept across events for
        # classes whose answers depend on nothing else (sealed lists, the subscriber)
        known = self._answers_to(code, values, len(inputs))
        key_of = known[unique]
        lists: dict[int, dict[str, Any] | None] = {}  # the allow lists read, by class
        for j in np.flatnonzero(key_of == UNKNOWN).tolist():
            cls = int(unique[j])
            profile, agent_id, sealed = inputs[cls]
            parameters = None
            if program.parameters:
                parameters = lists[cls] = self._parameters(program, agent_id, sealed, position)
                if parameters is None:
                    key_of[j] = NO_MATCH  # an empty, unsealed allow list
                    continue
            subscriber = self.state.registry.profile_agent[profile]
            answers = tuple(
                _answer(probe, value, parameters, subscriber)
                for probe, value in zip(program.probes, values, strict=True)
            )
            key_of[j] = keys.setdefault(answers, len(keys))
            if all(name in sealed for name in program.parameters):
                known[cls] = key_of[j]
        # one evaluation per distinct key, with the inputs of a class that gave it
        passed_by_key = np.zeros(len(keys), dtype=bool)
        failed_by_key: dict[int, str] = {}
        aside: set[int] = set()  # keys whose agent is out of time
        present, first = np.unique(key_of, return_index=True)
        for key, j in zip(present.tolist(), first.tolist(), strict=True):
            if key < 0:
                continue
            cls = int(unique[j])
            profile, agent_id, sealed = inputs[cls]
            parameters = None
            if program.parameters:
                parameters = (
                    lists[cls]
                    if cls in lists
                    else self._parameters(program, agent_id, sealed, position)
                )
            if self._out_of_time(agent_id):
                aside.add(key)
                continue
            subscriber = self.state.registry.profile_agent[profile]
            ok, error = self._run(run, program, subscriber, parameters, agent_id)
            if ok:
                passed_by_key[key] = True
            elif error is not None:
                failed_by_key[key] = error
        valid = key_of >= 0
        passed = np.zeros(len(unique), dtype=bool)
        passed[valid] = passed_by_key[key_of[valid]]
        keep[at] = passed[inverse]
        if aside:
            ids = self.state.registry.ids
            for i, row in enumerate(rows.tolist()):
                if int(key_of[inverse[i]]) in aside:
                    self.deferred.setdefault(ids[row], position)
        if failed_by_key:
            ids = self.state.registry.ids
            for i, row in enumerate(rows.tolist()):
                error = failed_by_key.get(int(key_of[inverse[i]]))
                if error is not None:
                    self._count(ids[row], position, error)
        return True

    def _answers_to(self, code: int, values: tuple[Any, ...], classes: int) -> Any:
        """The known key id of each class of program ``code`` for the probes' ``values``
        (UNKNOWN where not yet known), an array kept (bounded) across events."""
        cache = self._answers.setdefault(code, {})
        known = cache.get(values)
        if known is None or len(known) < classes:
            if self._answer_cells > ANSWER_CELLS:
                self._answers.clear()
                self._answer_cells = 0
                cache = self._answers.setdefault(code, {})
            grown = np.full(max(classes, 64), UNKNOWN, dtype=np.int32)
            if known is not None:
                grown[: len(known)] = known
            known = cache[values] = grown
            self._answer_cells += len(grown)
        return known

    def _classes_for(
        self, code: int, program: _Program, rows: npt.NDArray[np.int32]
    ) -> npt.NDArray[np.int32]:
        """The class of each of ``rows`` for program ``code``, made for rows not seen yet."""
        registry = self.state.registry
        known = self._class_of.get(code)
        if known is None or len(known) < len(registry):
            grown = np.full(max(len(registry), 1024), -1, dtype=np.int32)
            if known is not None:
                grown[: len(known)] = known
            known = self._class_of[code] = grown
        classes = known[rows]
        new = np.flatnonzero(classes < 0)
        if len(new):
            ids = self._class_ids.setdefault(code, {})
            inputs = self._classes.setdefault(code, [])
            reads_subscriber = any(p.target == "subscriber" for p in program.probes or ())
            profiles = registry.profile.view
            for i in new.tolist():
                row = int(rows[i])
                subscription = self.state.subscriptions[registry.ids[row]]
                agent_id = subscription["agent_id"]
                sealed = self._sealed_lists(subscription)
                profile = int(profiles[row])
                key = (
                    profile if reads_subscriber else -1,
                    *(
                        id(sealed[name]) if name in sealed else agent_id
                        for name in program.parameters
                    ),
                )
                cls = ids.get(key)
                if cls is None:
                    cls = ids[key] = len(inputs)
                    inputs.append((profile, agent_id, sealed))
                known[row] = classes[i] = cls
        return classes

    def _keep_each(
        self,
        match: Match,
        at: npt.NDArray[np.intp],
        program: _Program,
        run: _EventRun,
        keep: npt.NDArray[np.bool_],
    ) -> None:
        """A program reading ``subscriber`` or ``parameters``: once per distinct input
        (the subscriber fields it reads, the allow lists it reads as of the event)."""
        state = self.state
        registry = state.registry
        profiles = registry.profile.view
        position = match.event.position
        fields = program.subscriber_fields
        results: dict[tuple[Any, ...], tuple[bool, str | None]] = {}
        alive: list[Any] = []  # the maps whose ids are in keys, held for this event
        rows = match.rows[at].tolist()
        for i, row in zip(at.tolist(), rows, strict=True):
            subscription_id = registry.ids[row]
            profile = int(profiles[row])
            subscriber = registry.profile_agent[profile]
            parameters = None
            if program.parameters:
                subscription = state.subscriptions[subscription_id]
                sealed = self._sealed_lists(subscription)
                parameters = self._parameters(program, subscription["agent_id"], sealed, position)
                if parameters is None:
                    continue  # an empty, unsealed allow list: no match
                alive.append(parameters)
            if fields is None:
                who: Any = profile
            else:
                who = tuple(_frozen(subscriber.get(name)) for name in fields)
            key = (who, *(id(values) for values in (parameters or {}).values()))
            result = results.get(key)
            if result is None:
                agent_id = self._agent_of(row)
                if self._out_of_time(agent_id):
                    self.deferred.setdefault(subscription_id, position)
                    continue
                result = results[key] = self._run(run, program, subscriber, parameters, agent_id)
            passed, error = result
            if passed:
                keep[i] = True
            elif error is not None:
                self._count(subscription_id, position, error)

    def _parameters(
        self,
        program: _Program,
        agent_id: str,
        sealed: dict[str, dict[str, bool]],
        position: int,
    ) -> dict[str, Any] | None:
        """The allow lists ``program`` reads, as of ``position``; None if one it reads
        is empty and unsealed."""
        lists = self.state.allow_lists
        parameters = {}
        for name in program.parameters:
            values = sealed.get(name)
            if values is None:
                values = lists.as_of(agent_id, name, position)
                if not values:
                    return None
            parameters[name] = values
        return parameters

    def _sealed_lists(self, subscription: dict[str, Any]) -> dict[str, dict[str, bool]]:
        bindings = subscription.get("bindings")
        if not bindings:
            return {}
        sealed = self._sealed.get(subscription["id"])
        if sealed is None:
            # one map per distinct set of values: subscriptions bound alike share evaluations
            sealed = self._sealed[subscription["id"]] = {
                name: self._bound.setdefault(frozenset(values), dict.fromkeys(values, True))
                for name, values in bindings.items()
            }
        return sealed

    def _program(self, code: int) -> _Program | None:
        if code not in self._programs:
            try:
                self._programs[code] = compile_filter(
                    self.state.registry.filter_texts[code], stored=True
                )
            except InvalidFilter:
                self._programs[code] = None
        return self._programs[code]

    def _failed(self, match: Match, at: npt.NDArray[np.intp], error: str) -> None:
        ids = self.state.registry.ids
        for row in match.rows[at].tolist():
            self._count(ids[row], match.event.position, error)

    def _count(self, subscription_id: str, position: int, error: str) -> None:
        errors = self._errors.get(subscription_id)
        if errors is None:
            errors = self._errors[subscription_id] = _Errors()
        if position > errors.position:
            errors.count += 1
            errors.last_error = error[:ERROR_CHARS]
            errors.position = position

    def forget(self, subscription_id: str) -> None:
        """Drop what the stage keeps for a subscription that will not be read again."""
        self._errors.pop(subscription_id, None)
        self._sealed.pop(subscription_id, None)


#: A class's answers not known yet; an empty, unsealed allow list (no match).
UNKNOWN, NO_MATCH = -1, -2
#: Most cells of kept answers (class by event values) before they are all dropped.
ANSWER_CELLS = 1 << 21
#: Event values a probe can answer for (hashable, compared alike in Python and CEL).
_PROBED = (str, int, float, bool, type(None))
_MISSING = object()


def _at_path(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = values
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _answer(
    probe: Probe, value: Any, parameters: dict[str, Any] | None, subscriber: dict[str, Any]
) -> Any:
    """What a probe answers for one class: membership or equality, with the type of the
    subscriber's value (CEL compares values of different types otherwise than Python)."""
    if probe.target == "parameters":
        assert parameters is not None
        return value in parameters[probe.name]
    real = subscriber.get(probe.name, _MISSING)
    kind = type(real).__name__
    if probe.membership:
        if isinstance(real, list | dict):
            return (value in real, kind)
        return (None, kind)
    return (value == real, kind)


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# Contexts a filter is type-checked against: one per kind of entity, every field set.
_UNIT = {
    "id": "mu_1",
    "type": "finding",
    "content": "text",
    "confidence": {"score": 0.5, "reasoning": "why"},
    "intent": {"purpose": "why", "task_id": "task_1"},
    "source": {"agent_id": "a", "agent_role": "r", "session_id": "ses_1"},
    "relations": [{"type": "supports", "target_id": "mu_2"}],
    "status": "active",
    "epoch": 1,
    "timestamp": "2026-01-01T00:00:00Z",
    "visibility": "field",
    "payload": {},
}
_TASK: dict[str, Any] = {
    "id": "task_1",
    "title": "t",
    "description": "d",
    "status": "assigned",
    "assignee": "a",
    "created_by": "b",
    "depends_on": [],
    "result": None,
}
_EVENT = {
    "name": "memory.recorded",
    "epoch": 1,
    "cursor": "c",
    "actor": "a",
    "summary": "s",
    "entity": {"type": "memory_unit", "id": "mu_1"},
    "memory_unit_id": "mu_1",
    "conflict_id": None,
}
_SUBSCRIBER = {
    "id": "a",
    "role": "r",
    "interests": ["x"],
    "authority": 3,
    "current_task": "task_1",
}
_PARAMETERS = {name: {"v": True} for name in ALLOW_LIST_NAMES}
_SAMPLES = [
    {
        "event": {**_EVENT, **facts},
        "subscriber": _SUBSCRIBER,
        "parameters": _PARAMETERS,
    }
    for facts in (
        {"unit": _UNIT},
        {"task": _TASK, "handoff": {"id": "h", "task_id": "task_1", "from_agent_id": "a"}},
        {"conflict": {"id": "c", "unit_a": "mu_1", "unit_b": "mu_2", "status": "detected"}},
        {"agent": {"id": "a", "role": "r", "interests": [], "authority": 3}},
        {"session": {"id": "ses_1", "name": "n", "members": ["a"], "status": "active"}},
    )
]
