"""Snapshots of the Field's state: the projection of the log up to a position, as bytes.

Start-up folds the whole log into a :class:`~field.core.state.FieldState`.
A snapshot holds that state as of one log position, so that start-up can
read it and fold only the entries after it. This module turns a state into
the bytes of a snapshot and back, and checks them; it does no I/O (where
snapshots are kept: :mod:`field.store.snapshot_store`; how one is written
beside a running server: :mod:`field.engine.snapshotter`).

Layout of a snapshot::

    "FIELDSNP" | header length (u32) | header (JSON) | body | body length (u64) | sha256

integers big-endian; the sha256 covers every byte before it. The header
says what the snapshot is (:class:`Header`): its format, the Field and the
log position it is of, when it was written, the *fingerprint* of what
determines the projection besides the log (the code that folds entries,
the embedder and its width: see :func:`field.engine.snapshotter.fingerprint`), and
the *anchor*, the entry at its position, by which a log that was replaced
or rewound under the snapshot is recognized. The body is the state in
pickle's protocol 5, as :class:`_Pickler` writes it: without the reader's
configuration (embedder, limits), columns without their spare room, the
embeddings as int8 (they are small integers: a quarter of their size).

Nothing in a snapshot is trusted before it is checked, in this order
(:func:`decode`): the digest over the whole of it (so a truncated or
corrupted one is refused before anything is parsed), the format (a newer
one is refused), the fingerprint, and, by the caller, the Field id, the
position (not past the log's end) and the anchor. Only then is the body
read, by an unpickler that admits the classes of :data:`ALLOWED` alone,
never an arbitrary callable.

What the state holds only to answer faster, or for readers that may never
come, is left out or made smaller first (:func:`compact`): the cancelled
subscriptions' rows in the matcher's registry, empty per-agent sets, the
allow lists' cached prefixes. The state read back answers every read and
folds every later entry as the state it was made from does
(``tests/test_snapshot.py`` checks it on random histories).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ..contract.errors import OperationalError
from ..contract.model import Limits, StoredEntry
from ..ranking.embedding import Embedder
from ..ranking.relevance import Column, Matrix, UnitIndex, weights_for
from .sources import Source, compiled
from .state import FieldState

#: The layout of the header and of the body; a snapshot of a newer format is refused.
FORMAT = 1
MAGIC = b"FIELDSNP"
_PREFIX = struct.Struct(">8sI")
_TRAILER = struct.Struct(">Q32s")
#: Largest header accepted (it is a few hundred bytes).
MAX_HEADER_BYTES = 1 << 16
#: Bytes of the body handed to the writer at a time.
CHUNK_BYTES = 8 << 20


class UnusableSnapshot(OperationalError):
    """A snapshot that is not read: damaged, of another Field or configuration, too new,
    or ahead of the log. Start-up warns and replays the log instead."""


@dataclass(frozen=True, slots=True)
class Header:
    """What a snapshot is of (see the module docstring)."""

    format: int
    field_id: str
    #: the log position the state is of: the entries up to it are folded in
    position: int
    #: seconds since the epoch
    written_at: float
    fingerprint: str
    #: the entry at ``position``: ``{epoch, kind, ts, digest}`` (see :func:`anchor_of`)
    anchor: dict[str, Any]
    #: memory units in the state (for reports)
    units: int

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "format": self.format,
                "field_id": self.field_id,
                "position": self.position,
                "written_at": self.written_at,
                "fingerprint": self.fingerprint,
                "anchor": self.anchor,
                "units": self.units,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Header:
        try:
            body = orjson.loads(raw)
            return cls(
                format=_integer(body["format"]),
                field_id=_text(body["field_id"]),
                position=_integer(body["position"]),
                written_at=float(body["written_at"]),
                fingerprint=_text(body["fingerprint"]),
                anchor=dict(body["anchor"]),
                units=_integer(body["units"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise UnusableSnapshot(f"its header cannot be read ({exc})") from None


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is no count")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is no string")
    return value


def anchor_of(entry: StoredEntry) -> dict[str, Any]:
    """What identifies the entry at a snapshot's position: epoch, kind, time and a digest
    of its data (as the log stores it, orjson's encoding)."""
    return {
        "epoch": entry.epoch,
        "kind": entry.kind,
        "ts": entry.ts,
        "digest": hashlib.sha256(orjson.dumps(entry.data)).hexdigest(),
    }


# -- making the state smaller ---------------------------------------------------------


def compact(state: FieldState) -> None:
    """Leave out of ``state`` what a snapshot need not hold (module docstring), in place.

    Every read answers the same after it, and every later entry folds the
    same; it is run on a state about to be encoded, which nothing else uses.
    """
    state.registry.compact({(a.id, a.registered_epoch) for a in state.agents.values()})
    for index in (
        state.active_subscriptions,
        state.open_tasks_by_agent,
        state.sessions_by_member,
        state.invitations,
    ):
        for agent_id in [a for a, ids in index.items() if not ids]:
            del index[agent_id]
    for found in state.allow_lists.lists.values():
        found.maps.clear()  # caches of prefixes, made again as filters read them


# -- encoding -----------------------------------------------------------------------


def encode(state: FieldState, header: Header, sink: Callable[[bytes], object]) -> None:
    """Write the bytes of a snapshot of ``state`` to ``sink``, in pieces of at most
    :data:`CHUNK_BYTES` as they are made (the whole body is never held in memory)."""
    state.index.flush()  # a snapshot holds every vector
    head = header.to_json()
    digest = hashlib.sha256()
    prefix = _PREFIX.pack(MAGIC, len(head)) + head
    digest.update(prefix)
    sink(prefix)
    body = _Chunks(digest, sink)
    _Pickler(body, state).dump(state)
    body.flush_rest()
    trailer = struct.pack(">Q", body.size)
    digest.update(trailer)
    sink(trailer + digest.digest())


def encoded(state: FieldState, header: Header) -> bytes:
    """The bytes of a snapshot of ``state``, whole (for tests and small states)."""
    pieces: list[bytes] = []
    encode(state, header, pieces.append)
    return b"".join(pieces)


class _Chunks(io.RawIOBase):
    """The file the pickler writes to: hashes what it is given and passes it on to the
    sink in chunks of :data:`CHUNK_BYTES`."""

    def __init__(self, digest: Any, sink: Callable[[bytes], object]) -> None:
        self._digest = digest
        self._sink = sink
        self._buffer = bytearray()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._digest.update(view)
        self._buffer += view
        self.size += len(view)
        whole = len(self._buffer) - len(self._buffer) % CHUNK_BYTES
        if whole:  # one write may be large (an array): pass it on in chunks too
            buffered = memoryview(self._buffer)
            for start in range(0, whole, CHUNK_BYTES):
                self._sink(bytes(buffered[start : start + CHUNK_BYTES]))
            buffered.release()
            del self._buffer[:whole]
        return len(view)

    def flush_rest(self) -> None:
        if self._buffer:
            self._sink(bytes(self._buffer))
            self._buffer.clear()


class _Pickler(pickle.Pickler):
    """Pickles a state with its configuration left out and its columns trimmed.

    The embedder and the limits are the server's, not the state's: they are
    written as references that the reader replaces with its own. A column
    is written without its spare capacity; quantized vectors (small
    integers) as int8, a quarter of their float32 size; a source as its
    definition (its filter and templates are compiled again when read).
    """

    def __init__(self, file: Any, state: FieldState) -> None:
        super().__init__(file, protocol=5)
        self._embedder = state.index.embedder
        self._limits = state.limits

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._embedder:
            return _configured_embedder, ()
        if obj is self._limits:
            return _configured_limits, ()
        kind = type(obj)
        if kind is Column:
            return _column, (obj.view,)
        if kind is Matrix:
            rows = obj.view
            small = rows.astype(np.int8)
            if np.array_equal(small, rows):
                return _small_matrix, (small, rows.shape[1])
            return _matrix, (rows.copy(), rows.shape[1])
        if kind is Source:
            return _source, (obj.definition, obj.deliveries, obj.accepted)
        if kind is UnitIndex:
            left_out = ("rows", "weights", "deferred", "_batch")
            kept = {k: v for k, v in vars(obj).items() if k not in left_out}
            return _unit_index, (kept,)
        return NotImplemented


def _configured_embedder() -> Embedder:  # pragma: no cover - replaced when read
    raise UnusableSnapshot("the embedder is the reader's")


def _configured_limits() -> Limits:  # pragma: no cover - replaced when read
    raise UnusableSnapshot("the limits are the reader's")


def _column(values: Any) -> Column:
    return Column.of(values)


def _matrix(rows: Any, width: int) -> Matrix:
    return Matrix.of(rows.reshape(-1, width), width)


def _small_matrix(rows: Any, width: int) -> Matrix:
    return Matrix.of(rows.reshape(-1, width), width)  # int8 to float32 as it is copied


def _unit_index(state: dict[str, Any]) -> UnitIndex:
    """A unit index from its attributes; ``rows`` (id -> row) is made again from ``ids``,
    the weights are those of the reader's embedder, and it embeds as it is read."""
    index = UnitIndex.__new__(UnitIndex)
    index.__dict__.update(state)
    index.rows = dict(zip(index.ids, range(len(index.ids)), strict=True))
    index.weights = weights_for(index.embedder)
    index.deferred = False  # the reader's process decides
    return index


def _source(definition: dict[str, Any], deliveries: Any, accepted: int) -> Source:
    source = compiled(definition)
    source.deliveries, source.accepted = deliveries, accepted
    return source


# -- decoding -----------------------------------------------------------------------


def read_header(prefix: bytes) -> Header:
    """The header of a snapshot whose first bytes are ``prefix`` (enough of them: see
    :func:`header_size`); the digest is not checked: for listings, never for loading."""
    magic, size = _prefix(prefix)
    if len(prefix) < _PREFIX.size + size:
        raise UnusableSnapshot("it is shorter than its header")
    return Header.from_json(prefix[_PREFIX.size : _PREFIX.size + size])


def header_size(prefix: bytes) -> int:
    """How many bytes from the start hold the header (``prefix``: the first 12 at least)."""
    return _PREFIX.size + _prefix(prefix)[1]


def _prefix(data: bytes) -> tuple[bytes, int]:
    if len(data) < _PREFIX.size:
        raise UnusableSnapshot("it is shorter than a snapshot's first bytes")
    magic, size = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise UnusableSnapshot("it does not begin as a snapshot does")
    if size > MAX_HEADER_BYTES:
        raise UnusableSnapshot(f"its header claims {size} bytes")
    return magic, size


def verify(data: bytes | bytearray | memoryview, fingerprint: str) -> Header:
    """The header of the snapshot ``data``, once its digest, format and fingerprint are
    checked; raises :class:`UnusableSnapshot` saying what is wrong."""
    view = memoryview(data)
    _, size = _prefix(bytes(view[: _PREFIX.size]))
    if len(view) < _PREFIX.size + size + _TRAILER.size:
        raise UnusableSnapshot(f"it is truncated ({len(view)} bytes)")
    body_size, digest = _TRAILER.unpack_from(view, len(view) - _TRAILER.size)
    if hashlib.sha256(view[: len(view) - 32]).digest() != digest:
        raise UnusableSnapshot("its checksum does not match: it is damaged or truncated")
    if _PREFIX.size + size + body_size + _TRAILER.size != len(view):
        raise UnusableSnapshot("its body's length does not add up")
    header = Header.from_json(bytes(view[_PREFIX.size : _PREFIX.size + size]))
    if header.format > FORMAT:
        raise UnusableSnapshot(f"it has format {header.format}, newer than this server's {FORMAT}")
    if header.format != FORMAT:
        raise UnusableSnapshot(f"it has format {header.format}; this server reads {FORMAT}")
    if header.fingerprint != fingerprint:
        raise UnusableSnapshot(
            "it was made by another projection (another version of the server, or another "
            "embedder or width)"
        )
    return header


def decode(
    data: bytes | bytearray | memoryview,
    fingerprint: str,
    *,
    limits: Limits,
    embedder: Embedder,
    expect: Callable[[Header], None] | None = None,
) -> tuple[Header, FieldState]:
    """The header and state of the snapshot ``data``, checked as :func:`verify` does and
    then by ``expect`` (which raises :class:`UnusableSnapshot` for a header that does not
    fit the log: see :func:`field.engine.snapshotter.restore`) before the body is read; the state
    gets ``limits`` and ``embedder``, the reader's configuration."""
    header = verify(data, fingerprint)
    if expect is not None:
        expect(header)
    # the body is read in place: the pickle ends with its STOP before the trailer, and
    # the digest vouched for every byte
    file = _Reader(data, header_size(bytes(data[: _PREFIX.size])))
    try:
        state = _Unpickler(file, limits=limits, embedder=embedder).load()
    except UnusableSnapshot:
        raise
    except Exception as exc:  # a body the digest vouched for, but this code cannot read
        raise UnusableSnapshot(f"its body cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, FieldState):
        raise UnusableSnapshot(f"its body holds a {type(state).__name__}, not a state")
    state.clock.max_skew = limits.max_epoch_skew
    state.clock.rate = limits.max_epoch_rate
    return header, state


class _Reader:
    """A file over the bytes of a snapshot, from ``start``, for the unpickler: each read
    copies what it returns, never the whole (which may be most of a gigabyte)."""

    def __init__(self, data: bytes | bytearray | memoryview, start: int) -> None:
        self._data = data if isinstance(data, bytes | bytearray) else bytes(data)
        self._view = memoryview(self._data)
        self._at = start

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(len(self._view), self._at + size)
        chunk = bytes(self._view[self._at : end])
        self._at = end
        return chunk

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = min(len(target), len(self._view) - self._at)
        target[:count] = self._view[self._at : self._at + count]
        self._at += count
        return count

    def readline(self) -> bytes:
        end = self._data.find(b"\n", self._at)
        return self.read(-1 if end < 0 else end + 1 - self._at)


#: What a snapshot's body may name, by module: every class the state is made of, and
#: the functions of this module that rebuild what :class:`_Pickler` wrote its own way.
ALLOWED: dict[str, frozenset[str]] = {
    "collections": frozenset({"Counter", "ChainMap", "OrderedDict"}),
    "numpy": frozenset({"dtype", "ndarray"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.numeric": frozenset({"_frombuffer"}),
    "field.core.snapshot": frozenset(
        {"_column", "_matrix", "_small_matrix", "_source", "_unit_index"}
    ),
    "field.core.state": frozenset({"FieldState", "AgentRecord"}),
    "field.contract.clock": frozenset({"LamportClock"}),
    "field.ranking.relevance": frozenset({"Interner", "KeywordRows"}),
    "field.ranking.calibration": frozenset({"Calibration"}),
    "field.ranking.learning": frozenset({"Judged"}),
    "field.core.units": frozenset({"Units"}),
    "field.core.pages": frozenset({"Order"}),
    "field.core.visibility": frozenset({"Membership"}),
    "field.core.entities": frozenset({"EntityIndex"}),
    "field.subscriptions.allow_lists": frozenset({"AllowLists", "_List"}),
    "field.core.registration": frozenset({"Tokens", "RegistrationToken"}),
    "field.core.sources": frozenset({"Deliveries"}),
    "field.subscriptions.registry": frozenset({"SubscriptionRegistry"}),
}


class _Unpickler(pickle.Unpickler):
    """Reads a body, admitting only :data:`ALLOWED`; the configuration is the reader's."""

    def __init__(self, file: Any, *, limits: Limits, embedder: Embedder) -> None:
        super().__init__(file)
        self._configured = {
            "_configured_embedder": lambda: embedder,
            "_configured_limits": lambda: limits,
        }

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name in self._configured:
            return self._configured[name]
        if name not in ALLOWED.get(module, ()):
            raise UnusableSnapshot(f"its body names {module}.{name}, which a state never holds")
        return super().find_class(module, name)


__all__ = [
    "FORMAT",
    "Header",
    "UnusableSnapshot",
    "anchor_of",
    "compact",
    "decode",
    "encode",
    "encoded",
    "read_header",
    "verify",
]
