"""Where an agent's token is kept between runs: :class:`TokenStore`, and :class:`TokenFile`.

The Field shows a token once, in the REGISTER response, and keeps only its
hash: a token that is lost leaves its agent id taken for good (a REGISTER of
it is ``409 AGENT_ID_TAKEN``). :meth:`FieldClient.connect` therefore keeps
the token where the caller says, and uses it again on the next run instead of
registering. A store holds one agent's token on one Field:

.. code-block:: json

    {"agent_id": "researcher-01", "token": "...", "field_id": "field-...", "url": "http://..."}

:class:`TokenFile` writes that to a file readable by its owner alone (0600),
atomically (a whole new file, renamed over the old one), so that a crash
never leaves half a token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

logger = logging.getLogger("field.client")

#: Bound on a token file read (a kept token is a few hundred bytes).
MAX_TOKEN_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class StoredToken:
    """A token kept for ``agent_id``; ``field_id`` and ``url`` say where it was issued."""

    agent_id: str
    token: str
    field_id: str | None = None
    url: str | None = None

    def __repr__(self) -> str:  # never show the token
        return f"StoredToken({self.agent_id!r}, field_id={self.field_id!r}, url={self.url!r})"


class TokenStore(Protocol):
    """Keeps one agent's token between runs (see :class:`TokenFile`)."""

    def load(self) -> StoredToken | None:
        """The kept token, or ``None`` when none is kept yet."""
        ...

    def save(self, stored: StoredToken) -> None:
        """Keep ``stored`` (replacing what was kept) durably, readable by this user only."""
        ...

    def describe(self) -> str:
        """Where the token is kept, for messages (never the token)."""
        ...


class TokenFile:
    """A :class:`TokenStore` in one JSON file, written 0600 and atomically."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return str(self.path)

    def load(self) -> StoredToken | None:
        try:
            with self.path.open("rb") as file:
                mode = os.fstat(file.fileno()).st_mode
                raw = file.read(MAX_TOKEN_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(raw) > MAX_TOKEN_FILE_BYTES:
            raise ValueError(f"{self.path} is not a token file: over {MAX_TOKEN_FILE_BYTES} bytes")
        if stat.S_IMODE(mode) & 0o077:
            logger.warning(
                "%s can be read by others (mode %o): chmod 600 it", self.path, stat.S_IMODE(mode)
            )
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise ValueError(f"{self.path} is not a token file: {error}") from None
        if not (
            isinstance(data, dict)
            and isinstance(data.get("agent_id"), str)
            and isinstance(data.get("token"), str)
        ):
            raise ValueError(f"{self.path} is not a token file: no agent_id and token")
        return StoredToken(
            data["agent_id"],
            data["token"],
            _string_or_none(data.get("field_id")),
            _string_or_none(data.get("url")),
        )

    def save(self, stored: StoredToken) -> None:
        body = orjson.dumps(
            {
                "agent_id": stored.agent_id,
                "token": stored.token,
                "field_id": stored.field_id,
                "url": stored.url,
            },
            option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE,
        )
        write_private(self.path, body, durable=True)


def _string_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def write_private(path: Path, body: bytes, *, durable: bool) -> None:
    """Replace ``path`` with ``body`` whole: a new file (mode 0600, whatever the umask)
    renamed over it, so a reader sees the old content or the new, never half. ``durable``
    also syncs the file and its directory before and after the rename."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb", opener=_private_opener) as file:
            os.fchmod(file.fileno(), 0o600)  # the file may have been left there, wider
            file.write(body)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    if durable:
        _fsync_directory(directory)


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); a platform without directory handles skips it."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
