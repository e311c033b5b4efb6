"""Valid and invalid instances of the RAP binding's schemas.

``tests/test_schemas.py`` checks them with every other schema case;
``tests/test_rap.py`` validates what a real server sends against the same
schemas, and feeds the invocation cases to the server's parser, which must
accept exactly the valid ones.
"""

from __future__ import annotations

from typing import Any

import pytest

SCHEMAS = {
    "types": [
        "rap-toolset",
        "rap-invocation",
        "rap-tool-result",
        "rap-subscription-event",
    ],
    "requests": ["rap-cancel-tool-call.request", "rap-close-thread.request"],
    "responses": ["rap-cancel.response", "rap-invoke.response"],
}

#: Objects the runtime sends whose unknown fields the Field ignores (later RAP versions).
OPEN_OBJECTS = {
    ("rap-invocation", ""),
    ("rap-cancel-tool-call.request", ""),
    ("rap-close-thread.request", ""),
}

SUB_ID = "sub-0123456789abcdef0123"
TOOLSET = {
    "name": "akashik-field",
    "description": "An Akashik Field.",
    "endpoint": "https://field.example.com/rap/invoke",
    "version": "0123456789abcdef",
    "tools": [
        {
            "name": "akashik_record",
            "description": "Write a memory unit.",
            "inputSchema": {"type": "object", "properties": {}},
        }
    ],
}
INVOCATION = {
    "operation": "akashik_subscribe",
    "arguments": {"events": ["memory.recorded"]},
    "id": "call_abc123",
    "call_id": None,
    "callback_url": "https://agent.example.com/callback",
    "group_id": "thread_xyz",
    "user_id": "user_42",
}
RESULT = {
    "type": "tool_result",
    "group_id": "thread_xyz",
    "id": "call_abc123",
    "text": '{"status":"ok","subscription_id":"' + SUB_ID + '"}',
    "subscription": True,
}
ERROR_RESULT = {
    "type": "tool_result",
    "group_id": "thread_xyz",
    "id": "call_abc124",
    "call_id": "model-7",
    "text": '{"code":"MISSING_INTENT"}',
    "is_error": True,
}
EVENT = {
    "type": "subscription_event",
    "group_id": "thread_xyz",
    "tool_call_id": "call_abc123",
    "text": '{"subscription_id":"' + SUB_ID + '","event":"memory.recorded"}',
    "associative": False,
}
CANCEL = {"thread_id": "thread_xyz", "tool_call_id": "call_abc123"}
CANCELLED = {"status": "ok", "cancelled": [SUB_ID]}


def case(name: str, instance: Any, label: str) -> Any:
    return pytest.param(name, instance, id=f"{name}:{label}")


def without(instance: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in instance.items() if k != key}


VALID = [
    case("rap-toolset", TOOLSET, "toolset"),
    case("rap-toolset", without(without(TOOLSET, "description"), "version"), "minimal"),
    case("rap-invocation", INVOCATION, "subscribe"),
    case("rap-invocation", without(without(INVOCATION, "call_id"), "user_id"), "minimal"),
    case(
        "rap-invocation",
        {**INVOCATION, "thread_ancestors": ["thread_root"], "toolset_version": "v", "x": 1},
        "later-fields",
    ),
    case("rap-tool-result", RESULT, "subscription"),
    case("rap-tool-result", ERROR_RESULT, "error"),
    case("rap-tool-result", without(RESULT, "subscription"), "plain"),
    case("rap-subscription-event", EVENT, "event"),
    case("rap-subscription-event", {**EVENT, "associative": True, "final": True}, "final"),
    case("rap-cancel-tool-call.request", CANCEL, "cancel"),
    case("rap-close-thread.request", {"thread_id": "thread_xyz"}, "close"),
    case("rap-cancel.response", CANCELLED, "cancelled"),
    case("rap-cancel.response", {"status": "ok", "cancelled": []}, "nothing"),
    case(
        "rap-cancel.response",
        {"status": "ignored", "cancelled": [], "reason": "thread_id must be a string"},
        "ignored",
    ),
    case("rap-invoke.response", {"status": "accepted"}, "accepted"),
]

INVALID = [
    case("rap-toolset", {**TOOLSET, "tools": []}, "no-tools"),
    case("rap-toolset", {**TOOLSET, "name": ""}, "empty-name"),
    case("rap-toolset", without(TOOLSET, "endpoint"), "no-endpoint"),
    case(
        "rap-toolset",
        {**TOOLSET, "tools": [{**TOOLSET["tools"][0], "name": "akashik record"}]},
        "tool-name",
    ),
    case("rap-invocation", {**INVOCATION, "operation": "akashik_register"}, "register"),
    case("rap-invocation", {**INVOCATION, "arguments": []}, "arguments"),
    case("rap-invocation", {**INVOCATION, "id": ""}, "empty-id"),
    case("rap-invocation", {**INVOCATION, "group_id": "g" * 257}, "long-group"),
    case("rap-invocation", without(INVOCATION, "callback_url"), "no-callback"),
    case("rap-invocation", {**INVOCATION, "user_id": 42}, "user-id"),
    case("rap-tool-result", {**RESULT, "is_error": True}, "error-subscription"),
    case("rap-tool-result", {**RESULT, "subscription": False}, "subscription-false"),
    case("rap-tool-result", without(RESULT, "text"), "no-text"),
    case("rap-subscription-event", {**EVENT, "final": False}, "final-false"),
    case("rap-subscription-event", {**EVENT, "id": "call_abc123"}, "id"),
    case("rap-cancel-tool-call.request", without(CANCEL, "tool_call_id"), "no-call"),
    case("rap-close-thread.request", {"thread_id": ""}, "empty-thread"),
    case("rap-cancel.response", {"status": "done", "cancelled": []}, "status"),
    case("rap-cancel.response", {"status": "ok"}, "no-list"),
    case("rap-invoke.response", {"status": "ok"}, "status"),
    case("rap-invoke.response", {"status": "accepted", "id": "call_abc123"}, "extra"),
]
