"""Webhook secrets, signatures, sealed secrets and the server's key file.

Signatures are checked by a receiver's code, not by ours: the Standard
Webhooks verifier (``standardwebhooks``) and an independent GitHub-style
check written here with :mod:`hmac`. Sealing is checked for round trip and
for every way a sealed value must fail to open. The key file is created in a
temporary directory and inspected on disk.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from field.contract.errors import OperationalError
from field.core.secrets import SecretBox, new_secret, secret_key, signature_headers
from field.store.keys import KEY_BYTES, load_or_create_key

BODY = b'{"type":"subscription_event","text":"a unit changed","final":false}'


def hub_signature_ok(secret: str, body: bytes, header: str) -> bool:
    """What a GitHub-style receiver does with X-Hub-Signature-256."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


# ---------------------------------------------------------------- secrets


def test_new_secret_is_32_random_bytes_in_standard_form() -> None:
    asked: list[int] = []

    def fixed(n: int) -> bytes:
        asked.append(n)
        return bytes(range(n))

    secret = new_secret(fixed)
    assert asked == [32]
    assert secret == "whsec_" + base64.b64encode(bytes(range(32))).decode()
    assert secret_key(secret) == bytes(range(32))
    assert new_secret() != new_secret()
    assert len(secret_key(new_secret())) == 32


@pytest.mark.parametrize("size", [24, 32, 64])
def test_secret_key_accepts_24_to_64_bytes(size: int) -> None:
    key = os.urandom(size)
    assert secret_key(whsec(key)) == key


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        (whsec(b"k" * 23), "24 to 64 bytes"),
        (whsec(b"k" * 65), "24 to 64 bytes"),
        (whsec(b"k" * 67), "at most 64 bytes"),
        (whsec(b""), "24 to 64 bytes"),
        (base64.b64encode(b"k" * 32).decode(), "starts with 'whsec_'"),
        ("WHSEC_" + base64.b64encode(b"k" * 32).decode(), "starts with 'whsec_'"),
        ("whsec_" + "!" * 44, "base64"),
        ("whsec_" + base64.b64encode(b"k" * 32).decode().rstrip("="), "base64"),  # unpadded
        ("whsec_" + base64.urlsafe_b64encode(b"\xfb" * 33).decode(), "base64"),  # - and _
        ("whsec_" + base64.b64encode(b"k" * 32).decode() + "\n", "base64"),
        ("whsec_" + "A" * 10_000, "at most 64 bytes"),
    ],
)
def test_secret_key_refuses_without_repeating_the_secret(secret: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        secret_key(secret)
    body = secret.removeprefix("whsec_").removeprefix("WHSEC_")
    if body:
        assert body[:8] not in str(caught.value)


# ---------------------------------------------------------------- signatures


def test_signatures_accepted_by_standard_webhooks_and_a_github_style_check() -> None:
    secret = new_secret()
    now = int(time.time())
    headers = signature_headers(secret, "msg_2ZbTfP6rGfcT0nT1", now, BODY)
    assert headers["webhook-id"] == "msg_2ZbTfP6rGfcT0nT1"
    assert headers["webhook-timestamp"] == str(now)
    assert Webhook(secret).verify(BODY, headers) == {
        "type": "subscription_event",
        "text": "a unit changed",
        "final": False,
    }
    assert hub_signature_ok(secret, BODY, headers["X-Hub-Signature-256"])


@pytest.mark.parametrize("size", [24, 64])
def test_signatures_with_keys_of_either_bound(size: int) -> None:
    secret = whsec(os.urandom(size))
    headers = signature_headers(secret, "msg_1", int(time.time()), BODY)
    Webhook(secret).verify(BODY, headers)
    assert hub_signature_ok(secret, BODY, headers["X-Hub-Signature-256"])


def test_standard_webhooks_known_answer() -> None:
    # the example of the Standard Webhooks reference libraries
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    headers = signature_headers(
        secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    )
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_verifier_refuses_a_wrong_key_body_or_timestamp() -> None:
    secret = new_secret()
    now = int(time.time())
    headers = signature_headers(secret, "msg_1", now, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace(b"false", b"true "), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, {**headers, "webhook-timestamp": str(now + 1)})
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, {**headers, "webhook-id": "msg_2"})
    # a signature that was right ten minutes ago is a replay
    old = signature_headers(secret, "msg_1", now - 600, BODY)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(BODY, old)


def test_github_style_check_refuses_a_wrong_secret_or_body() -> None:
    secret = new_secret()
    header = signature_headers(secret, "msg_1", 1, BODY)["X-Hub-Signature-256"]
    assert not hub_signature_ok(new_secret(), BODY, header)
    assert not hub_signature_ok(secret, BODY + b" ", header)
    # keyed by the whole secret string, not by the decoded key
    decoded = hmac.new(secret_key(secret), BODY, hashlib.sha256).hexdigest()
    assert header != "sha256=" + decoded


@pytest.mark.parametrize("message_id", ["", "a,b", "a b", "a\r\nX-Evil: 1", "\u00e9", "m" * 257])
def test_signature_headers_refuses_an_unsafe_message_id(message_id: str) -> None:
    with pytest.raises(ValueError, match="webhook-id"):
        signature_headers(new_secret(), message_id, 1, BODY)


@pytest.mark.parametrize("timestamp", [-1, True, 1.5, "1"])
def test_signature_headers_refuses_a_bad_timestamp(timestamp: object) -> None:
    with pytest.raises(ValueError, match="webhook-timestamp"):
        signature_headers(new_secret(), "msg_1", timestamp, BODY)  # type: ignore[arg-type]


def test_signature_headers_refuses_a_bad_secret() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        signature_headers("hunter2", "msg_1", 1, BODY)


# ---------------------------------------------------------------- sealing


def test_secret_box_round_trip() -> None:
    box = SecretBox(os.urandom(32))
    secret = new_secret()
    sealed = box.seal(secret, context="sub_1")
    assert sealed.startswith("v1.")
    assert secret not in sealed
    assert secret.removeprefix("whsec_") not in sealed
    assert box.open(sealed, context="sub_1") == secret
    # a fresh nonce every time: the same secret seals differently, both open
    again = box.seal(secret, context="sub_1")
    assert again != sealed
    assert box.open(again, context="sub_1") == secret
    # the sealed form is URL-safe base64 of nonce (12) + ciphertext + tag (16)
    raw = base64.urlsafe_b64decode(sealed[3:])
    assert len(raw) == 12 + len(secret) + 16


def test_secret_box_refuses_a_tampered_value() -> None:
    box = SecretBox(os.urandom(32))
    sealed = box.seal(new_secret(), context="sub_1")
    raw = base64.urlsafe_b64decode(sealed[3:])
    for position in (0, 11, 12, len(raw) // 2, len(raw) - 16, len(raw) - 1):
        altered = bytearray(raw)
        altered[position] ^= 0x01
        tampered = "v1." + base64.urlsafe_b64encode(bytes(altered)).decode()
        with pytest.raises(ValueError, match="does not open"):
            box.open(tampered, context="sub_1")
    truncated = "v1." + base64.urlsafe_b64encode(raw[:-1]).decode()
    with pytest.raises(ValueError, match="does not open"):
        box.open(truncated, context="sub_1")


def test_secret_box_refuses_another_context_or_key() -> None:
    key = os.urandom(32)
    sealed = SecretBox(key).seal(new_secret(), context="sub_1")
    with pytest.raises(ValueError, match="does not open"):
        SecretBox(key).open(sealed, context="sub_2")
    with pytest.raises(ValueError, match="does not open"):
        SecretBox(os.urandom(32)).open(sealed, context="sub_1")


@pytest.mark.parametrize(
    ("sealed", "words"),
    [
        ("", "starts with 'v1.'"),
        ("v2." + "A" * 40, "starts with 'v1.'"),
        ("v1.***", "URL-safe base64"),
        ("v1.AAAAA", "URL-safe base64"),  # no whole number of bytes
        ("v1." + base64.b64encode(b"\xfb" * 40).decode(), "URL-safe base64"),  # + and /
        ("v1." + base64.urlsafe_b64encode(b"x" * 27).decode(), "too short"),
    ],
)
def test_secret_box_refuses_what_is_not_a_sealed_value(sealed: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SecretBox(os.urandom(32)).open(sealed, context="sub_1")


@pytest.mark.parametrize("key", [b"", b"k" * 16, b"k" * 31, b"k" * 33, "k" * 32])
def test_secret_box_needs_a_32_byte_key(key: bytes) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        SecretBox(key)


# ---------------------------------------------------------------- key file


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask, so the file's mode is the code's doing."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_key_file_created_0600_with_its_directory(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "data" / "keys" / "field.key"
    key = load_or_create_key(path)
    assert len(key) == KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert base64.b64decode(path.read_bytes().strip(), validate=True) == key
    assert path.read_bytes().endswith(b"\n")


def test_key_file_reused(tmp_path: Path) -> None:
    path = tmp_path / "field.key"
    key = load_or_create_key(path)
    content = path.read_bytes()
    assert load_or_create_key(path) == key
    assert path.read_bytes() == content
    # a key written by hand (no newline, surrounding spaces) is read as well
    other = os.urandom(32)
    path.write_text("  " + base64.b64encode(other).decode() + "  ")
    assert load_or_create_key(path) == other


def test_two_new_key_files_differ(tmp_path: Path) -> None:
    assert load_or_create_key(tmp_path / "a.key") != load_or_create_key(tmp_path / "b.key")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\n",
        b"SECRET-not-base64\n",
        base64.b64encode(b"SECRET-SECRET-16") + b"\n",  # valid base64 of 16 bytes
        base64.b64encode(b"AAA" * 11) + b"\n",  # 33 bytes
        base64.b64encode(b"x" * 32) + b"\n" + base64.b64encode(b"y" * 32) + b"\n",  # two keys
        b"QUFB" * 2000,  # far too long
        b"\xff\xfeSECRET",
    ],
)
def test_bad_key_file_refused_without_echoing(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "field.key"
    path.write_bytes(content)
    with pytest.raises(OperationalError) as caught:
        load_or_create_key(path)
    message = str(caught.value)
    assert str(path) in message
    assert "does not hold one base64 key" in message
    shown = str(caught.value.to_response())
    assert message in shown
    head = content.strip()[:12].decode("latin-1")
    if len(head) >= 6:
        assert head not in shown
    assert "SECRET" not in shown and "U0VDUkVU" not in shown
    assert path.read_bytes() == content  # never overwritten


def test_key_path_that_is_not_a_file(tmp_path: Path) -> None:
    path = tmp_path / "field.key"
    path.mkdir()
    with pytest.raises(OperationalError, match="is not a regular file"):
        load_or_create_key(path)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    with pytest.raises(OperationalError, match="is not a regular file"):
        load_or_create_key(fifo)  # and does not wait for a writer


def test_key_file_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    with pytest.raises(OperationalError, match="cannot be read: Not a directory") as caught:
        load_or_create_key(blocker / "field.key")
    assert str(blocker / "field.key") in str(caught.value)
    assert blocker.read_text() == "x"


def test_key_file_that_is_a_broken_link(tmp_path: Path) -> None:
    path = tmp_path / "field.key"
    path.symlink_to(tmp_path / "missing" / "field.key")
    with pytest.raises(OperationalError, match="is a broken link"):
        load_or_create_key(path)
    assert not (tmp_path / "missing").exists()
