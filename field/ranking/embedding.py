"""Embeddings of text for semantic relevance (spec Level 2).

An :class:`Embedder` turns texts into unit-length float32 vectors, so the
cosine similarity of two texts is the dot product of their rows. The
server's default is :class:`WordLlamaEmbedder`, a static sentence model
shipped inside its wheel; :class:`HashingEmbedder`, the default of a Field
made without an embedder, needs no model at all: it is feature hashing
of the text's words and character trigrams (stop words left out; each
feature lands in one of ``dim`` buckets with a sign from the same hash),
which makes texts that share words and word pieces close.
It is deterministic across processes and machines, so embeddings never
need to be stored: the Field recomputes them when it replays the log.

:func:`quantize` turns embeddings into the integer-valued rows the Field
stores and scores with (see its docstring): dot products of such rows are
exact in float32, whatever order a matrix product sums them in, so a
score is the same whether it is computed for one unit, a page of them or
an (agents x events) matrix, live or at replay.

:func:`load_embedder` chooses an embedder by name (config ``embedder``):
``wordllama`` (the server's default) or ``wordllama-<dim>``
(:class:`WordLlamaEmbedder`: a static sentence embedder whose model ships
inside the ``wordllama`` wheel), ``hashing``, ``hashing-<dim>``, or
``sentence-transformers:<model name or local path>``, which loads a
locally installed ``sentence-transformers`` package and model, or
``minilm`` (``minilm-<max tokens>``: :class:`field.ranking.minilm.MiniLMEmbedder`,
all-MiniLM-L6-v2 run in NumPy from the files of an installed wheel).
None of them ever downloads anything.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import re
import zlib
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]

_WORD = re.compile(r"[^\W_]+")
#: weight of a character trigram relative to a whole word
TRIGRAM_WEIGHT = 0.5
#: word -> (bucket, sign) memo; bounded, cleared when full
_MEMO_LIMIT = 1 << 18
#: words that carry no topic: left out of embeddings and of keywords
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was "
    "were will with about into than then there these those our your their not no yes".split()
)
#: width of the default embedder: ATTUNE multiplies every unit's row, so width is latency
#: (at 100,000 units, 128 dimensions cost about 3 ms per full ATTUNE, 256 about 5 ms)
DEFAULT_DIM = 128
#: largest sum of squares a quantized row may reach: float32 holds every integer below it
_EXACT_LIMIT = 1 << 24


class EmbedderError(ValueError):
    """An embedder that cannot be loaded (unknown name, missing package or model)."""


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

    def __init__(self, dim: int = DEFAULT_DIM) -> None:
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
        """All texts at once: one weighted bincount over the features of the batch.

        Every feature weighs +-1 or +-0.5, so the sums are exact in any
        order and a text embeds to the same row alone or in a batch.
        """
        dim, mask = self._dim, self._dim - 1
        memo = self._words
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        word_cells: list[int] = []
        word_signs: list[float] = []
        padded: list[bytes] = []
        for row, text in enumerate(texts):
            words = [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]
            for word in words:
                hashed = memo.get(word)
                if hashed is None:
                    h = zlib.crc32(word.encode())
                    hashed = memo[word] = (h & mask, 1.0 if h & 0x80000000 else -1.0)
                word_cells.append(row * dim + hashed[0])
                word_signs.append(hashed[1])
            padded.append((" " + " ".join(words) + " ").encode() if words else b"")
        cells, signs = self._trigrams(padded)
        counts = np.bincount(
            np.concatenate([np.array(word_cells, dtype=np.intp), cells]),
            weights=np.concatenate([np.array(word_signs, dtype=np.float64), signs]),
            minlength=len(texts) * dim,
        )
        out = counts.reshape(len(texts), dim).astype(np.float32)
        norms = np.sqrt(np.einsum("ij,ij->i", out, out))[:, None]  # exact: sums of quarters
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def _trigrams(
        self, padded: list[bytes]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
        """(cell, sign) of every character trigram of the padded texts, row by row."""
        lengths = np.array([len(p) for p in padded], dtype=np.intp)
        data = np.frombuffer(b"".join(padded), dtype=np.uint8)
        if len(data) < 3:
            return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float64)
        row_of = np.repeat(np.arange(len(padded)), lengths)
        within = np.flatnonzero(row_of[:-2] == row_of[2:])  # trigrams inside one text
        grams = (
            data[within].astype(np.uint32) << 16
            | data[within + 1].astype(np.uint32) << 8
            | data[within + 2].astype(np.uint32)
        )
        mixed = grams * np.uint32(0x9E3779B1)  # Fibonacci hashing, wraps mod 2**32
        mixed ^= mixed >> np.uint32(15)
        buckets = (mixed & np.uint32(self._dim - 1)).astype(np.intp)
        signs = np.where(mixed & np.uint32(0x80000000), TRIGRAM_WEIGHT, -TRIGRAM_WEIGHT)
        return row_of[within] * self._dim + buckets, signs


class SentenceTransformerEmbedder:
    """A locally installed sentence-transformers model (the ``embeddings`` extra).

    Loads with ``local_files_only`` and the Hugging Face hub switched to
    offline mode: a model that is not on this machine is an error, never
    a download.
    """

    #: a sentence model: embedded after the commit (:func:`embeds_after_commit`)
    heavy = True

    def __init__(self, model: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderError(
                f"embedder 'sentence-transformers:{model}' needs the sentence-transformers "
                "package: pip install 'akashik-field[embeddings]'"
            ) from exc
        try:
            self._model: Any = SentenceTransformer(model, device="cpu", local_files_only=True)
        except Exception as exc:  # the loader raises many kinds; all mean "not here"
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise EmbedderError(
                f"cannot load sentence-transformers model {model!r} from local files "
                f"(nothing is downloaded): {reason}"
            ) from exc
        self._name = f"sentence-transformers:{model}"
        self._dim = int(self._model.get_sentence_embedding_dimension())

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=64, convert_to_numpy=True, normalize_embeddings=True
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self._dim)


#: widths the wordllama model was trained to be cut to (Matryoshka) that its wheel can serve:
#: the wheel holds the 256-wide weights, so 512 and 1,024 would need a download
WORDLLAMA_DIMS = (64, 128, 256)
#: the model's files inside the installed wordllama package
_WORDLLAMA_WEIGHTS = ("weights", "l2_supercat_256.safetensors")
_WORDLLAMA_TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")
#: token rows gathered at once when embedding: bounds the temporary (2 MB at 256 dimensions)
_GATHERED = 2048
#: texts up to this many are tokenized one by one on the calling thread: a batch goes to the
#: tokenizer's thread pool, whose hand-off costs more than it saves for a few texts (60 us
#: against 19 for three short ones) and whose threads spin on the other core afterwards
#: (embedding three texts took 268 us, 114 without the pool)
SERIAL_TEXTS = 8
#: pieces of text (words) whose token ids a wordllama embedder keeps, the oldest forgotten
#: first: about 6 MB (290 bytes a piece)
KEPT_PIECES = 20_000
#: longer pieces are not kept (identifiers, numbers, pasted blobs rarely come again)
_KEPT_PIECE_CHARS = 40
#: a word with the spaces before it (:func:`_segments`)
_PIECE = re.compile(r" *[^ ]+")


class WordLlamaEmbedder:
    """The ``l2_supercat`` model that the ``wordllama`` wheel carries (the ``wordllama`` extra).

    A static embedding: a 32,000-token vocabulary (Llama 2's tokenizer)
    with one learned 256-wide vector per token; a text's embedding is the
    normalized sum of its tokens' vectors. Narrower widths keep the
    first ``dim`` coordinates of every token vector (the model was
    trained to be cut to 64 or 128 of them).

    Only the two files inside the installed package are read, by path;
    the package is found, never imported. Its own loader
    (``WordLlama.load``) is not used: it looks for the tokenizer under
    ``wordllama/tokenizer/`` while the wheel keeps it under
    ``tokenizers/``, so it goes to ``~/.cache/wordllama`` and then
    downloads it from Hugging Face; and importing the package configures
    the root logger. Nothing here opens a socket.

    A text with no letter or digit (``""``, ``"!!!"``) embeds to a zero
    row, as with :class:`HashingEmbedder`. Each text's tokens are summed
    on their own, in order, so a text embeds to the same row, bit for
    bit, alone or in a batch.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim not in WORDLLAMA_DIMS:
            widths = ", ".join(map(str, WORDLLAMA_DIMS))
            raise EmbedderError(f"embedder 'wordllama-{dim}': the width must be one of {widths}")
        try:
            spec = importlib.util.find_spec("wordllama")  # found, not imported
            from safetensors import safe_open
            from tokenizers import Tokenizer
        except ImportError:
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise EmbedderError(
                "embedder 'wordllama' needs the wordllama package: "
                "pip install 'akashik-field[wordllama]'"
            )
        root = Path(next(iter(spec.submodule_search_locations)))
        weights = root.joinpath(*_WORDLLAMA_WEIGHTS)
        tokenizer = root.joinpath(*_WORDLLAMA_TOKENIZER)
        try:
            self._tokenizer: Any = Tokenizer.from_file(str(tokenizer))
            with safe_open(str(weights), framework="np") as tensors:
                table = tensors.get_tensor("embedding.weight")
        except Exception as exc:  # missing or unreadable files, whatever the library raises
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise EmbedderError(
                f"cannot load the wordllama model from {root} (nothing is downloaded): {reason}"
            ) from exc
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # the same ids without each token's offsets, which nothing here reads (a third
        # less time; tokenizers 0.20.2 and later)
        self._encode_batch = getattr(
            self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch
        )
        # The tokenizer has no pre-tokenizer, so its BPE cache is keyed by whole texts: it
        # would keep the last 10,000 contents (about 100 MB) for texts that rarely come again,
        # and filling it costs more time than it saves.
        resize_cache = getattr(self._tokenizer.model, "_resize_cache", None)
        if resize_cache is not None:
            resize_cache(0)
        #: one row per token of the vocabulary, float32 (stored as float16: exact), and a
        #: last row of -0.0 that pads a short text among longer ones: x + -0.0 is x exactly
        self._table = np.empty((len(table) + 1, dim), dtype=np.float32)
        self._table[:-1] = table[:, :dim]
        self._table[-1] = -0.0
        self._dim = dim
        #: a piece of text's token ids (:meth:`_token_ids`), oldest first
        self._pieces: dict[str, list[int]] = {}

    @property
    def name(self) -> str:
        return f"wordllama-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        kept = [row for row, text in enumerate(texts) if _WORD.search(text)]
        if not kept:
            return out
        sums = self._sums(self._token_ids([texts[row] for row in kept]))
        norms = np.sqrt(np.einsum("ij,ij->i", sums, sums))[:, None]
        np.divide(sums, norms, out=sums, where=norms > 0)
        out[kept] = sums
        return out

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        """The tokenizer's ids of each text, made from its words' ids.

        The tokenizer turns every space into ``▁`` and puts one before the
        text, and no token holds a ``▁`` after its first character but
        the runs of ``▁`` alone: no merge joins a character to the ``▁``
        after it, so a text's tokens are those of its pieces (each word
        with the spaces before it, :func:`_segments`) one after the other.
        A piece's ids are kept (up to :data:`KEPT_PIECES` pieces of at most
        :data:`_KEPT_PIECE_CHARS` characters); the others are tokenized
        together, a few one by one, more by the tokenizer's pool. A text
        that ends with a space, or holds a ``▁``, is tokenized whole.
        """
        kept = self._pieces
        pieces = [_segments(text) or [text] for text in texts]
        ids_of: dict[str, list[int]] = {}
        new: list[str] = []
        for found in pieces:
            for piece in found:
                if piece not in ids_of:
                    ids = kept.get(piece)
                    if ids is None:
                        new.append(piece)
                        ids = []  # (made below)
                    ids_of[piece] = ids
        for piece, ids in zip(new, self._tokenize(new), strict=True):
            ids_of[piece] = ids
            if len(piece) <= _KEPT_PIECE_CHARS:
                if len(kept) >= KEPT_PIECES:  # the oldest goes
                    with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                        del kept[next(iter(kept))]
                kept[piece] = ids
        return [list(chain.from_iterable(ids_of[piece] for piece in found)) for found in pieces]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if len(texts) <= SERIAL_TEXTS:
            encode = self._tokenizer.encode
            return [encode(text, add_special_tokens=False).ids for text in texts]
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]

    def _sums(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        """Each text's token rows summed in order, first to last, apart from the others
        (so batching changes nothing, to the bit).

        Texts of like length, longest first, are padded with the -0.0 row into one
        (texts x tokens x dim) gather of at most :data:`_GATHERED` rows (or one longer
        text) and summed down the token axis: NumPy adds a non-inner axis row after
        row, in order. (``np.add.reduceat`` over the texts' rows sums in its own
        order, in blocks, and took 7 times as long for a batch of 128 short texts.)
        """
        # (never empty: each text has a word)
        lengths = np.fromiter(map(len, ids), dtype=np.intp, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=np.intp, count=int(lengths.sum()))
        starts = np.cumsum(lengths) - lengths
        order = np.argsort(-lengths, kind="stable")
        pad = len(self._table) - 1
        sums = np.empty((len(ids), self._dim), dtype=np.float32)
        first = 0
        while first < len(order):
            width = int(lengths[order[first]])  # the longest text left
            texts = order[first : first + max(1, _GATHERED // width)]
            steps = np.arange(width)
            inside = steps < lengths[texts][:, None]
            at = np.minimum(starts[texts][:, None] + steps, len(tokens) - 1)
            rows = np.where(inside, tokens[at], pad)
            sums[texts] = np.add.reduce(self._table[rows], axis=1)
            first += len(texts)
        return sums


def _segments(text: str) -> list[str] | None:
    """What the wordllama tokenizer may tokenize apart for ``text``: each word with the
    spaces before it, less the one its ``▁`` stands for ("a  b c": "a", " b", "c"; the
    first piece keeps its own, the tokenizer puts a ``▁`` before it as before the
    text); None for a text that ends with a space (its last ``▁`` has no word) or that
    holds a ``▁`` of its own (it would join the next space's)."""
    if not text or text.endswith(" ") or "\u2581" in text:
        return None
    found = _PIECE.findall(text)
    return [found[0], *(piece[1:] for piece in found[1:])] if found else None


def embeds_after_commit(embedder: Embedder) -> bool:
    """Whether the server embeds units with ``embedder`` after their commit, off its
    event loop (a sentence model, ``heavy``: milliseconds per text), rather than when
    they are first read (the static embedders: microseconds per text)."""
    return bool(getattr(embedder, "heavy", False))


def default_embedder() -> Embedder:
    """The embedder of a Field made without one: hashing, which needs no model (the
    server's default is ``wordllama``: config ``embedder``)."""
    return HashingEmbedder()


@functools.cache
def _wordllama(dim: int) -> WordLlamaEmbedder:
    """One model per width and process: it holds no state but its read-only table (a few
    MB), so every Field of a process (tests, ``field serve`` and its snapshots) shares it."""
    return WordLlamaEmbedder(dim)


def load_embedder(spec: str) -> Embedder:
    """The embedder named ``spec`` (config ``embedder``); EmbedderError if unavailable."""
    kind, _, argument = spec.partition(":")
    if spec == "hashing":
        return HashingEmbedder()
    if spec.startswith("hashing-") and spec[8:].isdigit():
        try:
            return HashingEmbedder(int(spec[8:]))
        except ValueError as exc:
            raise EmbedderError(f"embedder {spec!r}: {exc}") from exc
    if spec == "wordllama":
        return _wordllama(256)
    if spec.startswith("wordllama-") and spec[10:].isdigit():
        return _wordllama(int(spec[10:]))
    if kind == "sentence-transformers" and argument:
        return SentenceTransformerEmbedder(argument)
    if spec == "minilm" or (spec.startswith("minilm-") and spec[7:].isdigit()):
        from .minilm import MAX_TOKENS, MiniLMEmbedder  # NumPy transformer: loaded on demand

        return MiniLMEmbedder(max_tokens=int(spec[7:]) if spec[7:] else MAX_TOKENS)
    raise EmbedderError(
        f"unknown embedder {spec!r}: use 'hashing', 'hashing-<dim>', 'wordllama', "
        f"'wordllama-<{'|'.join(map(str, WORDLLAMA_DIMS))}>', "
        "'sentence-transformers:<model or path>', 'minilm' or 'minilm-<max tokens>'"
    )


# -- stored form ---------------------------------------------------------------


def quantize_scale(dim: int) -> int:
    """The largest coordinate of a quantized row: 127, less for very long rows."""
    return min(127, math.isqrt(_EXACT_LIMIT // dim))


def quantize(vectors: Vectors) -> tuple[Vectors, npt.NDArray[np.float64]]:
    """Integer-valued rows and their squared norms.

    Each row is scaled so that its largest coordinate is
    :func:`quantize_scale` (127 up to 1,040 dimensions) and rounded to
    integers: 8 bits of precision per coordinate, stored as float32 so
    BLAS multiplies them. Every product and partial sum of two such rows
    is an integer below 2**24, exact in float32, so their dot product is
    exact. Cosine similarity is ``dot / sqrt(sq_a * sq_b)``
    (:func:`cosine`); a zero row (a text with no features) has ``sq = 0``.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    peak = np.abs(vectors).max(axis=1, keepdims=True) if vectors.size else vectors[:, :1]
    scale = np.zeros_like(peak)
    np.divide(np.float32(quantize_scale(vectors.shape[1])), peak, out=scale, where=peak > 0)
    rows: Vectors = np.rint(vectors * scale).astype(np.float32)
    squares = np.einsum("ij,ij->i", rows, rows, dtype=np.float64)
    return rows, squares


def cosine(dots: Any, squares_a: Any, squares_b: Any) -> npt.NDArray[np.float64]:
    """Cosine similarity from exact dot products and squared norms (0 where a row is zero)."""
    dots = np.asarray(dots, dtype=np.float64)
    product = np.asarray(squares_a, dtype=np.float64) * np.asarray(squares_b, dtype=np.float64)
    result = np.zeros(np.broadcast_shapes(dots.shape, product.shape), dtype=np.float64)
    np.divide(dots, np.sqrt(product), out=result, where=product > 0)
    return result
