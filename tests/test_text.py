"""Short forms of texts: the same result as normalizing the whole text, read only in part."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.text import first_sentence, shorten

#: Every character ``str.split`` treats as whitespace, and a few that it does not.
WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
PIECES = st.sampled_from(["a", "bc", "é", ".", ". ", "  ", "\u200b", *WHITESPACE])
texts = st.lists(PIECES, max_size=30).map("".join)


def reference_shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def reference_first_sentence(text: str, limit: int) -> str:
    text = text.strip()
    end = text.find(". ")
    return reference_shorten(text if end < 0 else text[: end + 1], limit)


@settings(max_examples=2000)
@given(texts, st.integers(min_value=1, max_value=24))
def test_shorten_is_the_whole_text_normalized_and_cut(text: str, limit: int) -> None:
    assert shorten(text, limit) == reference_shorten(text, limit)


@settings(max_examples=2000)
@given(texts, st.integers(min_value=1, max_value=24))
def test_first_sentence_is_the_sentence_normalized_and_cut(text: str, limit: int) -> None:
    assert first_sentence(text, limit) == reference_first_sentence(text, limit)


def test_every_whitespace_character_ends_a_word() -> None:
    for space in WHITESPACE:
        text = f"first{space}second third fourth"
        assert shorten(text, 13) == reference_shorten(text, 13) == "first second…"


def test_a_long_text_is_shortened_like_a_short_one() -> None:
    long = "word " * 13_000 + "end. More"
    assert shorten(long, 240) == reference_shorten(long, 240)
    assert first_sentence(long, 240) == reference_first_sentence(long, 240)
    assert first_sentence("One. Two.", 240) == "One."
