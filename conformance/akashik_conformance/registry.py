"""Checks: what each one is (id, Level, binding, spec section, strength) and their registry.

A check is an async function of a :class:`Context`. It passes by returning, fails by raising
:class:`Failed` (or any other exception: an answer it could not read is a failure too), and
is skipped by raising :class:`Skipped` with the reason.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .wire import Answer, Wire


class Strength(enum.StrEnum):
    """How strongly the requirement is stated."""

    MUST = "MUST"
    SHOULD = "SHOULD"
    #: a requirement of the Field's published extensions (protocol/README.md), not of the spec
    EXTENSION = "extension"


class Binding(enum.StrEnum):
    HTTP = "http"
    WEBSOCKET = "websocket"
    SSE = "sse"
    MCP = "mcp"


class Failed(Exception):
    """The Field did not do what the requirement says."""


class Skipped(Exception):
    """The check does not apply to this Field or this run; the message says why."""


def fail(message: str) -> NoReturn:
    raise Failed(message)


def expect(condition: object, message: str) -> None:
    """Fail with ``message`` unless ``condition`` holds (never ``assert``: ``-O`` strips it)."""
    if not condition:
        raise Failed(message)


def expect_error(answer: Answer, status: int, code: str, what: str) -> None:
    """The answer is an error response of ``status`` and ``code`` with the spec's fields."""
    expect(
        answer.status == status and answer.code == code,
        f"{what}: expected HTTP {status} {code}, got {answer.describe()}",
    )
    expect_error_shape(answer, what)


def expect_error_shape(answer: Answer, what: str) -> None:
    """Spec 8.1: code, message, operation, recoverable (boolean), suggested_action."""
    body = answer.body
    expect(isinstance(body, dict), f"{what}: the error body is not a JSON object")
    missing = [
        key
        for key in ("code", "message", "operation", "recoverable", "suggested_action")
        if key not in body
    ]
    expect(not missing, f"{what}: the error response lacks {missing}: {answer.describe()}")
    expect(isinstance(body["recoverable"], bool), f"{what}: `recoverable` is not a boolean")
    expect(isinstance(body["message"], str), f"{what}: `message` is not a string")


def expect_ok(answer: Answer, what: str) -> dict[str, Any]:
    expect(answer.ok and isinstance(answer.body, dict), f"{what}: {answer.describe()}")
    body: dict[str, Any] = answer.body
    return body


@dataclass
class Context:
    """What a check is given: the wire, and what this run may do."""

    wire: Wire
    #: the operator token, for checks of authority above 4 and of the operator's rights
    operator_token: str | None
    #: restarts the Field and returns once it answers again; ``None``: not allowed
    restart: Callable[[], Awaitable[None]] | None
    #: the capabilities the Field reported, read once at the start of the run
    capabilities: dict[str, Any]

    def supports(self, operation: str) -> bool:
        return operation in self.capabilities.get("supported_operations", [])

    def require(self, *operations: str) -> None:
        missing = [name for name in operations if not self.supports(name)]
        if missing:
            raise Skipped(f"the Field does not list {', '.join(missing)} in supported_operations")

    def require_operator(self) -> None:
        if self.operator_token is None:
            raise Skipped("needs the operator token (--operator-token)")


CheckFunction = Callable[[Context], Awaitable[None]]


@dataclass(frozen=True)
class Check:
    id: str
    level: int
    binding: Binding
    section: str
    strength: Strength
    title: str
    function: CheckFunction
    #: runs alone, after the others: it restarts the Field, or reads a push stream that
    #: other checks' units would crowd
    exclusive: bool = False
    #: restarts the Field (then also exclusive, and run last)
    restarts: bool = False


REGISTRY: dict[str, Check] = {}


def check(
    id: str,
    *,
    level: int,
    section: str,
    strength: Strength = Strength.MUST,
    binding: Binding = Binding.HTTP,
    exclusive: bool = False,
    restarts: bool = False,
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; its docstring's first line is its title."""

    def register(function: CheckFunction) -> CheckFunction:
        if id in REGISTRY:
            raise ValueError(f"two checks are named {id}")
        title = (function.__doc__ or id).strip().splitlines()[0]
        REGISTRY[id] = Check(
            id, level, binding, section, strength, title, function, exclusive or restarts, restarts
        )
        return function

    return register
