"""Whether RE2 searches a ``matches`` pattern with its DFA, whatever the text.

RE2 is linear in the text, but at two very different rates: its DFA reads about a
character a nanosecond; when a pattern's DFA outgrows RE2's memory on a text made for it
(``a[ab]{20}c``: every position of the last 21 characters may start a match, 2^21 states),
RE2 falls back to simulating its program, about the pattern's width in steps per character
(34 ms for 65,536 characters at width 128). The cost model (:mod:`field.expressions.costs`) must
charge a pattern by the rate it can be made to run at.

:func:`dfa_states` builds the pattern's automaton (Thompson's construction over classes of
characters) and counts the states of its DFA, for the unanchored forward search and for the
reverse search RE2 runs to find where a match starts, stopping at ``most``. Everything it
cannot model exactly it over-approximates, so that a count within the bound is a bound on
RE2's: an empty-width assertion (``\\b``, ``^``, ``$``) passes always, a Unicode class
(``\\pL``), a POSIX class and anything unknown match any character. A pattern it cannot
read at all is None (taken as the worst).

The parser is Python's own (``re._parser``, the syntax RE2 shares for everything but the
classes rewritten here first); no text is ever searched here.
"""

from __future__ import annotations

import functools
import re
import re._constants as sre
import re._parser as sre_parse
from collections.abc import Iterable
from typing import Any

#: Most state-and-character steps one count may take (about 2 ms): a pattern whose DFA is
#: not shown small within them is taken as one whose DFA is not.
MAX_WORK = 20_000
#: Characters a class is tested on: every ASCII one, and a few of other scripts.
_PROBES = tuple(map(chr, range(128))) + (
    "\u00e9",
    "\u00c9",
    "\u03a9",
    "\u4e2d",
    "\u2028",
    "\U0001f600",
)
#: What RE2 writes that Python's parser does not read the same: read as "any character".
_UNICODE_CLASS = re.compile(r"\\[pP](\{[^}]*\}|[A-Za-z])")
_POSIX_BRACKETS = re.compile(r"\[[^\]]*\[:[a-z]+:\][^\]]*\]")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DIGIT = frozenset("0123456789")
_SPACE = frozenset("\t\n\f\r ")


@functools.lru_cache(maxsize=1024)
def dfa_states(pattern: str, most: int = 64) -> int | None:
    """The states of the DFAs RE2 builds for an unanchored search of ``pattern`` (the larger
    of the forward and the reverse one), counted up to ``most`` + 1; None when the pattern
    cannot be read here."""
    text = _UNICODE_CLASS.sub(".", pattern)
    text = _POSIX_BRACKETS.sub(".", text)
    if "\\Q" in text or "\\C" in text:
        return None
    try:
        parsed = sre_parse.parse(text.replace("\\z", "\\Z"))
    except (re.error, OverflowError, RecursionError, ValueError):
        return None
    nfa = _Nfa(bool(parsed.state.flags & sre.SRE_FLAG_IGNORECASE))
    try:
        start, end = nfa.build(list(parsed))
    except _Unreadable:
        return None
    forward = nfa.count(start, end, most, reverse=False)
    if forward > most:
        return forward
    return max(forward, nfa.count(end, start, most, reverse=True))


class _Unreadable(Exception):
    """A construct the automaton cannot model."""


class _Nfa:
    """States with character-class edges and empty edges."""

    def __init__(self, ignore_case: bool) -> None:
        self.ignore_case = ignore_case
        #: per state: (class: the probes it matches, as a frozenset of indexes, target)
        self.edges: list[list[tuple[frozenset[int], int]]] = []
        self.empty: list[list[int]] = []
        self._classes: dict[tuple[str, str, bool], frozenset[int]] = {}

    def state(self) -> int:
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    def build(self, items: list[Any], case: bool | None = None) -> tuple[int, int]:
        """A fragment for a sequence of parsed items: (its start, its end)."""
        case = self.ignore_case if case is None else case
        start = current = self.state()
        for op, av in items:
            first, last = self._item(op, av, case)
            self.empty[current].append(first)
            current = last
        return start, current

    def _item(self, op: Any, av: Any, case: bool) -> tuple[int, int]:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            start, end = self.state(), self.state()
            self.edges[start].append((self._class(op, av, case), end))
            return start, end
        if op is sre.AT:  # an empty-width assertion: passes always (more states, never fewer)
            start = self.state()
            return start, start
        if op is sre.BRANCH:
            start, end = self.state(), self.state()
            for branch in av[1]:
                first, last = self.build(list(branch), case)
                self.empty[start].append(first)
                self.empty[last].append(end)
            return start, end
        if op is sre.SUBPATTERN:
            _, add, delete, inner = av
            if add & sre.SRE_FLAG_IGNORECASE:
                case = True
            if delete & sre.SRE_FLAG_IGNORECASE:
                case = False
            return self.build(list(inner), case)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            return self._repeat(av, case)
        if op is sre.ATOMIC_GROUP:
            return self.build(list(av), case)
        raise _Unreadable(str(op))  # back-references, look-around: RE2 refused them already

    def _repeat(self, av: Any, case: bool) -> tuple[int, int]:
        low, high, inner = av
        items = list(inner)
        start = current = self.state()
        for _ in range(low):
            first, last = self.build(items, case)
            self.empty[current].append(first)
            current = last
        end = self.state()
        self.empty[current].append(end)
        if high is sre.MAXREPEAT:
            first, last = self.build(items, case)
            self.empty[current].append(first)
            self.empty[last].append(current)
            return start, end
        for _ in range(high - low):
            first, last = self.build(items, case)
            self.empty[current].append(first)
            self.empty[last].append(end)
            current = last
        return start, end

    def _class(self, op: Any, av: Any, case: bool) -> frozenset[int]:
        key = (str(op), repr(av), case)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = self._probed(op, av, case)
        return cls

    def _probed(self, op: Any, av: Any, case: bool) -> frozenset[int]:
        if op is sre.ANY:
            return frozenset(range(len(_PROBES)))
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            tests: list[tuple[Any, Any]] = [(sre.LITERAL, av)]
            negate = op is sre.NOT_LITERAL
        else:
            negate = bool(av) and av[0][0] is sre.NEGATE
            tests = [item for item in av if item[0] is not sre.NEGATE]
        matched = frozenset(i for i, char in enumerate(_PROBES) if _in(char, tests, case) != negate)
        return matched

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        stack = list(seen)
        while stack:
            for target in self.empty[stack.pop()]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return frozenset(seen)

    def count(self, start: int, end: int, most: int, *, reverse: bool) -> int:
        """The states of the DFA of an unanchored search from ``start`` (every position
        may begin a match: ``start`` joins every state), up to ``most`` + 1."""
        edges, empty = self.edges, self.empty
        if reverse:
            edges, empty = self._reversed()
        saved = self.empty
        self.empty = empty
        try:
            probes = self._representatives()
            begin = self.closure([start])
            seen = {begin}
            queue = [begin]
            work = 0
            while queue:
                current = queue.pop()
                work += len(current) * len(probes)
                if work > MAX_WORK:  # not shown small within the work allowed: the worst
                    return most + 1
                for probe in probes:
                    moved = [target for s in current for cls, target in edges[s] if probe in cls]
                    following = self.closure(moved) | begin
                    if following not in seen:
                        seen.add(following)
                        if len(seen) > most:
                            return len(seen)
                        queue.append(following)
            return len(seen)
        finally:
            self.empty = saved

    def _representatives(self) -> list[int]:
        """One probe of each set of probes that every class treats alike."""
        classes = list({cls for targets in self.edges for cls, _ in targets})
        first: dict[tuple[bool, ...], int] = {}
        for probe in range(len(_PROBES)):
            first.setdefault(tuple(probe in cls for cls in classes), probe)
        return list(first.values())

    def _reversed(self) -> tuple[list[list[tuple[frozenset[int], int]]], list[list[int]]]:
        edges: list[list[tuple[frozenset[int], int]]] = [[] for _ in self.edges]
        empty: list[list[int]] = [[] for _ in self.empty]
        for source, targets in enumerate(self.edges):
            for cls, target in targets:
                edges[target].append((cls, source))
        for source, followers in enumerate(self.empty):
            for target in followers:
                empty[target].append(source)
        return edges, empty


def _in(char: str, tests: list[tuple[Any, Any]], case: bool) -> bool:
    """Whether ``char`` is in the class made of ``tests`` (any case, with ``case``)."""
    candidates = {char, char.lower(), char.upper()} if case else {char}
    return any(_test(c, op, av) for c in candidates for op, av in tests)


def _test(char: str, op: Any, av: Any) -> bool:
    code = ord(char)
    if op is sre.LITERAL:
        return bool(code == av)
    if op is sre.RANGE:
        return bool(av[0] <= code <= av[1])
    if op is sre.CATEGORY:
        name = str(av)
        negated = "_NOT_" in name
        if "DIGIT" in name:
            inside = char in _DIGIT
        elif "WORD" in name:
            inside = char in _WORD
        elif "SPACE" in name:
            inside = char in _SPACE
        else:  # a line break class: over-approximated
            return True
        return inside != negated
    return True  # anything else: over-approximated
