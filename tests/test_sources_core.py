"""The pure parts of inbound event sources: signatures, templates, remembered deliveries,
and definitions of any shape."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.core import sources
from field.core.field import Field
from field.errors import HTTP_STATUS, FieldError, InvalidPayload
from field.model import MEMORY_TYPES

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
        seen.note(f"id-{i}", timestamp)
    assert list(seen.ids) == ["id-1", "id-2", "id-3"]
    assert seen.horizon == 100  # id-0 is forgotten: anything signed at or before 100 is stale
    seen.note("id-4", 130)
    assert seen.horizon == 100  # id-1 (90) is older than the horizon already
    seen.note("id-5", 140)
    assert (seen.horizon, list(seen.ids)) == (100, ["id-3", "id-4", "id-5"])


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
