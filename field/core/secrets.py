"""Webhook secrets: making them, signing with them, and sealing them for the log.

A webhook secret is written ``whsec_<base64 key>``, as Standard Webhooks
writes it. Every delivery carries two signatures so that a receiver can check
it with the library it already has:

* Standard Webhooks: ``webhook-id`` (the same on every retry of a message,
  the receiver's dedupe key), ``webhook-timestamp`` (integer seconds) and
  ``webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}." + body)>``
  where ``key`` is the decoded base64 of the secret;
* GitHub style: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``
  keyed by the whole secret string (``whsec_`` included) as UTF-8, which is
  what a GitHub-style receiver configured with that string computes.

The log is the Field's source of truth and is read by backups and replicas,
so it never holds a secret the Field can sign with: a subscription's secret
is stored sealed by :class:`SecretBox` (AES-256-GCM under the server's key,
kept outside the log in a file of its own, :mod:`field.store.keys`), with the
subscription id as associated data, so a sealed secret copied onto another
subscription does not open.

No function here repeats a secret, a key or a sealed value in an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The prefix of a webhook secret.
SECRET_PREFIX = "whsec_"
#: Bytes of key in a secret :func:`new_secret` makes, and the bounds :func:`secret_key`
#: accepts (Standard Webhooks asks for 24 to 64).
SECRET_BYTES = 32
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
#: Bytes of a :class:`SecretBox` key (AES-256).
BOX_KEY_BYTES = 32
#: The format marker of a sealed secret.
SEALED_PREFIX = "v1."

_NONCE_BYTES = 12  # 96 bits, the nonce size GCM is designed for
_TAG_BYTES = 16
#: Base64 text that can hold at most MAX_SECRET_BYTES (checked before decoding).
_MAX_SECRET_CHARS = len(SECRET_PREFIX) + 4 * ((MAX_SECRET_BYTES + 2) // 3)
_URLSAFE_BASE64 = re.compile(r"[A-Za-z0-9_-]*={0,2}")
#: A webhook-id: visible ASCII without spaces or commas, so it is a safe header value.
_MESSAGE_ID = re.compile(r"[!-+\--~]{1,256}")


def new_secret(random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> str:
    """A new webhook secret: ``"whsec_"`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(random_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (Standard Webhooks).

    Raises ValueError with a reason (never the secret) unless ``secret`` is
    ``"whsec_"`` followed by valid, padded standard base64 of 24 to 64 bytes.
    """
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r}")
    if len(secret) > _MAX_SECRET_CHARS:
        raise ValueError(f"a webhook secret holds at most {MAX_SECRET_BYTES} bytes of key")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"a webhook secret is {SECRET_PREFIX!r} followed by standard, padded base64"
        ) from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"a webhook secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes of key"
        )
    return key


def signature_headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The signature headers of one delivery of ``body``.

    ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``
    (``v1,<base64 HMAC-SHA256(key, f"{id}.{timestamp}." + body)>``) and
    ``X-Hub-Signature-256`` (``sha256=<hex HMAC-SHA256(secret as UTF-8, body)>``).
    Raises ValueError for a bad secret (see :func:`secret_key`), a ``message_id`` that
    is not 1 to 256 visible ASCII characters without commas, or a negative timestamp.
    """
    key = secret_key(secret)
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        raise ValueError("a webhook-id is 1 to 256 visible ASCII characters, no comma")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("a webhook-timestamp is a non-negative integer of seconds")
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_signature(key, message_id, timestamp, body).decode(),
        "X-Hub-Signature-256": hub_signature(secret.encode("utf-8"), body).decode(),
    }


def standard_signature(key: bytes, message_id: str, timestamp: int | str, body: bytes) -> bytes:
    """Standard Webhooks: ``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}." + body)>``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return b"v1," + base64.b64encode(hmac.digest(key, signed, hashlib.sha256))


def hub_signature(key: bytes, body: bytes) -> bytes:
    """GitHub's ``X-Hub-Signature-256``: ``sha256=<hex HMAC-SHA256(key, body)>``."""
    return b"sha256=" + hmac.digest(key, body, hashlib.sha256).hex().encode()


class SecretBox:
    """Seals webhook secrets for the log.

    AES-256-GCM under the server's 32-byte key; a random 96-bit nonce per seal
    (at 2^32 seals under one key the chance of a repeated nonce is still below
    2^-32); ``context`` (the subscription id) as associated data, so a sealed
    value opens only for the subscription it was sealed for. A sealed value is
    ``"v1."`` + URL-safe base64 of nonce, ciphertext and tag.
    """

    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != BOX_KEY_BYTES:
            raise ValueError(f"a secret box key is {BOX_KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    def seal(self, secret: str, *, context: str) -> str:
        """``secret`` encrypted and authenticated, bound to ``context``."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, secret.encode("utf-8"), context.encode("utf-8"))
        return SEALED_PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open(self, sealed: str, *, context: str) -> str:
        """The secret :meth:`seal` sealed for ``context``.

        Raises ValueError if ``sealed`` is not a sealed value, was altered, or was
        sealed under another key or for another context.
        """
        if not isinstance(sealed, str) or not sealed.startswith(SEALED_PREFIX):
            raise ValueError(f"a sealed secret starts with {SEALED_PREFIX!r}")
        text = sealed[len(SEALED_PREFIX) :]
        not_base64 = ValueError("a sealed secret is URL-safe base64")
        if not _URLSAFE_BASE64.fullmatch(text):
            raise not_base64
        try:
            raw = base64.urlsafe_b64decode(text)
        except binascii.Error:
            raise not_base64 from None
        if len(raw) < _NONCE_BYTES + _TAG_BYTES:
            raise ValueError("the sealed secret is too short")
        nonce, ciphertext = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        try:
            plain = self._aead.decrypt(nonce, ciphertext, context.encode("utf-8"))
        except InvalidTag:
            raise ValueError(
                "the sealed secret does not open: another key, another context, or altered"
            ) from None
        return plain.decode("utf-8")
