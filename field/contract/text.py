"""Short forms of long texts, in time that depends on the result, not on the text.

Summaries, descriptions and notifications quote the start of a unit's
content, which may be 64 K characters long. :func:`shorten` reads only
the words its result needs, so quoting a long content costs what
quoting a short one does.
"""

from __future__ import annotations

import re

#: A word: a run of characters that are not whitespace (as ``str.split`` sees it).
_WORD = re.compile(r"\S+")


def shorten(text: str, limit: int) -> str:
    """``text`` with every run of whitespace made one space, cut to ``limit`` characters.

    A text that had to be cut ends in "…" (the result is at most ``limit``
    characters long). The same as ``" ".join(text.split())`` cut to
    ``limit``, but it stops reading once it has more than ``limit``
    characters: ``re``'s whitespace and ``str.split``'s are the same.
    """
    return _shortened(text, limit, sentence=False)


def first_sentence(text: str, limit: int) -> str:
    """The first sentence of ``text`` (up to its first ". "), shortened as by :func:`shorten`.

    Reads as far as the sentence or the limit, whichever comes first. A
    ". " always ends a word (a run of non-whitespace), so the sentence ends
    with the first word that ends in "." and is followed by a space.
    """
    return _shortened(text, limit, sentence=True)


def _shortened(text: str, limit: int, *, sentence: bool) -> str:
    if len(text) <= limit and _normal(text) and not (sentence and ". " in text):
        return text  # already its own normal form, and short enough: most contents
    head = text[: limit + 1]
    if head.endswith(" "):
        head = text[: limit + 2]  # normal if a word follows the space
    if len(head) > limit and _normal(head) and not (sentence and ". " in head):
        # the text starts with more than ``limit`` characters that are already
        # normal (so they are the start of the result) and end no sentence
        return head[: limit - 1].rstrip() + "…"
    words: list[str] = []
    length = -1  # of the words joined by single spaces
    for match in _WORD.finditer(text):
        words.append(match.group())
        length += 1 + len(words[-1])
        if length > limit:
            break
        end = match.end()
        if sentence and text[end - 1] == "." and text[end : end + 1] == " ":
            break
    joined = " ".join(words)
    if length <= limit:
        return joined
    return joined[: limit - 1].rstrip() + "…"


def _normal(head: str) -> bool:
    """Whether ``head`` is the start of the text's normal form as it is.

    So it holds no whitespace but single ASCII spaces between words (every
    other whitespace character is a control or separator character, which
    ``str.isprintable`` refuses) and neither starts nor ends with one.
    """
    return (
        head.isprintable()
        and "  " not in head
        and not head.startswith(" ")
        and not head.endswith(" ")
    )
