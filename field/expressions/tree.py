"""CEL expressions as trees: parsed here, checked and costed on the tree, printed back.

The Field runs filters with the ``common-expression-language`` interpreter, which exposes
no syntax tree (only the names an expression references). Checking an expression's text
with patterns is what let comments and string quotes hide comprehensions from the check,
so every check runs on a tree, and the text the interpreter compiles is the tree printed
back (:func:`emit`): what was checked is what runs, whatever either parser makes of an odd
input. The parser is this module's: cel-python's grammar (the other CEL library for Python)
backtracks exponentially on an unterminated string of escaped quotes (4 minutes for 30
characters), which an outside party could send.

The language is CEL as its specification defines it (``langdef.md``), less what filters
over JSON documents never need: bytes literals, message construction (``a.B{f: 1}``) and
leading-dot names. Parsing is linear in the text: one pass of the lexer, a recursive
descent whose depth is bounded (:data:`MAX_NESTING` brackets, :data:`MAX_DEPTH` levels of
the tree), and no backtracking.

Nodes are frozen dataclasses; each keeps ``offset``, the index in the text where it starts
(error details name it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..contract.errors import Code, InvalidPayload

#: Deepest nesting of brackets, calls, lists, maps and conditionals in one expression.
MAX_NESTING = 32
#: Deepest tree (an operand of an operand of ... ): ``a || b || ... `` of 128 terms is 128.
MAX_DEPTH = 128
#: The comprehension macros and how many arguments each takes after its variable.
MACROS: dict[str, tuple[int, ...]] = {
    "all": (1,),
    "exists": (1,),
    "exists_one": (1,),
    "filter": (1,),
    "map": (1, 2),
}
RESERVED = frozenset(
    "as break const continue else for function if import let loop package namespace "
    "return var void while in true false null".split()
)
_INT64 = 1 << 63
_N = TypeVar("_N", bound="Node")
_UINT64 = 1 << 64


class InvalidFilter(InvalidPayload):
    """An expression the Field will not run: syntax, unknown names, size, shape, cost."""

    code = Code.INVALID_FILTER
    suggested_action = (
        "Fix the expression (see the position and message); the variables it may use are "
        "listed in protocol/README.md, 'Filters'."
    )


# -- the tree --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    offset: int = field(compare=False)
    depth: int = field(compare=False)

    def children(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Literal(Node):
    value: Any
    #: "int", "uint", "double", "string", "bool" or "null"
    kind: str


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Select(Node):
    operand: Node
    name: str

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Has(Node):
    """``has(operand.name)``."""

    operand: Node
    name: str

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node

    def children(self) -> tuple[Node, ...]:
        return (self.operand, self.index)


@dataclass(frozen=True, slots=True)
class Operator(Node):
    """``!`` and ``-`` (one operand), ``?:`` (three), every binary operator (two)."""

    op: str
    args: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.args


@dataclass(frozen=True, slots=True)
class Call(Node):
    """``name(args)``, or ``target.name(args)``."""

    name: str
    target: Node | None
    args: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.args if self.target is None else (self.target, *self.args)


@dataclass(frozen=True, slots=True)
class ListLit(Node):
    items: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.items


@dataclass(frozen=True, slots=True)
class MapLit(Node):
    entries: tuple[tuple[Node, Node], ...]

    def children(self) -> tuple[Node, ...]:
        return tuple(node for entry in self.entries for node in entry)


@dataclass(frozen=True, slots=True)
class Comprehension(Node):
    """``range.macro(variable, *body)``: a predicate, a transform, or both (``map``)."""

    macro: str
    range: Node
    variable: str
    body: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return (self.range, *self.body)


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, parents before their children."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children()))


# -- lexing ----------------------------------------------------------------------------

_PUNCTUATION = ("&&", "||", "==", "!=", "<=", ">=", *"()[]{}.,:?!-+*/%<>")
_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "?": "?",
    '"': '"',
    "'": "'",
    "`": "`",
}
_IDENT_START = frozenset("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_IDENT_PART = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class Token:
    #: "ident", "int", "uint", "double", "string", "punct" or "end"
    kind: str
    text: str
    offset: int
    value: Any = None


class _Lexer:
    """Tokens of a text, in one pass (every loop moves forward)."""

    def __init__(self, text: str, error: Callable[[str, int], InvalidFilter]) -> None:
        self.text = text
        self.error = error

    def tokens(self) -> list[Token]:
        text, n = self.text, len(self.text)
        out: list[Token] = []
        i = 0
        while i < n:
            c = text[i]
            if c in " \t\n\r\f":
                i += 1
            elif text.startswith("//", i):
                end = text.find("\n", i)
                i = n if end < 0 else end
            elif c in _IDENT_START:
                j = i + 1
                while j < n and text[j] in _IDENT_PART:
                    j += 1
                word = text[i:j]
                if j < n and text[j] in "'\"" and word.lower() in ("r", "b", "rb", "br"):
                    if "b" in word.lower():
                        raise self.error("bytes literals are not supported", i)
                    token, i = self._string(j, raw=True, start=i)
                    out.append(token)
                    continue
                out.append(Token("ident", word, i))
                i = j
            elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
                token, i = self._number(i)
                out.append(token)
            elif c in "'\"":
                token, i = self._string(i, raw=False, start=i)
                out.append(token)
            else:
                for mark in _PUNCTUATION:
                    if text.startswith(mark, i):
                        out.append(Token("punct", mark, i))
                        i += len(mark)
                        break
                else:
                    raise self.error(f"unexpected character {c!r}", i)
        out.append(Token("end", "", n))
        return out

    def _number(self, start: int) -> tuple[Token, int]:
        text, n = self.text, len(self.text)
        i = start
        if text.startswith(("0x", "0X"), i):
            i += 2
            j = i
            while j < n and text[j] in _HEX:
                j += 1
            if j == i:
                raise self.error("a hexadecimal literal needs digits", start)
            value = int(text[i:j], 16)
            return self._integer(start, j, value)
        while i < n and text[i] in _DIGITS:
            i += 1
        is_float = False
        if i < n and text[i] == "." and i + 1 < n and text[i + 1] in _DIGITS:
            is_float = True
            i += 1
            while i < n and text[i] in _DIGITS:
                i += 1
        if i < n and text[i] in "eE":
            j = i + 1
            if j < n and text[j] in "+-":
                j += 1
            if j < n and text[j] in _DIGITS:
                is_float = True
                i = j
                while i < n and text[i] in _DIGITS:
                    i += 1
        if is_float:
            number = float(text[start:i])
            if not math.isfinite(number):
                raise self.error("a double literal out of range", start)
            return Token("double", text[start:i], start, number), i
        return self._integer(start, i, int(text[start:i]))

    def _integer(self, start: int, end: int, value: int) -> tuple[Token, int]:
        text = self.text
        if end < len(text) and text[end] in "uU":
            if value >= _UINT64:
                raise self.error("an unsigned integer literal out of range", start)
            return Token("uint", text[start : end + 1], start, value), end + 1
        # 2**63 is allowed here only as the operand of a unary minus (checked by the parser)
        if value > _INT64:
            raise self.error("an integer literal out of range", start)
        return Token("int", text[start:end], start, value), end

    def _string(self, i: int, *, raw: bool, start: int) -> tuple[Token, int]:
        text, n = self.text, len(self.text)
        quote = text[i]
        triple = text.startswith(quote * 3, i)
        mark = quote * 3 if triple else quote
        i += len(mark)
        out: list[str] = []
        while True:
            if i >= n:
                raise self.error("an unterminated string", start)
            if text.startswith(mark, i):
                i += len(mark)
                break
            c = text[i]
            if c in "\r\n" and not triple:
                raise self.error("a line break inside a string (use a triple-quoted one)", start)
            if c == "\\" and not raw:
                char, i = self._escape(i)
                out.append(char)
                continue
            out.append(c)
            i += 1
        return Token("string", text[start:i], start, "".join(out)), i

    def _escape(self, i: int) -> tuple[str, int]:
        text = self.text
        kind = text[i + 1 : i + 2]
        if kind in _ESCAPES:
            return _ESCAPES[kind], i + 2
        widths = {"x": 2, "X": 2, "u": 4, "U": 8}
        if kind in widths:
            digits = text[i + 2 : i + 2 + widths[kind]]
            if len(digits) != widths[kind] or not set(digits) <= _HEX:
                raise self.error(f"a \\{kind} escape needs {widths[kind]} hex digits", i)
            return self._code_point(int(digits, 16), i), i + 2 + widths[kind]
        digits = text[i + 1 : i + 4]
        if len(digits) == 3 and digits[0] in "0123" and set(digits) <= set("01234567"):
            return self._code_point(int(digits, 8), i), i + 4
        raise self.error("an unknown escape sequence", i)

    def _code_point(self, value: int, offset: int) -> str:
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise self.error("an escape that is not a Unicode code point", offset)
        return chr(value)


# -- parsing ---------------------------------------------------------------------------

_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">="})


class _Parser:
    def __init__(self, text: str, error: Callable[[str, int], InvalidFilter]) -> None:
        self.error = error
        self.tokens = _Lexer(text, error).tokens()
        self.at = 0
        self.nesting = 0

    # tokens
    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def accept(self, mark: str) -> bool:
        token = self.token
        if token.kind == "punct" and token.text == mark:
            self.at += 1
            return True
        return False

    def expect(self, mark: str) -> Token:
        token = self.token
        if not (token.kind == "punct" and token.text == mark):
            raise self.error(f"expected {mark!r}, found {_shown(token)}", token.offset)
        self.at += 1
        return token

    def _node(self, cls: type[_N], offset: int, *args: Any) -> _N:
        depth = 1 + max((child.depth for child in _nodes_in(args)), default=0)
        if depth > MAX_DEPTH:
            raise self.error(f"the expression nests more than {MAX_DEPTH} deep", offset)
        return cls(offset, depth, *args)

    def _nest(self, offset: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(
                f"the expression nests brackets, calls or conditionals more than "
                f"{MAX_NESTING} deep",
                offset,
            )

    # grammar
    def parse(self) -> Node:
        node = self.expr()
        if self.token.kind != "end":
            raise self.error(f"unexpected {_shown(self.token)}", self.token.offset)
        return node

    def expr(self) -> Node:
        condition = self.binary(0)
        if not self.accept("?"):
            return condition
        self._nest(condition.offset)
        then = self.binary(0)
        self.expect(":")
        otherwise = self.expr()
        self.nesting -= 1
        return self._node(Operator, condition.offset, "?:", (condition, then, otherwise))

    _LEVELS: tuple[frozenset[str], ...] = (
        frozenset({"||"}),
        frozenset({"&&"}),
        _RELATIONS | {"in"},
        frozenset({"+", "-"}),
        frozenset({"*", "/", "%"}),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        operators = self._LEVELS[level]
        left = self.binary(level + 1)
        while True:
            token = self.token
            if token.kind == "punct" or (token.kind == "ident" and token.text == "in"):
                op = token.text
            else:
                return left
            if op not in operators:
                return left
            self.at += 1
            right = self.binary(level + 1)
            left = self._node(Operator, left.offset, op, (left, right))

    def unary(self) -> Node:
        token = self.token
        if not (token.kind == "punct" and token.text in ("!", "-")):
            return self.member(self.primary())
        ops = []
        while self.token.kind == "punct" and self.token.text == token.text:
            ops.append(self.take())
        node: Node
        if (
            token.text == "-"
            and self.token.kind in ("int", "double")
            and self.tokens[self.at + 1].text not in (".", "[")
        ):
            # a negative literal (so that -9223372036854775808 is an int)
            literal = self.take()
            minus = ops.pop()
            if literal.kind == "int" and literal.value > _INT64:
                raise self.error("an integer literal out of range", literal.offset)
            node = self._node(Literal, minus.offset, -literal.value, literal.kind)
        else:
            node = self.member(self.primary())
        for op in reversed(ops):
            node = self._node(Operator, op.offset, "neg" if op.text == "-" else "!", (node,))
        return node

    def member(self, node: Node) -> Node:
        while True:
            token = self.token
            if self.accept("."):
                name = self.take()
                if name.kind != "ident":
                    raise self.error(f"expected a field name, found {_shown(name)}", name.offset)
                if name.text in RESERVED:
                    raise self.error(f"{name.text!r} is reserved", name.offset)
                if self.accept("("):
                    args = self.arguments(")", token.offset)
                    node = self.call(name.text, node, args, token.offset)
                else:
                    node = self._node(Select, node.offset, node, name.text)
            elif self.accept("["):
                self._nest(token.offset)
                index = self.expr()
                self.expect("]")
                self.nesting -= 1
                node = self._node(Index, node.offset, node, index)
            elif token.kind == "punct" and token.text == "{":
                raise self.error("message construction is not supported", token.offset)
            else:
                return node

    def primary(self) -> Node:
        token = self.take()
        kind = token.kind
        if kind in ("int", "uint", "double", "string"):
            if kind == "int" and token.value >= _INT64:
                raise self.error("an integer literal out of range", token.offset)
            return self._node(Literal, token.offset, token.value, kind)
        if kind == "ident":
            name = token.text
            if name in ("true", "false"):
                return self._node(Literal, token.offset, name == "true", "bool")
            if name == "null":
                return self._node(Literal, token.offset, None, "null")
            if name in RESERVED:
                raise self.error(f"{name!r} is reserved", token.offset)
            if self.accept("("):
                args = self.arguments(")", token.offset)
                return self.call(name, None, args, token.offset)
            return self._node(Ident, token.offset, name)
        if kind == "punct":
            if token.text == "(":
                self._nest(token.offset)
                node = self.expr()
                self.expect(")")
                self.nesting -= 1
                return node
            if token.text == "[":
                return self._node(ListLit, token.offset, tuple(self.arguments("]", token.offset)))
            if token.text == "{":
                return self._node(MapLit, token.offset, self.entries(token.offset))
            if token.text == ".":
                raise self.error("names with a leading dot are not supported", token.offset)
        raise self.error(f"unexpected {_shown(token)}", token.offset)

    def arguments(self, close: str, offset: int) -> list[Node]:
        self._nest(offset)
        args: list[Node] = []
        while not self.accept(close):
            args.append(self.expr())
            if not self.accept(","):
                self.expect(close)
                break
            if close == ")" and self.token.kind == "punct" and self.token.text == ")":
                raise self.error("a call's arguments end with a comma", self.token.offset)
        self.nesting -= 1
        return args

    def entries(self, offset: int) -> tuple[tuple[Node, Node], ...]:
        self._nest(offset)
        entries: list[tuple[Node, Node]] = []
        while not self.accept("}"):
            key = self.expr()
            self.expect(":")
            entries.append((key, self.expr()))
            if not self.accept(","):
                self.expect("}")
                break
        self.nesting -= 1
        return tuple(entries)

    def call(self, name: str, target: Node | None, args: list[Node], offset: int) -> Node:
        if name == "has" and target is None:
            if len(args) != 1 or not isinstance(args[0], Select):
                raise self.error("has takes one field selection, as has(event.task)", offset)
            select = args[0]
            return self._node(Has, offset, select.operand, select.name)
        if target is not None and name in MACROS:
            counts = MACROS[name]
            if len(args) - 1 not in counts or not isinstance(args[0], Ident):
                shape = " or ".join(str(c + 1) for c in counts)
                raise self.error(
                    f"{name} takes a variable name and an expression ({shape} arguments in all)",
                    offset,
                )
            variable = args[0]
            assert isinstance(variable, Ident)
            return self._node(Comprehension, offset, name, target, variable.name, tuple(args[1:]))
        return self._node(Call, offset, name, target, tuple(args))


def _nodes_in(args: tuple[Any, ...]) -> Iterator[Node]:
    for arg in args:
        if isinstance(arg, Node):
            yield arg
        elif isinstance(arg, tuple):
            yield from _nodes_in(arg)


def _shown(token: Token) -> str:
    return "the end of the expression" if token.kind == "end" else repr(token.text[:20])


def parse(text: str, field: str) -> Node:
    """The tree of ``text``; raises :class:`InvalidFilter` with the line and column of the
    first thing that is not CEL (as this module reads it)."""

    def error(message: str, offset: int) -> InvalidFilter:
        line = text.count("\n", 0, offset) + 1
        column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        return InvalidFilter(
            f"{field} does not parse at line {line}, column {column}: {message}",
            details={"field": field, "line": line, "column": column},
        )

    return _Parser(text, error).parse()


# -- printing --------------------------------------------------------------------------

#: Binding strength of each operator: a child weaker than its parent is parenthesized.
_PRECEDENCE = {
    "?:": 1,
    "||": 2,
    "&&": 3,
    **dict.fromkeys(_RELATIONS | {"in"}, 4),
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
    "!": 7,
    "neg": 7,
}
_ATOM = 8


def precedence(node: Node) -> int:
    if isinstance(node, Operator):
        return _PRECEDENCE[node.op]
    if isinstance(node, Literal) and isinstance(node.value, int | float) and node.value < 0:
        return 7  # printed with its sign: a unary minus
    return _ATOM


#: How :func:`emit` prints a comprehension (given its printed range and macro call) and a
#: ``matches`` call (given its printed string and pattern); None: as written.
Rewrite = Callable[[Node, str, str], str | None]


def emit(node: Node, rewrite: Rewrite | None = None, names: Mapping[int, str] | None = None) -> str:
    """The text of ``node``, parenthesized where the grammar needs it: parsing it gives
    the same tree. ``rewrite`` may print a comprehension or a ``matches`` call otherwise
    (the Field wraps them in its own functions); ``names`` prints the nodes it holds (by
    identity) as those names (the Field gives what a path reads as a variable)."""
    return _Printer(rewrite, names or {}).text(node)


class _Printer:
    def __init__(self, rewrite: Rewrite | None, names: Mapping[int, str]) -> None:
        self.rewrite = rewrite
        self.names = names

    def text(self, node: Node) -> str:
        name = self.names.get(id(node))
        if name is not None:
            return name
        if isinstance(node, Literal):
            return literal_text(node.value, node.kind)
        if isinstance(node, Ident):
            return node.name
        if isinstance(node, Select):
            return f"{self.receiver(node.operand)}.{node.name}"
        if isinstance(node, Has):
            return f"has({self.receiver(node.operand)}.{node.name})"
        if isinstance(node, Index):
            return f"{self.receiver(node.operand)}[{self.text(node.index)}]"
        if isinstance(node, ListLit):
            return "[" + ", ".join(self.text(item) for item in node.items) + "]"
        if isinstance(node, MapLit):
            return "{" + ", ".join(f"{self.text(k)}: {self.text(v)}" for k, v in node.entries) + "}"
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Comprehension):
            target = self.receiver(node.range)
            body = ", ".join([node.variable, *(self.text(part) for part in node.body)])
            call = f"{target}.{node.macro}({body})"
            if self.rewrite is not None:
                rewritten = self.rewrite(node, target, call)
                if rewritten is not None:
                    return rewritten
            return call
        assert isinstance(node, Operator)
        return self.operator(node)

    def call(self, node: Call) -> str:
        args = ", ".join(self.text(arg) for arg in node.args)
        if node.name == "matches" and self.rewrite is not None:
            if node.target is not None:
                subject, pattern = self.text(node.target), self.text(node.args[0])
            else:
                subject, pattern = (self.text(arg) for arg in node.args)
            rewritten = self.rewrite(node, subject, pattern)
            if rewritten is not None:
                return rewritten
        if node.target is None:
            return f"{node.name}({args})"
        return f"{self.receiver(node.target)}.{node.name}({args})"

    def receiver(self, node: Node) -> str:
        """The operand of ``.`` or ``[]``: a literal too is parenthesized (``(1).f``)."""
        text = self.text(node)
        if id(node) in self.names:
            return text
        return text if precedence(node) == _ATOM and not isinstance(node, Literal) else f"({text})"

    def operator(self, node: Operator) -> str:
        op, args = node.op, node.args
        strength = _PRECEDENCE[op]
        if op in ("!", "neg"):
            operand = args[0]
            text = self.text(operand)
            if precedence(operand) < strength or (op == "neg" and text.startswith("-")):
                text = f"({text})"
            return ("-" if op == "neg" else "!") + text
        if op == "?:":
            condition, then, otherwise = (self.text(arg) for arg in args)
            if precedence(args[0]) <= strength:
                condition = f"({condition})"
            if precedence(args[1]) <= strength:
                then = f"({then})"
            if precedence(args[2]) < strength:
                otherwise = f"({otherwise})"
            return f"{condition} ? {then} : {otherwise}"
        left, right = (self.text(arg) for arg in args)
        if precedence(args[0]) < strength:
            left = f"({left})"
        if precedence(args[1]) <= strength:
            right = f"({right})"
        return f"{left} {op} {right}"


def literal_text(value: Any, kind: str) -> str:
    """A literal as CEL writes it: strings with only ``\\\\``, ``\\"`` and ``\\u`` escapes."""
    if kind == "string":
        return '"' + "".join(_char_text(c) for c in value) + '"'
    if kind == "bool":
        return "true" if value else "false"
    if kind == "null":
        return "null"
    if kind == "uint":
        return f"{value}u"
    if kind == "double":
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    return str(value)


def _char_text(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if " " <= c <= "~":
        return c
    point = ord(c)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"
