"""The worst-case cost of an expression, known before it is accepted.

In the manner of cel-go's cost estimator (which Kubernetes runs on every CRD validation
rule), every node of the tree (:mod:`field.expressions.tree`) is given a cost in **steps**
and a :class:`Shape`, the largest value it can produce: a comprehension multiplies its
body's cost by the most items its range can hold, a string operation costs by the longest
strings it can be given, ``+`` builds a string or list as long as both of its operands.
What the Field gives an expression is bounded (units by the RECORD limits, JSON documents
by their size and item count, allow lists by their cap), so every shape is finite and so is
every estimate.

The costs follow what the interpreter does (``benchmarks/filters_hostile.py`` measures
them): selecting a string or a list copies it, binding a comprehension's variable copies
the item, ``map`` and ``filter`` copy what they built so far at every item (quadratic in
the range), and each evaluation copies its variables in. A step is at most about 50 ns of
this machine's time; the figures are in ``benchmarks/README.md``.

**Sums over a document.** A comprehension over a list of a JSON document runs its body on
items whose sizes add up to the document's size, not to the count times the largest item:
when the body's cost is linear in its item's size (checked at two sizes), its cost is the
count times the body's cost on an empty item, plus its cost on the largest item once per
bound (characters, items) the document has. Otherwise, the count times the largest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .tree import (
    Call,
    Comprehension,
    Has,
    Ident,
    Index,
    ListLit,
    Literal,
    MapLit,
    Node,
    Operator,
    Select,
)

#: Every operator, call, selection and literal.
STEP = 1.0
#: Per character copied or compared (a string, or a value's whole size).
COPY = 1 / 1024
#: Per character searched for a substring (``contains``, ``startsWith``, ``endsWith``).
SCAN = 1 / 256
#: Per character of a string or list that ``+`` builds (allocated and copied).
BUILD = 1 / 32
#: Per item of a list or map copied (selected from another: 0.1 to 0.2 us; bound to a
#: comprehension's variable).
ITEM = 2.0
#: Per item of a variable's value converted for the interpreter, at each evaluation that
#: reads it (about 1.3 us an item of a map, 0.8 us a string, 0.06 us a number).
CONVERT = 22.0
#: Per item a ``map`` or ``filter`` copies again at every later item.
KEPT = 1.5
#: Per iteration of a comprehension, besides its body.
ITERATION = 4.0
#: Per timestamp or duration parsed, besides its characters.
TIME_PARSE = 20.0
#: Per character searched by ``matches``, times (1 + the pattern's width): RE2's DFA
#: searches a character in about a nanosecond, but a pattern whose DFA outgrows its memory
#: (``a[ab]{20}c``) on a text made for it falls back to simulating its program, about
#: 11 ns a character per unit of width.
MATCH = 1 / 4
#: Per ``matches`` call (the interpreter calls the Field's cached RE2 search).
MATCH_CALL = 40.0
#: Per character searched by a pattern whose DFA is small, whatever the text
#: (:mod:`field.expressions.patterns`): about 2 ns a character, 22 ns at worst on 1,040 random
#: patterns and texts (what finding the match's bounds adds).
DFA = 1 / 3
#: Per character a conversion (``int``, ``double``, ``timestamp``, ``string``) reads.
PARSE = 1 / 64


@dataclass(frozen=True, slots=True)
class Shape:
    """The largest value an expression can produce.

    ``kind``: "bool", "int", "uint", "double", "null", "string", "list", "map", "record"
    (a map whose fields are known), "time" (a timestamp or duration) or "doc" (any JSON
    value: a string, number, list or map). Sizes are floats (a scaled shape holds parts).
    """

    kind: str
    #: longest string (string, doc)
    chars: float = 0.0
    #: most items (list, map, doc)
    items: float = 0.0
    #: most characters in all of the value, strings and keys together
    total: float = 0.0
    #: most items in all of the value, nested ones included
    count: float = 0.0
    #: each item (list) or value (map)
    item: Shape | None = None
    #: each key (map)
    key: Shape | None = None
    #: a record's fields
    fields: Mapping[str, Shape] = field(default_factory=dict)
    #: a record's other fields, if it may have any
    rest: Shape | None = None

    def element(self) -> Shape:
        """What a comprehension over this value binds: an item of a list, a key of a map."""
        if self.kind == "doc":
            return _doc(self.total, self.count)
        if self.kind == "list" and self.item is not None:
            return self.item
        if self.kind == "map" and self.key is not None:
            return self.key
        if self.kind == "record":
            longest = max((len(name) for name in self.fields), default=0)
            return string(longest)
        return NOTHING

    def value(self) -> Shape:
        """What ``[i]`` reads: an item of a list or a value of a map."""
        if self.kind == "doc":
            return _doc(self.total, self.count)
        if self.kind in ("list", "map") and self.item is not None:
            return self.item
        if self.kind == "record":
            values = [*self.fields.values(), *([self.rest] if self.rest else [])]
            return union(*values) if values else NOTHING
        return NOTHING

    def select(self, name: str) -> Shape:
        if self.kind == "record":
            return self.fields.get(name, self.rest or NOTHING)
        if self.kind in ("doc", "map"):
            return self.value()
        return NOTHING

    def scaled(self, factor: float) -> Shape:
        """This shape with every size times ``factor`` (at most 1): a smaller item."""
        if factor >= 1:
            return self
        return replace(
            self,
            chars=self.chars * factor,
            items=self.items * factor,
            total=self.total * factor,
            count=self.count * factor,
            item=None if self.item is None else self.item.scaled(factor),
            key=None if self.key is None else self.key.scaled(factor),
            fields={name: shape.scaled(factor) for name, shape in self.fields.items()},
            rest=None if self.rest is None else self.rest.scaled(factor),
        )


NOTHING = Shape("null")
BOOL = Shape("bool", total=1)
INT = Shape("int", total=1)
DOUBLE = Shape("double", total=1)
TIME = Shape("time", total=1)


def string(chars: float) -> Shape:
    return Shape("string", chars=chars, total=chars)


def list_of(item: Shape, items: float) -> Shape:
    return Shape(
        "list",
        items=items,
        total=items * item.total,
        count=items * (1 + item.count),
        item=item,
    )


def map_of(key: Shape, value: Shape, items: float) -> Shape:
    return Shape(
        "map",
        items=items,
        total=items * (key.total + value.total),
        count=items * (1 + value.count),
        item=value,
        key=key,
    )


def record(fields: Mapping[str, Shape], *, rest: Shape | None = None) -> Shape:
    """A map whose fields are known (and, with ``rest``, others as large as it)."""
    total = sum(len(name) + shape.total for name, shape in fields.items())
    count = sum(1 + shape.count for shape in fields.values())
    if rest is not None:
        total, count = max(total, rest.total), max(count, rest.count)
    return Shape(
        "record",
        items=len(fields) + (rest.items if rest is not None else 0),
        total=total,
        count=count,
        fields=dict(fields),
        rest=rest,
    )


def document(total: float, items: float) -> Shape:
    """Any JSON value of at most ``total`` characters and ``items`` items in all."""
    return _doc(total, items)


def _doc(total: float, count: float) -> Shape:
    # an item takes at least two characters ("1,")
    items = min(count, total / 2)
    return Shape("doc", chars=total, items=items, total=total, count=items)


def union(*shapes: Shape) -> Shape:
    """A shape as large as any of ``shapes``."""
    if not shapes:
        return NOTHING
    kinds = {shape.kind for shape in shapes}
    first = shapes[0]
    largest = Shape(
        "doc",  # mixed kinds: any of them
        chars=max(shape.chars for shape in shapes),
        items=max(shape.items for shape in shapes),
        total=max(shape.total for shape in shapes),
        count=max(shape.count for shape in shapes),
    )
    if len(kinds) == 1 and first.kind not in ("list", "map", "record"):
        return replace(largest, kind=first.kind)
    if kinds <= {"list"}:
        items = [s.item for s in shapes if s.item is not None]
        return replace(largest, kind="list", item=union(*items))
    return largest


def copying(shape: Shape) -> float:
    """What copying a value of ``shape`` costs."""
    return shape.total * COPY + shape.count * ITEM


def converting(shape: Shape) -> float:
    """What converting a value of ``shape`` for the interpreter costs."""
    return shape.total * COPY + shape.count * CONVERT


@dataclass(frozen=True, slots=True)
class Search:
    """How a checked ``matches`` pattern searches a text: as a plain substring, with RE2's
    DFA alone (a DFA shown small, :mod:`field.expressions.patterns`), or at worst by simulating
    its program, about ``width`` steps a character."""

    width: int
    substring: bool = False
    dfa: bool = False


#: A ``matches`` whose pattern was not checked (a stored filter's): the widest.
UNCHECKED = Search(256)


@dataclass(frozen=True, slots=True)
class Charge:
    """What a comprehension is charged at run time before it runs: ``per_item`` for each
    item of its range, and ``per_kept`` for each item times the items before it (``map``
    and ``filter`` copy what they built so far)."""

    per_item: float
    per_kept: float


@dataclass(slots=True)
class Estimate:
    """An expression's worst-case cost, and what each comprehension is charged as it runs
    (by the comprehension's node identity)."""

    cost: int
    charges: dict[int, Charge]


def estimate(
    node: Node,
    variables: Mapping[str, Shape],
    *,
    leaves: Mapping[int, Shape] | None = None,
    searches: Mapping[int, Search] | None = None,
    base: float = 0.0,
) -> Estimate:
    """The worst-case cost of ``node``: ``variables`` are the shapes of the names it reads
    whole, ``leaves`` those of the nodes the Field gives as variables of their own (by
    node identity: a path read of a context variable), ``searches`` how each checked
    ``matches`` pattern searches (by the call's node identity), ``base`` what an
    evaluation costs before it runs (its variables converted)."""
    estimator = _Estimator(searches or {}, leaves or {})
    cost, _ = estimator.cost(node, dict(variables))
    return Estimate(math.ceil(STEP + base + cost), estimator.charges)


class _Estimator:
    def __init__(self, searches: Mapping[int, Search], leaves: Mapping[int, Shape]) -> None:
        self.searches = searches
        self.leaves = leaves
        self.charges: dict[int, Charge] = {}

    def cost(self, node: Node, scope: dict[str, Shape]) -> tuple[float, Shape]:
        leaf = self.leaves.get(id(node))
        if leaf is not None:  # a variable of its own: looked up, never copied
            return STEP, leaf
        if isinstance(node, Literal):
            if node.kind == "string":
                return STEP, string(len(node.value))
            return STEP, {"bool": BOOL, "double": DOUBLE, "null": NOTHING}.get(node.kind, INT)
        if isinstance(node, Ident):
            return STEP, scope.get(node.name, NOTHING)
        if isinstance(node, Select):
            cost, shape = self.cost(node.operand, scope)
            selected = shape.select(node.name)
            return cost + STEP + copying(selected), selected
        if isinstance(node, Has):
            cost, _ = self.cost(node.operand, scope)
            return cost + STEP, BOOL
        if isinstance(node, Index):
            operand, shape = self.cost(node.operand, scope)
            index, key = self.cost(node.index, scope)
            value = shape.value()
            return operand + index + STEP + key.total * COPY + copying(value), value
        if isinstance(node, ListLit):
            parts = [self.cost(item, scope) for item in node.items]
            item = union(*(shape for _, shape in parts))
            cost = sum(c for c, _ in parts) + STEP + len(parts) * ITEM
            return cost, list_of(item, len(parts))
        if isinstance(node, MapLit):
            keys = [self.cost(key, scope) for key, _ in node.entries]
            values = [self.cost(value, scope) for _, value in node.entries]
            cost = sum(c for c, _ in keys + values) + STEP + len(keys) * ITEM
            shape = map_of(union(*(s for _, s in keys)), union(*(s for _, s in values)), len(keys))
            return cost, shape
        if isinstance(node, Operator):
            return self.operator(node, scope)
        if isinstance(node, Call):
            return self.call(node, scope)
        assert isinstance(node, Comprehension)
        return self.comprehension(node, scope)

    def operator(self, node: Operator, scope: dict[str, Shape]) -> tuple[float, Shape]:
        parts = [self.cost(arg, scope) for arg in node.args]
        costs = [c for c, _ in parts]
        shapes = [s for _, s in parts]
        op = node.op
        if op == "?:":
            return costs[0] + max(costs[1], costs[2]) + STEP, union(shapes[1], shapes[2])
        if op in ("!", "neg", "&&", "||", "-", "*", "/", "%"):
            return sum(costs) + STEP, BOOL if op in ("!", "&&", "||") else DOUBLE
        left, right = shapes
        if op == "+":
            built = _concatenation(left, right)
            cost = STEP + (left.total + right.total) * BUILD + built.count * ITEM
            return sum(costs) + cost, built
        if op == "in":
            return sum(costs) + STEP + _membership(left, right), BOOL
        # == != < <= > >=: as costly as copying the smaller side
        smaller = min(copying(left), copying(right))
        return sum(costs) + STEP + smaller, BOOL

    def call(self, node: Call, scope: dict[str, Shape]) -> tuple[float, Shape]:
        parts = [self.cost(arg, scope) for arg in node.children()]
        cost = sum(c for c, _ in parts) + STEP
        shapes = [s for _, s in parts]
        name = node.name
        subject = shapes[0] if shapes else NOTHING
        if name == "size":  # of a string: its code points, counted
            return cost + subject.chars * SCAN, INT
        if name in ("contains", "endsWith"):
            return cost + (subject.chars + shapes[-1].chars) * SCAN, BOOL
        if name == "startsWith":
            return cost + shapes[-1].chars * SCAN, BOOL
        if name == "matches":
            search = self.searches.get(id(node), UNCHECKED)
            if search.substring:
                per_char = SCAN
            elif search.dfa:
                per_char = DFA
            else:
                per_char = (1 + search.width) * MATCH
            return cost + MATCH_CALL + subject.chars * per_char, BOOL
        if name == "string":
            made = string(max(subject.chars, 32.0))
            return cost + subject.total * PARSE + copying(made), made
        if name in ("int", "uint", "double"):
            result = DOUBLE if name == "double" else INT
            return cost + subject.chars * PARSE, result
        if name in ("timestamp", "duration"):
            return cost + TIME_PARSE + subject.chars * PARSE, TIME
        if name == "dyn":
            return cost, subject
        if name == "type":
            return cost, string(16)
        return cost, INT  # a timestamp's or duration's getter

    def comprehension(self, node: Comprehension, scope: dict[str, Shape]) -> tuple[float, Shape]:
        range_cost, span = self.cost(node.range, scope)
        item = span.element()
        items = span.items

        def body(shape: Shape) -> tuple[float, Shape]:
            inner = {**scope, node.variable: shape}
            parts = [self.cost(part, inner) for part in node.body]
            return sum(c for c, _ in parts) + copying(shape), parts[-1][1]

        empty, _ = body(item.scaled(0))
        full, made = body(item)
        half, _ = body(item.scaled(0.5))
        self.charges[id(node)] = Charge(
            per_item=empty + ITERATION,
            per_kept=KEPT if node.macro in ("map", "filter") else 0.0,
        )
        total = items * (full + ITERATION)
        linear = full - empty <= 2 * (half - empty) * (1 + 1e-9) + 1e-9
        if span.kind == "doc" and linear:
            # items' sizes add up to the document's: each bound (characters, items) once
            shares = _share(span.total, item.total) + _share(span.count, item.count)
            total = min(total, items * (empty + ITERATION) + (full - empty) * shares)
        kept = 0.0
        result: Shape = BOOL
        if node.macro in ("map", "filter"):
            built = made if node.macro == "map" else item
            # each item copies what was built before it
            copied = items * min(items * built.total, span.total)
            kept = items * (items + 1) / 2 * KEPT + copied * COPY
            result = list_of(built, items)
        # the range is evaluated twice: once for its size (the run-time charge), once to run
        return 2 * range_cost + STEP + total + kept, result


def _share(whole: float, part: float) -> float:
    return whole / part if part > 0 else 0.0


def _concatenation(left: Shape, right: Shape) -> Shape:
    if left.kind == "string" and right.kind == "string":
        return string(left.chars + right.chars)
    if left.kind in ("int", "uint", "double", "time") and right.kind == left.kind:
        return left
    return Shape(
        "list" if left.kind == right.kind == "list" else "doc",
        chars=left.chars + right.chars,
        items=left.items + right.items,
        total=left.total + right.total,
        count=left.count + right.count,
        item=union(*(s.item for s in (left, right) if s.item is not None))
        if left.kind == right.kind == "list"
        else None,
    )


def _membership(needle: Shape, haystack: Shape) -> float:
    """``needle in haystack``: a look-up in a map, a comparison with every item of a list
    (each as costly as copying the smaller of the two, and all of them together no more
    than copying the list)."""
    lookup = needle.total * COPY + STEP
    if haystack.kind in ("map", "record"):
        return lookup
    compare = haystack.items * (STEP + ITEM) + min(
        haystack.items * copying(needle), copying(haystack)
    )
    return max(lookup, compare)
