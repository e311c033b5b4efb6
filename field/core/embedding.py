"""Embeddings of text for semantic relevance (spec Level 2).

An :class:`Embedder` turns texts into unit-length float32 vectors, so the
cosine similarity of two texts is the dot product of their rows. The
default, :class:`HashingEmbedder`, needs no model and no download: it is
feature hashing of the text's words and character trigrams (each feature
lands in one of ``dim`` buckets with a sign from the same hash), which
makes texts that share words and word pieces close. It is deterministic
across processes and machines, so embeddings never need to be stored:
the Field recomputes them when it replays the log.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]

_WORD = re.compile(r"[^\W_]+")
#: weight of a character trigram relative to a whole word
TRIGRAM_WEIGHT = 0.5
#: word -> (bucket, sign) memo; bounded, cleared when full
_MEMO_LIMIT = 1 << 18


class Embedder(Protocol):
    """What the Field needs of an embedding model."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text (a zero row for a text with no features)."""
        ...


class HashingEmbedder:
    """Signed feature hashing of words and character trigrams (the default)."""

    def __init__(self, dim: int = 256) -> None:
        if dim < 8 or dim & (dim - 1):
            raise ValueError("dim must be a power of two, at least 8")
        self._dim = dim
        self._words: dict[str, tuple[int, float]] = {}

    @property
    def name(self) -> str:
        return f"hashing-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            self._embed_into(text, out[i])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def _embed_into(self, text: str, row: npt.NDArray[np.float32]) -> None:
        words = _WORD.findall(text.lower())
        if not words:
            return
        memo = self._words
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        mask = self._dim - 1
        for word in words:
            hashed = memo.get(word)
            if hashed is None:
                h = zlib.crc32(word.encode())
                hashed = memo[word] = (h & mask, 1.0 if h & 0x80000000 else -1.0)
            row[hashed[0]] += hashed[1]
        # character trigrams of " word word ... ", all at once
        data = np.frombuffer((" " + " ".join(words) + " ").encode(), dtype=np.uint8)
        if len(data) >= 3:
            grams = (
                data[:-2].astype(np.uint32) << 16
                | data[1:-1].astype(np.uint32) << 8
                | data[2:].astype(np.uint32)
            )
            mixed = grams * np.uint32(0x9E3779B1)  # Fibonacci hashing, wraps mod 2**32
            mixed ^= mixed >> np.uint32(15)
            buckets = (mixed & np.uint32(mask)).astype(np.intp)
            signs = np.where(mixed & np.uint32(0x80000000), TRIGRAM_WEIGHT, -TRIGRAM_WEIGHT)
            np.add.at(row, buckets, signs.astype(np.float32))


def default_embedder() -> Embedder:
    return HashingEmbedder()
