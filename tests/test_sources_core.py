"""The pure parts of inbound event sources: signatures, templates, remembered deliveries."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from field.core import sources
from field.errors import FieldError, InvalidPayload

BODY = b'{"action": "opened"}'


def test_github_signature_is_hmac_sha256_of_the_raw_body() -> None:
    good = "sha256=" + hmac.new(b"secret", BODY, hashlib.sha256).hexdigest()
    assert sources.verify_github(b"secret", BODY, good)
    assert sources.verify_github(b"secret", BODY, good.upper().replace("SHA256=", "sha256="))
    assert not sources.verify_github(b"other", BODY, good)
    assert not sources.verify_github(b"secret", BODY + b" ", good)
    assert not sources.verify_github(b"secret", BODY, None)
    assert not sources.verify_github(b"secret", BODY, good.removeprefix("sha256="))
    assert not sources.verify_github(b"secret", BODY, "sha256=\u00e9" + good[8:])


def test_standard_signature_accepts_any_of_several_and_binds_id_and_time() -> None:
    key = b"k" * 32
    mac = hmac.digest(key, b"msg_1.1700000000." + BODY, hashlib.sha256)
    good = "v1," + base64.b64encode(mac).decode()
    assert sources.verify_standard(key, "msg_1", "1700000000", good, BODY)
    assert sources.verify_standard(key, "msg_1", "1700000000", f"v1,AAAA {good}", BODY)
    assert not sources.verify_standard(key, "msg_2", "1700000000", good, BODY)
    assert not sources.verify_standard(key, "msg_1", "1700000001", good, BODY)
    assert not sources.verify_standard(key, "msg_1", "1700000000", "v1,AAAA " * 16 + good, BODY)


def test_timestamps_outside_the_tolerance_are_stale() -> None:
    assert sources.check_timestamp("1000", 1300.0, 300) == 1000
    for raw, now in [("999", 1300.0), ("1601", 1300.0), ("-5", 0.0), ("1e3", 1000.0), ("", 0.0)]:
        with pytest.raises(FieldError) as refused:
            sources.check_timestamp(raw, now, 300)
        assert refused.value.code == "STALE_TIMESTAMP"


def test_templates_substitute_paths_and_nothing_else() -> None:
    template = sources.compile_template(
        "{{#{payload.n}}} {payload.pr.title} [{payload.labels.1.name}] {payload.missing.x}"
        " {headers.x-github-event} {payload.pr} {payload.ok}",
        "unit.content",
    )
    context = {
        "payload": {
            "n": 7,
            "pr": {"title": "Fix"},
            "labels": [{"name": "a"}, {"name": "b"}],
            "ok": True,
        },
        "headers": {"x-github-event": "pull_request"},
    }
    assert template.render(context, 1000) == ('{#7} Fix [b]  pull_request {"title":"Fix"} true')
    assert template.render(context, 5) == "{#7} "
    for bad in ["{payload", "{__class__}", "{payload.a}}", "{ }", "x" * 5000, "", "   "]:
        with pytest.raises(InvalidPayload):
            sources.compile_template(bad, "unit.content")
    with pytest.raises(InvalidPayload):
        sources.compile_template("{payload.a}" * (sources.MAX_PLACEHOLDERS + 1), "unit.content")


def test_a_forgotten_delivery_moves_the_horizon_so_it_cannot_be_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sources, "MAX_REMEMBERED", 3)
    seen = sources.Deliveries()
    for i, timestamp in enumerate([100, 90, None, 120]):
        seen.note(f"id-{i}", timestamp)
    assert list(seen.ids) == ["id-1", "id-2", "id-3"]
    assert seen.horizon == 100  # id-0 is forgotten: anything signed at or before 100 is stale
    seen.note("id-4", 130)
    assert seen.horizon == 100  # id-1 (90) is older than the horizon already
    seen.note("id-5", 140)
    assert (seen.horizon, list(seen.ids)) == (100, ["id-3", "id-4", "id-5"])
