"""The SDK's types cannot drift from the Field: its ``Literal`` types name exactly the values
the Field accepts, its typed responses have exactly the fields of the schemas, and a user's
``mypy --strict`` infers them."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import mypy.api
import pytest

from field.client import responses, types
from field.contract import model
from field.core import validation
from field.core.tasks import TASK_STATUSES
from field.subscriptions.events import SUBSCRIPTION_EVENTS

from .schema_util import URN_PREFIX, load_schemas

PAIRS = [
    (types.MemoryType, model.MEMORY_TYPES),
    (types.UnitStatus, model.UNIT_STATUSES),
    (types.RelationType, model.RELATION_TYPES),
    (types.SubscriptionEvent, SUBSCRIPTION_EVENTS),
    (types.Strategy, model.CONFLICT_STRATEGIES),
    (types.ConflictStatus, model.CONFLICT_STATUSES),
    (types.ConflictType, model.CONFLICT_TYPES),
    (types.DetectMode, model.DETECT_MODES),
    (types.AttuneFormat, model.ATTUNE_FORMATS),
    (types.ReplayTarget, validation.REPLAY_TARGETS),
    (types.ReplayDepth, validation.REPLAY_DEPTHS),
    (types.CompactStrategy, validation.COMPACT_STRATEGIES),
    (types.AgentStatus, model.AGENT_STATUSES),
    (types.TaskStatus, TASK_STATUSES),
]


@pytest.mark.parametrize(("literal", "accepted"), PAIRS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_literal_names_what_the_field_accepts(literal: Any, accepted: Any) -> None:
    assert set(get_args(literal)) == set(accepted)


# -- the typed responses ------------------------------------------------------------------------

TYPED_RESPONSES = [
    (responses.RegisterResponse, "register.response"),
    (responses.RecordResponse, "record.response"),
    (responses.AttuneResponse, "attune.response"),
    (responses.DetectResponse, "detect.response"),
    (responses.ConflictsPage, "conflicts.response"),
    (responses.MergeResponse, "merge.response"),
    (responses.CoordinateResponse, "coordinate.response"),
    (responses.HandoffResponse, "handoff.response"),
    (responses.AgentsPage, "agents.response"),
]


def _resolve(stem: str, node: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Follow ``$ref`` (``urn:akashik-field:0.1.0:<stem>#/pointer`` or ``#/pointer``)."""
    while "$ref" in node:
        target, _, pointer = node["$ref"].partition("#")
        stem = target.removeprefix(URN_PREFIX) if target else stem
        node = load_schemas()[stem]
        for part in filter(None, pointer.split("/")):
            node = node[part]
    return stem, node


def _inner(hint: Any) -> tuple[Any, bool]:
    """The TypedDict or Literal inside a hint (``X | None``, ``list[X]``), and whether it is
    the items of a list."""
    listed = False
    while True:
        origin, args = get_origin(hint), get_args(hint)
        if origin is list:
            hint, listed = args[0], True
        elif origin in (Union, UnionType):
            kept = [arg for arg in args if arg is not type(None)]
            if len(kept) != 1:
                return hint, listed
            hint = kept[0]
        else:
            return hint, listed


def _check(typed: Any, stem: str, node: dict[str, Any], seen: set[Any], path: str) -> None:
    seen.add(typed)
    stem, node = _resolve(stem, node)
    variants = [_resolve(stem, variant)[1] for variant in node.get("oneOf", [node])]
    properties: dict[str, list[dict[str, Any]]] = {}  # a key's schema in each variant
    for variant in variants:
        for key, schema in variant["properties"].items():
            properties.setdefault(key, []).append(schema)
    required = set.intersection(*(set(variant.get("required", ())) for variant in variants))
    assert typed.__required_keys__ == required, path
    assert typed.__required_keys__ | typed.__optional_keys__ == set(properties), path
    for key, hint in get_type_hints(typed).items():
        inner, listed = _inner(hint)
        values: set[Any] = set()
        for each in properties[key]:
            where, schema = _resolve(stem, each)
            if listed:
                where, schema = _resolve(where, schema["items"])
            if is_typeddict(inner):
                _check(inner, where, schema, seen, f"{path}.{key}")
            values |= set(schema.get("enum", [schema.get("const")])) - {None}
        if get_origin(inner) is Literal:
            assert set(get_args(inner)) == values, f"{path}.{key}"


def test_a_typed_response_has_the_fields_of_its_schema() -> None:
    """Every key of every typed response (and of every object in it) is the schema's,
    required exactly when the schema requires it (in every variant of a ``oneOf``), and
    each ``Literal`` names the schema's values."""
    seen: set[Any] = set()
    for typed, stem in TYPED_RESPONSES:
        _check(typed, stem, load_schemas()[stem], seen, typed.__name__)
    declared = {v for v in vars(responses).values() if is_typeddict(v)}
    assert declared == seen  # none left unchecked


USAGE = """
from typing import Any, assert_type

from field.client import AgentRecord, AttuneResponse, FieldClient, RecordResponse, Subscription


async def main() -> None:
    async with FieldClient("http://127.0.0.1:8765") as field:
        me = await field.connect("a", role="analyst", token_file="a.token")
        assert_type(me.info, AgentRecord | None)
        unit = await me.record("finding", "x", purpose="p", confidence=0.5, reasoning="r")
        assert_type(unit, RecordResponse)
        assert_type(unit["memory_unit_id"], str)
        assert_type(unit["conflicts_detected"], list[str])
        context = await me.attune(context_hint="x")
        assert_type(context, AttuneResponse)
        assert_type(context["record"][0]["memory_unit"]["content"], str)
        assert_type(context["record"][0]["relevance_score"], float)
        assert_type(context["context_budget"]["units_available"], int)
        found = await me.detect("check", target_id=unit["memory_unit_id"])
        assert_type(found["conflicts"][0]["unit_a"], str)
        merged = await me.merge("conflict-1", "authority", rationale="r", winner_id="w")
        assert_type(merged["conflict"]["resolution"]["winner_id"], str | None)
        task = (await me.coordinate("create", title="t"))["task"]
        assert_type(task["assignee"], str | None)
        handed = await me.handoff(task["id"], "b", notes="n")
        assert_type(handed["handoff"]["context"]["units"][0]["relevance_score"], float)
        news = await me.subscribe(["memory.recorded"])
        assert_type(news, Subscription)
        page = await me.conflicts()
        assert_type(page["next"], str | None)
        everyone = await me.every(me.agents, "agents")  # a typed page is a page to follow
        assert_type(everyone[0]["id"], Any)
"""


def _mypy(source: str, directory: Path) -> tuple[str, int]:
    """``mypy --strict`` over ``source`` as a user's file, outside the repository: the SDK
    is found installed (py.typed), as a user's type checker finds it."""
    (directory / "usage.py").write_text(source)
    cache = directory / "cache"
    with contextlib.chdir(directory):
        out, err, status = mypy.api.run(
            ["--strict", "--no-error-summary", "--cache-dir", str(cache), "usage.py"]
        )
    return out + err, status


def test_mypy_strict_infers_the_types_of_results(tmp_path: Path) -> None:
    report, status = _mypy(USAGE, tmp_path)
    assert status == 0, report
    # and it would say so: a key no response has, a value read as the wrong type
    wrong = USAGE + (
        "\n\nasync def wrong(unit: RecordResponse) -> int:\n"
        '    print(unit["memory_unit"])\n'
        '    return unit["memory_unit_id"]\n'
    )
    report, status = _mypy(wrong, tmp_path)
    assert status == 1
    assert 'TypedDict "RecordResponse" has no key "memory_unit"' in report
    assert 'Incompatible return value type (got "str", expected "int")' in report
