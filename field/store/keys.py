"""The server's key file: the key that seals webhook secrets in the log.

The key is 32 random bytes written as one line of standard base64 in a file
of its own, readable by the server's user alone (0600). It lives beside the
log but never in it: a copy of the log (a backup, a replica) holds only
sealed secrets (:class:`field.core.secrets.SecretBox`), which are useless
without this file. Losing the file loses the webhook secrets (subscribers
must be given new ones); it does not lose any memory or notification.

The file is created once, with ``O_EXCL`` so two processes cannot both
create it, and read on every start. Errors name the file but never show its
content.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from field.contract.errors import OperationalError

#: Bytes of the key.
KEY_BYTES = 32
#: The most a key file is read of: a valid one is 45 bytes; more is not a key file.
_MAX_FILE_BYTES = 1024


def load_or_create_key(path: Path) -> bytes:
    """The 32-byte key kept base64 in ``path``, created (0600, parent directory too) if missing.

    Raises :class:`~field.contract.errors.OperationalError` naming the file if it cannot be
    read or created, or does not hold exactly one valid key.
    """
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    key = os.urandom(KEY_BYTES)
    try:
        _create(path, base64.b64encode(key) + b"\n")
    except FileExistsError:  # another process created it since we looked, or a broken link
        try:
            return _read_key(path)
        except FileNotFoundError:
            raise _failure(path, "is a broken link: it cannot be read or created") from None
    return key


def _failure(path: Path, problem: str) -> OperationalError:
    return OperationalError(
        f"the key file {path} {problem}",
        suggested_action=(
            "Restore the key file from a backup, or move it away to have a new key made "
            "(webhook secrets sealed with the old key must then be issued again)."
        ),
    )


def _read_key(path: Path) -> bytes:
    """The key in ``path``; FileNotFoundError if there is no file."""
    try:
        # O_NONBLOCK: a FIFO at this path must not hang the start-up
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _failure(path, f"cannot be read: {exc.strerror or 'error'}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _failure(path, "is not a regular file")
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _failure(path, f"cannot be read: {exc.strerror or 'error'}") from None
    finally:
        os.close(fd)
    return _parse(path, data)


def _parse(path: Path, data: bytes) -> bytes:
    """The key written in ``data``: one line of base64 of exactly 32 bytes."""
    problem = f"does not hold one base64 key of {KEY_BYTES} bytes"
    if len(data) > _MAX_FILE_BYTES:
        raise _failure(path, problem)
    try:
        key = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _failure(path, problem) from None
    if len(key) != KEY_BYTES:
        raise _failure(path, problem)
    return key


def _create(path: Path, content: bytes) -> None:
    """Write ``content`` to a new file at ``path`` (0600); FileExistsError if there is one."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise _failure(path, f"cannot be created: {exc.strerror or 'error'}") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise
    except OSError as exc:
        raise _failure(path, f"cannot be created: {exc.strerror or 'error'}") from None
    try:
        os.fchmod(fd, 0o600)  # the mode exactly, whatever the umask
        written = 0
        while written < len(content):
            written += os.write(fd, content[written:])
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)  # a half-written key file would refuse the next start
        raise _failure(path, f"cannot be written: {exc.strerror or 'error'}") from None
    os.close(fd)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make the new file's directory entry durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
