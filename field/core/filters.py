"""CEL expressions: compiled once, checked before use, evaluated with a bounded cost.

Subscriptions (``subscription.filter``) and inbound event sources (their filter over a
payload) say what they want with a Common Expression Language expression. This module
compiles one, refuses what cannot be run safely (``422 INVALID_FILTER`` with the message
and the position), and evaluates it without ever raising: a failed evaluation is "no
match", and the caller counts it.

The library is ``common-expression-language`` (the Rust ``cel`` interpreter with Python
bindings): on the same expressions it evaluates 20 times faster than the pure-Python
``cel-python`` and reports parse errors with their line and column.

What bounds an evaluation's cost: CEL has no loops or recursion of its own; its only
iteration is the comprehension macros (``all``, ``exists``, ``exists_one``, ``map``,
``filter``). An expression is at most :data:`MAX_FILTER_CHARS` long, holds at most
:data:`MAX_COMPREHENSIONS` comprehensions and none inside another, so an evaluation is
linear in the size of the values it is given, which the Field bounds.

``matches``: the interpreter compiles a ``matches`` pattern on every evaluation (a quarter of
a millisecond for ``\\w``, 70 ms for a pattern its size limit then refuses), so a filter
evaluated for every event could spend the Field's time compiling. Here a pattern must be a
string literal; it is compiled once, with RE2 (the engine and syntax the CEL specification
names for ``matches``: linear in the text, whatever the pattern), and refused at creation if
RE2 refuses it or it is wider than :data:`MAX_PATTERN_WIDTH`, which bounds what one search
costs. The expression runs with every ``matches`` call bound to :func:`_matches`, which
searches with the cached compiled pattern.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cel
import re2

from ..errors import Code, InvalidPayload

#: Longest expression, in characters.
MAX_FILTER_CHARS = 2048
#: Most comprehension macros in one expression (none may be nested in another).
MAX_COMPREHENSIONS = 2
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_POSITION = re.compile(r"<input>:(\d+):(\d+):\s*(.*)")
#: Longest ``matches`` pattern, in characters.
MAX_PATTERN_CHARS = 256
#: Widest ``matches`` pattern: the size of its program over single bytes, about the number
#: of characters it spans written out (``a[ab]{100}c`` is 106; ``\pL+`` is 12, a class
#: being one step). A search RE2's DFA cannot hold (a text made to keep every alternative
#: alive) costs about this many steps per character: 40 ms on 64 K characters at 128.
MAX_PATTERN_WIDTH = 128
#: Most memory RE2 may use for one pattern, its program and its DFA's states together.
MAX_PATTERN_MEMORY = 1 << 20
#: What ``matches`` calls are compiled to: the Field's cached RE2 search (:func:`_matches`).
_MATCHES = "_field_matches"
_CALL = re.compile(r"\bmatches\s*\(")
_METACHARACTER = re.compile(r"[\\.^$|?*+()\[\]{}]")
_RE2 = re2.Options()
_RE2.max_mem = MAX_PATTERN_MEMORY
_RE2.log_errors = False  # a refused pattern is the client's error, not the server's
_WIDTH = re2.Options()
_WIDTH.encoding = re2.Options.Encoding.LATIN1
_WIDTH.log_errors = False


class InvalidFilter(InvalidPayload):
    """An expression the Field will not run: syntax, unknown names, size, shape."""

    code = Code.INVALID_FILTER
    suggested_action = (
        "Fix the expression (see the position and message); the variables it may use are "
        "listed in protocol/README.md, 'Filters'."
    )


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled expression and the variables it reads."""

    text: str
    program: Any
    #: the context variables it reads (a subset of those allowed when compiled)
    variables: frozenset[str]

    def evaluate(self, context: Any) -> bool | None:
        """True or False; None when the evaluation failed (a missing field, a wrong
        type, a result that is not a boolean): the caller counts that as no match.
        ``context``: a :func:`new_context`, or a mapping of the variables."""
        try:
            result = self.program.execute(_context(context))
        except Exception:  # the library raises KeyError, TypeError, RuntimeError, ValueError
            return None
        return result if isinstance(result, bool) else None

    def outcome(self, context: Any) -> tuple[bool, str | None]:
        """``(passed, error)``: as :meth:`evaluate`, with why an evaluation failed
        (``(False, None)`` when it simply gave false)."""
        try:
            result = self.program.execute(context)
        except KeyError as error:
            return False, f"no such key: {error}"
        except Exception as error:  # see evaluate
            return False, f"{type(error).__name__}: {error}"
        if isinstance(result, bool):
            return result, None
        return False, f"the expression gave a {type(result).__name__}, not a boolean"


def new_context(variables: Mapping[str, Any] | None = None) -> cel.Context:
    """A context to run any expression of this module in: ``variables`` and the Field's
    ``matches``."""
    context = cel.Context()
    context.add_function(_MATCHES, _matches)
    for name, value in (variables or {}).items():
        context.add_variable(name, value)
    return context


def _context(context: Any) -> cel.Context:
    return context if isinstance(context, cel.Context) else new_context(context)


def compile_expression(
    text: Any,
    allowed: Iterable[str],
    *,
    field: str,
    max_chars: int = MAX_FILTER_CHARS,
    stored: bool = False,
) -> Expression:
    """Compile ``text``, which may read only the variables ``allowed``; raises
    :class:`InvalidFilter` naming ``field`` (the payload field it came from).

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
    bound = _check_shape(text, field)
    try:
        program = cel.compile(text)
    except Exception as error:  # ValueError with the parser's report
        raise _syntax_error(str(error), field) from None
    references = program.references()
    functions = set(references.get("functions", ()))
    if _MATCHES in functions and not stored:
        raise InvalidFilter(
            f"{field} calls an unknown function {_MATCHES}", details={"field": field}
        )
    if "matches" in functions:
        try:
            program = cel.compile(_bind_matches(text, field))
        except InvalidFilter:
            if not stored:
                raise
    names = set(references.get("variables", ())) - bound
    allowed = frozenset(allowed)
    unknown = sorted(names - allowed)
    if unknown:
        raise InvalidFilter(
            f"{field} reads unknown variable(s) {', '.join(unknown)}; "
            f"it may read {', '.join(sorted(allowed))}",
            details={"field": field, "unknown_variables": unknown, "variables": sorted(allowed)},
        )
    return Expression(text, program, frozenset(names))


def _bind_matches(text: str, field: str) -> str:
    """``text`` with each ``matches`` call bound to :func:`_matches`, once every pattern is
    checked: a string literal that RE2 compiles, at most :data:`MAX_PATTERN_WIDTH` wide."""
    code = blank_strings(text)
    bound = []
    end = 0
    for call in _CALL.finditer(code):
        name = call.start()
        method = code[:name].rstrip().endswith(".")
        arguments = _arguments(code, call.end())
        if len(arguments) != (1 if method else 2):
            raise InvalidFilter(
                f"{field}: matches takes a string and a pattern (offset {name})",
                details={"field": field, "offset": name},
            )
        start, stop = arguments[-1]
        _pattern(text[start:stop].strip(), field, start)
        bound.append(text[end:name] + _MATCHES)
        end = name + len("matches")
    return "".join(bound) + text[end:]


def _arguments(code: str, start: int) -> list[tuple[int, int]]:
    """The spans of a call's arguments, its list opening at ``start`` (strings blanked)."""
    spans = []
    depth = 0
    begin = start
    for i in range(start, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                if code[begin:i].strip():
                    spans.append((begin, i))
                return spans
            depth -= 1
        elif c == "," and depth == 0:
            spans.append((begin, i))
            begin = i + 1
    return spans  # unclosed: the parser has refused it already


def _pattern(literal: str, field: str, offset: int) -> None:
    """Refuse a ``matches`` pattern that is not a string literal RE2 runs cheaply."""
    quote = 1 if literal[:1] in "rR" else 0
    value = None
    if literal[quote : quote + 1] in ("'", '"') and skip_string(literal, quote) == len(literal):
        value = cel.evaluate(literal)
    details = {"field": field, "offset": offset}
    if not isinstance(value, str):
        raise InvalidFilter(
            f"{field}: the pattern of matches must be a string literal (offset {offset}), "
            "so that the Field compiles it once",
            details=details,
        )
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


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Callable[[str], bool]:
    """Whether ``pattern`` is found in a text: ``in`` for a pattern without metacharacters
    (no faster search than Python's own), else the compiled RE2 search."""
    if _METACHARACTER.search(pattern) is None:
        return lambda text: pattern in text
    search = re2.compile(pattern, _RE2).search
    return lambda text: search(text) is not None


def _matches(text: Any, pattern: Any) -> bool:
    """CEL's ``matches``: whether ``pattern`` (RE2) matches anywhere in ``text``."""
    if not isinstance(text, str) or not isinstance(pattern, str):
        raise TypeError("matches takes a string and a pattern string")
    return _compiled(pattern)(text)


def check_types(expression: Expression, samples: Iterable[Mapping[str, Any]], field: str) -> None:
    """Refuse an expression that fails with a type error on every sample context (say
    ``event.epoch + "x"``): a type error that no value can avoid. Missing fields are no
    error here: a sample need not hold every field a real event may."""
    reasons = []
    for sample in samples:
        try:
            expression.program.execute(new_context(sample))
        except TypeError as error:
            reasons.append(str(error).split(". ")[0])
            continue
        except Exception:  # noqa: S112 - a missing field or key: fine on some event
            return
        return
    if reasons:
        raise InvalidFilter(
            f"{field} has a type error: {reasons[0]}",
            details={"field": field},
        )


def _syntax_error(report: str, field: str) -> InvalidFilter:
    found = _POSITION.search(report)
    if found is None:
        return InvalidFilter(f"{field} does not parse: {report[:300]}", details={"field": field})
    line, column, message = int(found[1]), int(found[2]), found[3].strip()
    return InvalidFilter(
        f"{field} does not parse at line {line}, column {column}: {message[:300]}",
        details={"field": field, "line": line, "column": column},
    )


def _check_shape(text: str, field: str) -> set[str]:
    """Count comprehensions (outside string literals) and refuse too many or nested ones;
    return the names they bind (which are not context variables)."""
    bound: set[str] = set()
    open_at: list[int] = []  # paren depth at which each open comprehension started
    depth = comprehensions = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            i = skip_string(text, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if open_at and open_at[-1] == depth:
                open_at.pop()
            depth -= 1
        elif c == "." and i + 1 < n:
            macro = re.match(r"\.\s*([A-Za-z_]\w*)\s*\(\s*([A-Za-z_]\w*)?", text[i:])
            if macro is not None and macro[1] in _MACROS:
                comprehensions += 1
                if open_at:
                    raise InvalidFilter(
                        f"{field} nests a comprehension ({macro[1]}) inside another; "
                        "the Field runs none nested",
                        details={"field": field, "offset": i},
                    )
                if comprehensions > MAX_COMPREHENSIONS:
                    raise InvalidFilter(
                        f"{field} has more than {MAX_COMPREHENSIONS} comprehensions "
                        "(all, exists, exists_one, map, filter)",
                        details={"field": field, "offset": i},
                    )
                if macro[2]:
                    bound.add(macro[2])
                open_at.append(depth + 1)
                depth += 1
                i += macro.end()
                continue
        i += 1
    return bound


def skip_string(text: str, start: int) -> int:
    """The index after the string literal opening at ``start`` (or the end of the text)."""
    quote = text[start]
    triple = text.startswith(quote * 3, start)
    end_mark = quote * 3 if triple else quote
    i = start + len(end_mark)
    raw = start > 0 and text[start - 1] in "rR"
    while i < len(text):
        if text[i] == "\\" and not raw:
            i += 2
            continue
        if text.startswith(end_mark, i):
            return i + len(end_mark)
        if text[i] == "\n" and not triple:
            return i  # an unterminated literal: the parser reports it
        i += 1
    return i


def blank_strings(text: str) -> str:
    """``text`` with the inside of every string literal blanked (same length)."""
    out = []
    i = 0
    while i < len(text):
        if text[i] in "'\"":
            end = skip_string(text, i)
            out.append(text[i] + " " * max(0, end - i - 2) + (text[end - 1] if end - i > 1 else ""))
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
