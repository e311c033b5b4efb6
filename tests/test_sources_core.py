"""The pure parts of inbound event sources: signatures, templates, remembered deliveries,
definitions of any shape, and replays refused by the core with no event loop."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import HTTP_STATUS, FieldError, InvalidPayload
from field.contract.model import MEMORY_TYPES
from field.core import sources
from field.core.field import Field

from .core_util import Harness

BODY = b'{"action": "opened"}'
OPERATOR_TOKEN = "operator-token-for-the-sources-core"


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
        seen.note(f"id-{i}", timestamp, None)
    assert list(seen.ids) == ["id-1", "id-2", "id-3"]
    assert seen.horizon == 100  # id-0 is forgotten: anything signed at or before 100 is stale
    seen.note("id-4", 130, None)
    assert seen.horizon == 100  # id-1 (90) is older than the horizon already
    seen.note("id-5", 140, None)
    assert (seen.horizon, list(seen.ids)) == (100, ["id-3", "id-4", "id-5"])


def test_body_digests_are_remembered_for_as_many_events_as_delivery_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sources, "MAX_REMEMBERED", 3)
    seen = sources.Deliveries()
    digests = [sources.body_digest(b'{"n": %d}' % i) for i in range(5)]
    for i, digest in enumerate(digests[:4]):
        seen.note(None if i % 2 else f"id-{i}", None, digest)
    assert not seen.repeats(None, digests[0])  # the oldest body is forgotten
    assert all(seen.repeats(None, digest) for digest in digests[1:4])
    assert not seen.repeats("id-1", digests[4])
    assert seen.repeats("id-0", digests[4])  # ids have a window of their own: two so far
    assert len(next(iter(seen.bodies))) == 32  # the raw digest, not its hex


def define(h: Harness, scheme: str) -> None:
    body = {
        "name": "src",
        "scheme": scheme,
        "unit": {"type": "observation", "content": "event {payload.n}"},
    }
    h.entries.extend(h.field.define_source(OPERATOR_TOKEN, body).entries)


def ingest(
    h: Harness, field: Field, body: bytes, delivery_id: str | None, timestamp: int | None = None
) -> dict[str, Any]:
    event = sources.Event(
        field.state.sources["src"],
        delivery_id,
        timestamp,
        orjson.loads(body),
        {},
        sources.body_digest(body),
    )
    outcome = field.ingest_event(event)
    h.entries.extend(outcome.entries)
    return outcome.response


def test_a_github_body_is_stored_once_under_any_delivery_id_and_after_a_restart() -> None:
    h = Harness(operator_token=OPERATOR_TOKEN)
    define(h, "github")
    first, second = b'{"n": 1}', b'{"n": 2}'
    assert ingest(h, h.field, first, "d-1")["status"] == "accepted"
    logged = len(h.entries)
    assert h.entries[-1].data["delivery"]["digest"] == hashlib.sha256(first).hexdigest()
    # the signature covers the body alone: a captured event sent again under a new
    # delivery id, or none, is the same event
    for delivery_id in ("d-2", None, "d-3", None):
        answer = ingest(h, h.field, first, delivery_id)
        assert answer == {"status": "duplicate", "delivery_id": delivery_id}
    assert len(h.entries) == logged
    assert ingest(h, h.field, second, None)["status"] == "accepted"
    assert ingest(h, h.field, second, "d-4") == {"status": "duplicate", "delivery_id": "d-4"}
    assert h.field.state.sources["src"].accepted == 2
    # a Field rebuilt from the log remembers both bodies and the delivery id
    restarted = h.replayed()
    logged = len(h.entries)
    for body, delivery_id in ((first, "d-5"), (second, None), (b'{"n": 3}', "d-1")):
        answer = ingest(h, restarted, body, delivery_id)
        assert answer == {"status": "duplicate", "delivery_id": delivery_id}
    assert len(h.entries) == logged
    assert ingest(h, restarted, b'{"n": 3}', "d-6")["status"] == "accepted"


def test_standard_webhooks_events_may_share_a_body() -> None:
    h = Harness(operator_token=OPERATOR_TOKEN)
    define(h, "standard")
    now = int(h.time)
    # the id is signed with the body: only its sender can send the body under another id
    assert ingest(h, h.field, BODY, "msg-1", now)["status"] == "accepted"
    assert ingest(h, h.field, BODY, "msg-2", now)["status"] == "accepted"
    assert h.entries[-1].data["delivery"]["digest"] is None
    assert ingest(h, h.field, BODY, "msg-1", now) == {"status": "duplicate", "delivery_id": "msg-1"}
    assert not h.field.state.sources["src"].deliveries.bodies


# -- definitions of any shape ------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", " ", "github", "standard", "src", "{payload.a}", "{", "x" * 5000])
    | st.sampled_from(sorted(MEMORY_TYPES))
)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
#: what replaces a field: any JSON value, often an array or an object where a scalar belongs
wrong_values = (
    json_values
    | st.lists(scalars, min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=4), scalars, min_size=1, max_size=3)
)
VALID_DEFINITION: dict[str, Any] = {
    "name": "src",
    "scheme": "github",
    "secret": "a secret",
    "filter": "payload.action == 'opened'",
    "unit": {
        "type": "observation",
        "content": "PR {payload.number}",
        "purpose": "follow {payload.repo}",
        "confidence": 0.5,
        "task_id": "task-1",
        "session_id": None,
    },
    "max_payload_bytes": 4096,
}
STANDARD_SECRETS = [None, "whsec_x", "whsec_" + base64.b64encode(b"k" * 32).decode()]
FIELDS = [*VALID_DEFINITION, *(f"unit.{key}" for key in VALID_DEFINITION["unit"]), "extra"]


@st.composite
def definitions(draw: st.DrawFn) -> Any:
    """A valid definition with up to three fields (top level or in ``unit``) replaced by
    any JSON value or left out; or any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    body: dict[str, Any] = {**VALID_DEFINITION, "unit": dict(VALID_DEFINITION["unit"])}
    if draw(st.booleans()):
        body["scheme"], body["secret"] = "standard", draw(st.sampled_from(STANDARD_SECRETS))
    for path in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        into, key = (body, path) if "." not in path else (body.get("unit"), path[5:])
        if not isinstance(into, dict):
            continue
        if draw(st.integers(0, 4)) == 0:
            into.pop(key, None)
        else:
            into[key] = draw(wrong_values)
    return body


@settings(max_examples=300, deadline=None, derandomize=True)
@given(body=definitions())
def test_any_definition_defines_a_source_or_is_refused_with_a_4xx_error(body: Any) -> None:
    field = Field(operator_token=OPERATOR_TOKEN)
    try:
        outcome = field.define_source(OPERATOR_TOKEN, body)
    except FieldError as error:
        assert 400 <= HTTP_STATUS[error.code] < 500, error
        assert "a secret" not in str(error)
    else:
        assert outcome.response["status"] == "ok"
        orjson.dumps(outcome.entries[0].data)  # the entry can be written
