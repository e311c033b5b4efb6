"""CEL expressions: parsed, checked and costed before they are accepted, bounded as they run.

Subscriptions (``subscription.filter``) and inbound event sources (their filter over a
payload) say what they want with a Common Expression Language expression. This module
accepts one only if the Field can run it safely, and refuses it otherwise
(``422 INVALID_FILTER`` with the message and the position), all on the expression's tree
(:mod:`field.expressions.tree`), never on its text:

* its size (:data:`MAX_FILTER_CHARS`), its nesting (brackets and tree depth);
* the variables it reads (the context's, every other name bound by a comprehension),
  and comprehension variables that would shadow a context variable or another one;
* the functions it calls (:data:`FUNCTIONS`, :data:`METHODS`);
* at most :data:`MAX_COMPREHENSIONS` comprehensions, at most :data:`MAX_NESTED_COMPREHENSIONS`
  one inside another;
* ``matches`` patterns: string literals that RE2 compiles within a width;
* and a **static worst-case cost** (:mod:`field.expressions.costs`) of at most
  :data:`MAX_COST` steps, given the largest values the context can hold.

The interpreter (``common-expression-language``, the Rust ``cel`` interpreter with Python
bindings) compiles the tree printed back, with two changes: each ``matches`` call runs the
Field's cached RE2 search (:func:`_matches`), and each comprehension first charges its run
to the evaluation's :class:`Budget` (its range's size times its body's cost on an empty
item). So, whatever the estimate said, an evaluation that goes over :data:`MAX_COST` steps
of comprehension, or runs for more than :data:`MAX_EVALUATION_SECONDS`, stops at its next
comprehension and is "no match" with the reason. Evaluating never raises.

``matches``: the interpreter compiles a ``matches`` pattern on every call (a quarter of a
millisecond for ``\\w``), so a pattern must be a string literal; it is compiled once, with
RE2 (the engine and syntax the CEL specification names: linear in the text, whatever the
pattern), and refused if RE2 refuses it or it is wider than :data:`MAX_PATTERN_WIDTH`.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cel
import re2

from . import costs
from .costs import Shape
from .patterns import dfa_states
from .tree import (
    Call,
    Comprehension,
    Has,
    Ident,
    Index,
    InvalidFilter,
    ListLit,
    Literal,
    MapLit,
    Node,
    Select,
    emit,
    literal_text,
    parse,
    walk,
)

__all__ = ["InvalidFilter", "Expression", "Context", "compile_expression", "check_types"]

#: Longest expression, in characters.
MAX_FILTER_CHARS = 2048
#: Most comprehension macros in one expression.
MAX_COMPREHENSIONS = 4
#: Most comprehensions one inside another (2: one may hold another, which holds none).
MAX_NESTED_COMPREHENSIONS = 2
#: Most steps an evaluation may cost (:mod:`field.expressions.costs`): the estimate's limit, and
#: what the comprehensions of one evaluation may be charged as they run.
MAX_COST = 50_000
#: Longest an evaluation runs before its next comprehension stops it.
MAX_EVALUATION_SECONDS = 0.01
#: Longest ``matches`` pattern, in characters.
MAX_PATTERN_CHARS = 256
#: Widest ``matches`` pattern: the size of its program over single bytes, about the number
#: of characters it spans written out (``a[ab]{100}c`` is 106; ``\pL+`` is 12, a class
#: being one step). A search RE2's DFA cannot hold (a text made to keep every alternative
#: alive) costs about this many steps per character: 40 ms on 64 K characters at 128.
MAX_PATTERN_WIDTH = 128
#: Most memory RE2 may use for one pattern, its program and its DFA's states together.
MAX_PATTERN_MEMORY = 1 << 20
#: Most ``matches`` patterns in one expression (each is analysed when it is accepted).
MAX_PATTERNS = 8
#: A pattern whose DFA has at most this many states (:mod:`field.expressions.patterns`) is costed
#: as RE2's DFA reads; RE2's memory above holds about four times as many.
DFA_STATES = 64
#: Most items and characters of a JSON document's value (a unit's payload, an entity's
#: field the Field does not define, an inbound event) that one evaluation may read: what
#: it reads of a larger one fails it (no match, counted), as converting it for the
#: interpreter would cost more than its budget (about 1.3 us an item).
MAX_DOCUMENT_ITEMS = 1000
MAX_DOCUMENT_CHARS = 65536
DOCUMENT_READ = costs.document(MAX_DOCUMENT_CHARS, MAX_DOCUMENT_ITEMS)
#: Functions an expression may call, by name: how many arguments each takes.
FUNCTIONS: dict[str, int] = {
    "size": 1,
    "int": 1,
    "uint": 1,
    "double": 1,
    "string": 1,
    "dyn": 1,
    "type": 1,
    "duration": 1,
    "timestamp": 1,
    "matches": 2,
}
#: Methods (``target.name(...)``): how many arguments each takes besides its target.
METHODS: dict[str, int] = {
    "size": 0,
    "contains": 1,
    "startsWith": 1,
    "endsWith": 1,
    "matches": 1,
    **dict.fromkeys(
        (
            "getFullYear getMonth getDate getDayOfMonth getDayOfWeek getDayOfYear getHours "
            "getMinutes getSeconds getMilliseconds"
        ).split(),
        0,
    ),
}
#: What ``matches`` calls and comprehensions are compiled to call.
_MATCHES = "_field_matches"
_CHARGE = "_field_charge"
_METACHARACTER = re.compile(r"[\\.^$|?*+()\[\]{}]")
_RE2 = re2.Options()
_RE2.max_mem = MAX_PATTERN_MEMORY
_RE2.log_errors = False  # a refused pattern is the client's error, not the server's
_WIDTH = re2.Options()
_WIDTH.encoding = re2.Options.Encoding.LATIN1
_WIDTH.log_errors = False
#: The interpreter logs a warning when a function it calls raises; ours never do on
#: purpose (a budget that runs out answers null), and a stray one is counted, not logged.
logging.getLogger("cel").setLevel(logging.ERROR)

#: A path read from a variable: the names selected one after another from it.
Path = tuple[str, ...]


class Budget:
    """What one evaluation may spend: charged by each comprehension before it runs."""

    __slots__ = ("limit", "spent", "began", "exceeded")

    def __init__(self, limit: float = MAX_COST) -> None:
        self.limit = limit
        self.spent = 0.0
        self.began = 0.0
        self.exceeded: str | None = None

    def start(self) -> None:
        self.spent = 0.0
        self.began = time.perf_counter()
        self.exceeded = None

    def charge(self, items: Any, per_item: Any, per_kept: Any) -> bool | None:
        """True, or None once the budget is spent (the interpreter then fails the
        comprehension, which never runs)."""
        if self.exceeded is not None:
            return None
        self.spent += items * per_item + items * (items + 1) / 2 * per_kept
        if self.spent > self.limit:
            self.exceeded = (
                f"over the evaluation budget: comprehensions charged {self.spent:.0f} steps; "
                f"the limit is {self.limit:.0f}"
            )
        elif time.perf_counter() - self.began > MAX_EVALUATION_SECONDS:
            self.exceeded = (
                f"over the evaluation budget: ran longer than {MAX_EVALUATION_SECONDS * 1000:g} ms"
            )
        return None if self.exceeded is not None else True


class Context:
    """The variables one or more evaluations read, the Field's functions, and a budget."""

    __slots__ = ("cel", "budget")

    def __init__(self, variables: Mapping[str, Any] | None = None) -> None:
        self.budget = Budget()
        self.cel = cel.Context()
        self.cel.add_function(_MATCHES, _matches)
        self.cel.add_function(_CHARGE, self.budget.charge)
        for name, value in (variables or {}).items():
            self.cel.add_variable(name, value)

    def set_variable_resolver(self, resolver: Callable[[str], Any]) -> None:
        self.cel.set_variable_resolver(resolver)


@dataclass(frozen=True, slots=True)
class Binding:
    """A path an expression reads of a context variable (``event.unit.type``), given to
    the interpreter as a variable of its own: looked up at no cost where a selection
    would copy what it selects from, and converted once however often it is read."""

    #: the interpreter's variable
    name: str
    #: the context variable and the names selected from it (``has`` of one: ending "")
    variable: str
    path: Path
    #: the largest value it may hold (a document's is checked: :class:`TooLarge`)
    shape: Shape


@dataclass(frozen=True, slots=True)
class Expression:
    """A checked, compiled expression: what it reads and what it may cost."""

    text: str
    program: Any
    #: the context variables it reads (a subset of those allowed when compiled)
    variables: frozenset[str]
    tree: Node
    #: its worst-case cost, in steps
    cost: int
    #: per variable it reads: the paths it reads of it, or None when it reads it whole
    paths: Mapping[str, frozenset[Path] | None]
    #: the paths it reads, each given as a variable of its own
    bindings: tuple[Binding, ...]
    #: the variables it reads whole, with their largest values
    whole: Mapping[str, Shape]

    def bind(self, variable: str, value: Any) -> dict[str, Any]:
        """The interpreter's variables for what the expression reads of context variable
        ``variable`` holding ``value``: a path that does not exist (or a presence test
        on what is not a map) gives none, so that reading it fails as selecting it
        would. Raises :class:`TooLarge` for a document larger than it may read."""
        shape = self.whole.get(variable)
        if shape is not None:
            return {variable: _checked(value, shape, ())}
        variables = {}
        for binding in self.bindings:
            if binding.variable != variable:
                continue
            path = binding.path
            if path[-1] == "":
                parent = _walk(value, path[:-2])
                if isinstance(parent, dict):
                    variables[binding.name] = path[-2] in parent
                continue
            leaf = _walk(value, path)
            if leaf is not _ABSENT:
                variables[binding.name] = _checked(leaf, binding.shape, path)
        return variables

    def bind_all(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`bind` for each of ``values`` the expression reads."""
        variables: dict[str, Any] = {}
        for name, value in values.items():
            if name in self.variables:
                variables.update(self.bind(name, value))
        return variables

    def evaluate(self, context: Context | Mapping[str, Any]) -> bool | None:
        """True or False; None when the evaluation failed (a missing field, a wrong
        type, a result that is not a boolean, the budget spent): the caller counts that
        as no match. ``context``: a :class:`Context` the caller made with
        :meth:`bind_all`, or the context variables."""
        passed, error = self.outcome(context)
        return None if error is not None else passed

    def outcome(self, context: Context | Mapping[str, Any]) -> tuple[bool, str | None]:
        """``(passed, error)``: as :meth:`evaluate`, with why an evaluation failed
        (``(False, None)`` when it simply gave false)."""
        if not isinstance(context, Context):
            try:
                context = Context(self.bind_all(context))
            except TooLarge as error:
                return False, str(error)
        budget = context.budget
        budget.start()
        reason: str | None = None
        try:
            result = self.program.execute(context.cel)
        except KeyError as error:
            result, reason = None, f"no such key: {error}"
        except Exception as error:  # the library raises TypeError, RuntimeError, ValueError
            result, reason = None, self._reason(error)
        if budget.exceeded is not None:
            return False, budget.exceeded
        if reason is not None:
            return False, reason
        if isinstance(result, bool):
            return result, None
        return False, f"the expression gave a {type(result).__name__}, not a boolean"

    def _reason(self, error: Exception) -> str:
        """Why an evaluation failed, in the expression's terms: a path that is not there
        is named as written, never as the interpreter's variable."""
        message = str(error)
        found = _UNDEFINED.search(message)
        if found is not None:
            for binding in self.bindings:
                if binding.name == found[1]:
                    path = binding.path[:-1] if binding.path[-1] == "" else binding.path
                    return f"no such key: {'.'.join((binding.variable, *path))} is not there"
        return f"{type(error).__name__}: {message}"


_ABSENT = object()
_UNDEFINED = re.compile(r"Undefined variable or function: '(\w+)'")


def _walk(value: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def compile_expression(
    text: Any,
    allowed: Iterable[str],
    *,
    field: str,
    shapes: Mapping[str, Shape] | None = None,
    max_chars: int = MAX_FILTER_CHARS,
    max_cost: int = MAX_COST,
    stored: bool = False,
) -> Expression:
    """Check and compile ``text``, which may read only the variables ``allowed`` (their
    largest values: ``shapes``; a variable without one is taken as any JSON document of
    a request's size); raises :class:`InvalidFilter` naming ``field`` (the payload field
    it came from).

    ``stored``: the text comes from the log, written by a version of the Field that may
    have accepted ``matches`` patterns this one refuses: such a text runs ``matches`` as
    the interpreter does (compiling its pattern on each call) rather than being refused.
    """
    if not isinstance(text, str):
        raise InvalidFilter(f"{field} must be a string holding a CEL expression")
    if not text.strip():
        raise InvalidFilter(f"{field} is empty", details={"field": field})
    if len(text) > max_chars:
        raise InvalidFilter(
            f"{field} is {len(text)} characters long; the limit is {max_chars}",
            details={"field": field, "max_chars": max_chars},
        )
    allowed = frozenset(allowed)
    tree = parse(text, field)
    names = _check_names(tree, allowed, field)
    searches = _check_calls(tree, field, stored=stored)
    _check_comprehensions(tree, field)
    _check_result(tree, field)
    paths = {name: reads(tree, name) for name in names}
    given = {name: (shapes or {}).get(name) or _ANY for name in sorted(names)}
    whole = {name: readable(given[name]) for name in given if paths[name] is None}
    bindings, nodes = _bindings(tree, given, paths)
    base = sum(costs.converting(shape) for shape in whole.values())
    base += sum(costs.converting(binding.shape) for binding in bindings)
    leaves = {key: bindings[index].shape for key, index in nodes.items()}
    estimate = costs.estimate(tree, whole, leaves=leaves, searches=searches, base=base)
    if estimate.cost > max_cost:
        raise InvalidFilter(
            f"{field} may cost up to {estimate.cost} steps an evaluation (its comprehensions "
            f"times the largest values they can be given); the limit is {max_cost}",
            details={"field": field, "estimated_cost": estimate.cost, "max_cost": max_cost},
        )
    names_of = {key: bindings[index].name for key, index in nodes.items()}
    program_text = emit(tree, _Rewriter(estimate.charges, searches), names_of)
    try:
        program = cel.compile(program_text)
    except Exception as error:  # ValueError with the parser's report
        raise InvalidFilter(
            f"{field} is not supported by the Field's interpreter: {str(error)[:200]}",
            details={"field": field},
        ) from None
    return Expression(
        text, program, frozenset(names), tree, estimate.cost, paths, tuple(bindings), whole
    )


#: What a variable without a shape can hold: any JSON document as large as a request.
_ANY = costs.document(1 << 20, 10_000)
#: The names the Field gives the interpreter (its functions, the paths' variables).
RESERVED_PREFIX = "_field"


def _bindings(
    tree: Node, shapes: Mapping[str, Shape], paths: Mapping[str, frozenset[Path] | None]
) -> tuple[list[Binding], dict[int, int]]:
    """A :class:`Binding` per distinct path read, and the index of each path node's."""
    bindings: list[Binding] = []
    index: dict[tuple[str, Path], int] = {}
    nodes: dict[int, int] = {}
    by_path = [name for name, read in paths.items() if read is not None]

    def visit(node: Node) -> None:
        for variable in by_path:
            path = path_of(node, variable)
            if path is None:
                continue
            key = (variable, path)
            if key not in index:
                index[key] = len(bindings)
                name = f"{RESERVED_PREFIX}_{variable}_{len(bindings)}"
                bindings.append(Binding(name, variable, path, _leaf(shapes[variable], path)))
            nodes[id(node)] = index[key]
            return
        for child in node.children():
            visit(child)

    visit(tree)
    return bindings, nodes


def _leaf(shape: Shape, path: Path) -> Shape:
    """The largest value a path reads of a value of ``shape``."""
    if path[-1] == "":
        return costs.BOOL
    for key in path:
        shape = shape.select(key)
    return readable(shape)


class _Rewriter:
    """Prints comprehensions charging the budget first, ``matches`` on the cached RE2."""

    def __init__(
        self, charges: Mapping[int, costs.Charge], searches: Mapping[int, costs.Search]
    ) -> None:
        self.charges = charges
        self.searches = searches

    def __call__(self, node: Node, first: str, second: str) -> str | None:
        if isinstance(node, Call):  # matches(first, second)
            if id(node) not in self.searches:
                return None  # a stored pattern this version refuses: the interpreter's own
            return f"{_MATCHES}({first}, {second})"
        assert isinstance(node, Comprehension)
        charge = self.charges[id(node)]
        per_item = literal_text(float(charge.per_item), "double")
        per_kept = literal_text(float(charge.per_kept), "double")
        empty = "[]" if node.macro in ("map", "filter") else "false"
        return f"({_CHARGE}(size({first}), {per_item}, {per_kept}) ? {second} : {empty})"


def _check_names(tree: Node, allowed: frozenset[str], field: str) -> set[str]:
    """The context variables ``tree`` reads; refuses unknown names and comprehension
    variables that shadow a context variable or an enclosing comprehension's."""
    free: set[str] = set()

    def visit(node: Node, bound: frozenset[str]) -> None:
        if isinstance(node, Ident):
            if node.name not in bound:
                free.add(node.name)
            return
        if isinstance(node, Comprehension):
            visit(node.range, bound)
            variable = node.variable
            if variable in allowed or variable in bound or variable.startswith(RESERVED_PREFIX):
                what = "a context variable" if variable in allowed else "another name"
                if variable.startswith(RESERVED_PREFIX):
                    what = f"the Field's own names (those starting {RESERVED_PREFIX})"
                raise InvalidFilter(
                    f"{field}: the comprehension variable {variable!r} (offset {node.offset}) "
                    f"would hide {what}; choose another name",
                    details={"field": field, "offset": node.offset, "variable": variable},
                )
            for part in node.body:
                visit(part, bound | {variable})
            return
        for child in node.children():
            visit(child, bound)

    visit(tree, frozenset())
    unknown = sorted(free - allowed)
    if unknown:
        raise InvalidFilter(
            f"{field} reads unknown variable(s) {', '.join(unknown)}; "
            f"it may read {', '.join(sorted(allowed))}",
            details={"field": field, "unknown_variables": unknown, "variables": sorted(allowed)},
        )
    return free


def _check_calls(tree: Node, field: str, *, stored: bool) -> dict[int, costs.Search]:
    """Refuse unknown functions and unchecked ``matches`` patterns; how each checked
    pattern searches, by its call's node identity."""
    searches: dict[int, costs.Search] = {}
    patterns: set[str] = set()
    for node in walk(tree):
        if not isinstance(node, Call):
            continue
        table = FUNCTIONS if node.target is None else METHODS
        arity = table.get(node.name)
        if arity is None:
            kind = "function" if node.target is None else "method"
            raise InvalidFilter(
                f"{field} calls an unknown {kind} {node.name} (offset {node.offset}); the "
                "functions a filter may call are listed in protocol/README.md, 'Filters'",
                details={"field": field, "offset": node.offset, "function": node.name},
            )
        if len(node.args) != arity:
            takes = "a string and a pattern" if node.name == "matches" else f"{arity} argument(s)"
            raise InvalidFilter(
                f"{field}: {node.name} takes {takes} (offset {node.offset})",
                details={"field": field, "offset": node.offset},
            )
        if node.name == "matches":
            pattern = node.args[-1]
            try:
                searches[id(node)] = _pattern(pattern, field)
                patterns.add(pattern.value if isinstance(pattern, Literal) else "")
                if len(patterns) > MAX_PATTERNS:
                    raise InvalidFilter(
                        f"{field} has more than {MAX_PATTERNS} matches patterns (offset "
                        f"{node.offset})",
                        details={"field": field, "offset": node.offset},
                    )
            except InvalidFilter:
                if not stored:
                    raise
    return searches


def _check_comprehensions(tree: Node, field: str) -> None:
    count = 0

    def visit(node: Node, depth: int) -> None:
        nonlocal count
        if isinstance(node, Comprehension):
            count += 1
            depth += 1
            if count > MAX_COMPREHENSIONS:
                raise InvalidFilter(
                    f"{field} has more than {MAX_COMPREHENSIONS} comprehensions "
                    f"(all, exists, exists_one, map, filter; offset {node.offset})",
                    details={"field": field, "offset": node.offset},
                )
            if depth > MAX_NESTED_COMPREHENSIONS:
                raise InvalidFilter(
                    f"{field} nests comprehensions more than {MAX_NESTED_COMPREHENSIONS} deep "
                    f"({node.macro} at offset {node.offset})",
                    details={"field": field, "offset": node.offset},
                )
        for child in node.children():
            visit(child, depth)

    visit(tree, 0)


def _check_result(tree: Node, field: str) -> None:
    """Refuse an expression whose result cannot be a boolean, whatever it reads."""
    what = None
    if isinstance(tree, Literal) and tree.kind != "bool":
        what = f"a {tree.kind} literal"
    elif isinstance(tree, ListLit) or (
        isinstance(tree, Comprehension) and tree.macro in ("map", "filter")
    ):
        what = "a list"
    elif isinstance(tree, MapLit):
        what = "a map"
    if what is not None:
        raise InvalidFilter(
            f"{field} gives {what}; a filter is a condition, true or false",
            details={"field": field},
        )


def _pattern(node: Node, field: str) -> costs.Search:
    """How a ``matches`` pattern searches (:class:`~field.expressions.costs.Search`); refuses one
    that is not a string literal RE2 runs cheaply."""
    offset = node.offset
    details = {"field": field, "offset": offset}
    if not (isinstance(node, Literal) and node.kind == "string"):
        raise InvalidFilter(
            f"{field}: the pattern of matches must be a string literal (offset {offset}), "
            "so that the Field compiles it once",
            details=details,
        )
    value = node.value
    if len(value) > MAX_PATTERN_CHARS:
        raise InvalidFilter(
            f"{field}: a matches pattern is {len(value)} characters long (offset {offset}); "
            f"the limit is {MAX_PATTERN_CHARS}",
            details=details | {"max_chars": MAX_PATTERN_CHARS},
        )
    try:
        size = re2.compile(value, _RE2).programsize
    except re2.error as error:
        reason = error.args[0] if error.args else "refused"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidFilter(
            f"{field}: the matches pattern at offset {offset} does not compile: {reason}",
            details=details,
        ) from None
    try:
        width = re2.compile(value.encode(), _WIDTH).programsize
    except re2.error:  # a code point beyond Latin-1 (``\x{263a}``): its program as it runs
        width = size
    if width > MAX_PATTERN_WIDTH:
        raise InvalidFilter(
            f"{field}: the matches pattern at offset {offset} is {width} wide; the limit is "
            f"{MAX_PATTERN_WIDTH} (a counted repetition such as {{100}} copies what it "
            "repeats)",
            details=details | {"width": width, "max_width": MAX_PATTERN_WIDTH},
        )
    if _METACHARACTER.search(value) is None:  # a plain substring (``_compiled``)
        return costs.Search(int(width), substring=True)
    states = dfa_states(value, DFA_STATES)
    return costs.Search(int(width), dfa=states is not None and states <= DFA_STATES)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Callable[[str], bool]:
    """Whether ``pattern`` is found in a text: ``in`` for a pattern without metacharacters
    (no faster search than Python's own), else the compiled RE2 search."""
    if _METACHARACTER.search(pattern) is None:
        return lambda text: pattern in text
    search = re2.compile(pattern, _RE2).search
    return lambda text: search(text) is not None


def _matches(text: Any, pattern: Any) -> bool | None:
    """CEL's ``matches``: whether ``pattern`` (RE2) matches anywhere in ``text`` (None, an
    evaluation error, when either is not a string)."""
    if not isinstance(text, str) or not isinstance(pattern, str):
        return None
    return _compiled(pattern)(text)


# -- what an expression reads ----------------------------------------------------------


def reads(tree: Node, variable: str) -> frozenset[Path] | None:
    """The paths ``tree`` reads of ``variable`` (``event.unit.type`` is ``("unit",
    "type")``; ``has(event.task)`` tests ``("task",)`` for presence only, written
    ``("task", "")``), or None when it reads the variable otherwise than by paths (then
    it needs all of it). Comprehension variables never shadow a context variable (they
    are refused), so every ``Ident`` of that name is the variable."""
    paths: set[Path] = set()

    def visit(node: Node) -> bool:  # False: a use that is not a path
        path = path_of(node, variable)
        if path is not None:
            paths.add(path)
            return True
        if isinstance(node, Ident):
            return node.name != variable
        return all(visit(child) for child in node.children())

    return frozenset(paths) if visit(tree) else None


def path_of(node: Node, variable: str) -> Path | None:
    """The path ``node`` reads of ``variable`` when it is a chain of selections from it
    (``.name``, ``["name"]``) or ``has`` of one."""
    names: list[str] = []
    current = node
    if isinstance(current, Has):
        names += ["", current.name]
        current = current.operand
    while True:
        if isinstance(current, Select):
            names.append(current.name)
            current = current.operand
        elif (
            isinstance(current, Index)
            and isinstance(current.index, Literal)
            and current.index.kind == "string"
        ):
            names.append(current.index.value)
            current = current.operand
        else:
            break
    if isinstance(current, Ident) and current.name == variable and names:
        return tuple(reversed(names))
    return None


class TooLarge(ValueError):
    """What an evaluation would read of a document is larger than it may read."""


def _checked(value: Any, shape: Shape, path: Path) -> Any:
    """``value``, once its documents are found within bounds (:class:`TooLarge`)."""
    if shape.kind == "doc":
        if not _within(value, MAX_DOCUMENT_ITEMS, MAX_DOCUMENT_CHARS):
            where = ".".join(path) or "it"
            raise TooLarge(
                f"{where} holds more than {MAX_DOCUMENT_ITEMS} items or "
                f"{MAX_DOCUMENT_CHARS} characters, more than a filter may read"
            )
    elif shape.kind == "record" and isinstance(value, dict):
        for key, item in value.items():
            _checked(item, shape.select(key), (*path, key))
    elif shape.kind == "list" and shape.item is not None and isinstance(value, list):
        for item in value:
            _checked(item, shape.item, path)
    return value


def _within(value: Any, items: int, chars: int) -> bool:
    """Whether ``value`` holds at most ``items`` items and ``chars`` characters (a walk
    that stops as soon as either is passed)."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            chars -= len(current)
        elif isinstance(current, dict):
            items -= len(current)
            chars -= sum(len(key) for key in current)
            stack.extend(current.values())
        elif isinstance(current, list):
            items -= len(current)
            stack.extend(current)
        if items < 0 or chars < 0:
            return False
    return True


def readable(shape: Shape) -> Shape:
    """``shape`` with every document in it no larger than an evaluation may read."""
    if shape.kind == "doc":
        if shape.total <= DOCUMENT_READ.total and shape.count <= DOCUMENT_READ.count:
            return shape
        return DOCUMENT_READ
    if shape.kind == "record":
        fields = {name: readable(field) for name, field in shape.fields.items()}
        return costs.record(fields, rest=None if shape.rest is None else readable(shape.rest))
    if shape.kind == "list" and shape.item is not None:
        return costs.list_of(readable(shape.item), shape.items)
    return shape


# -- checking against samples ----------------------------------------------------------


def check_types(expression: Expression, samples: Iterable[Mapping[str, Any]], field: str) -> None:
    """Refuse an expression that fails with a type error on every sample context (say
    ``event.epoch + "x"``: a type error that no value can avoid), or that gives something
    other than a boolean on every sample. Missing fields are no error here: a sample need
    not hold every field a real event may."""
    reasons = []
    for sample in samples:
        context = Context(expression.bind_all(sample))
        context.budget.start()
        try:
            result = expression.program.execute(context.cel)
        except TypeError as error:
            reasons.append(str(error).split(". ")[0])
            continue
        except Exception:  # noqa: S112 - a missing field or key: fine on some event
            return
        if isinstance(result, bool):
            return
        reasons.append(f"it gives a {type(result).__name__}, not a boolean")
    if reasons:
        raise InvalidFilter(
            f"{field} has a type error: {reasons[0]}",
            details={"field": field},
        )
