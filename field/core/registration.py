"""Who may REGISTER: the registration policy, registration tokens and the agent cap.

Registration costs the Field memory and log for as long as the agent stays
registered, so the operator chooses who may do it (``--registration``):

========== =====================================================================
``open``   anyone (the default)
``token``  whoever presents a **registration token** the operator issued, in the
           REGISTER payload's ``registration_token``
``closed`` the operator alone (its bearer token on REGISTER)
========== =====================================================================

The operator is never refused by the policy. Everyone, the operator included,
is refused past ``--max-agents`` registered agents (:func:`require_room`).

A registration token is a secret with a number of uses, an optional expiry and
the highest authority it lets an agent register at. It lives in the log, like
an inbound source: the Field keeps only the SHA-256 of the secret (shown once,
when it is issued), and each use is the ``registration_token`` field of the
``agent.registered`` entry it let in. The count of uses is therefore a function
of the log: applied by the single writer before the next request is checked,
and replayed after a restart, a token of N uses lets in exactly N agents.

Entry kinds (projected in :mod:`field.core.state`):

=============================== ================================================
``registration_token.issued``   ``{token: {id, hash, uses, expires_at, authority,
                                note, created_at}}`` (times in seconds)
``registration_token.revoked``  ``{id}``
``agent.registered``            ``+ registration_token``: the id of the token used
=============================== ================================================

A token whose uses run out is dropped from the state; an expired one when the
next token is issued (its expiry is then in the log's past, so the projection
stays a function of the log). No error here tells one invalid token from
another (unknown, used up, expired, revoked): the answer is no oracle.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..contract.clock import iso_timestamp
from ..contract.errors import AuthError, Code, FieldError, InvalidPayload, NotFound, StateError
from ..contract.model import LogEntry
from . import authority
from .authority import OPERATOR, OPERATOR_ID, STANDARD

if TYPE_CHECKING:
    from .context import Context, Outcome
    from .field import Field
    from .state import FieldState

#: The registration policies (``--registration``).
POLICIES = ("open", "token", "closed")
#: Most registration tokens a Field holds at once (used-up ones are not held).
MAX_TOKENS = 1000
#: Most uses one token may be issued with.
MAX_USES = 1_000_000
#: Longest ``note``.
MAX_NOTE_CHARS = 256
#: REGISTER requests one client address may make per second on average, and at once
#: (a test suite or a deployment script registering a hundred agents at start is not
#: slowed; a client registering thousands is held to ten a second). The transports
#: enforce it, before the writer.
REGISTER_RATE = 10.0
REGISTER_BURST = 100
#: The start of every registration token's secret: says what it is where it is found.
SECRET_PREFIX = "fieldreg_"


def digest(secret: str) -> str:
    """What the Field keeps of a secret: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(slots=True)
class RegistrationToken:
    """An issued token as the state holds it (never its secret)."""

    id: str
    hash: str
    uses: int
    uses_left: int
    expires_at: float | None
    authority: int
    note: str | None
    created_at: float

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def public(self, now: float) -> dict[str, Any]:
        """The token as the operator reads it."""
        return {
            "id": self.id,
            "uses": self.uses,
            "uses_left": self.uses_left,
            "expires_at": None if self.expires_at is None else iso_timestamp(self.expires_at),
            "expired": self.expired(now),
            "authority": self.authority,
            "note": self.note,
            "created_at": iso_timestamp(self.created_at),
        }


@dataclass(slots=True)
class Tokens:
    """The registration tokens of a Field: by id, and by the hash of their secret."""

    by_id: dict[str, RegistrationToken]
    by_hash: dict[str, str]

    def __init__(self) -> None:
        self.by_id = {}
        self.by_hash = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def drop(self, token_id: str) -> None:
        token = self.by_id.pop(token_id)
        del self.by_hash[token.hash]


# -- the projection (called by FieldState.apply) ------------------------------------


def apply_issued(state: FieldState, data: dict[str, Any]) -> None:
    tokens = state.registration_tokens
    stored = data["token"]
    for token in [t for t in tokens.by_id.values() if t.expired(stored["created_at"])]:
        tokens.drop(token.id)
    token = RegistrationToken(
        id=stored["id"],
        hash=stored["hash"],
        uses=stored["uses"],
        uses_left=stored["uses"],
        expires_at=stored["expires_at"],
        authority=stored["authority"],
        note=stored["note"],
        created_at=stored["created_at"],
    )
    tokens.by_id[token.id] = token
    tokens.by_hash[token.hash] = token.id


def apply_revoked(state: FieldState, data: dict[str, Any]) -> None:
    state.registration_tokens.drop(data["id"])


def apply_use(state: FieldState, token_id: str | None) -> None:
    """One use of ``token_id`` (from an ``agent.registered`` entry; None: none used)."""
    if token_id is None:
        return
    tokens = state.registration_tokens
    token = tokens.by_id.get(token_id)
    if token is None:  # checked live before the entry was made: never happens
        return
    token.uses_left -= 1
    if token.uses_left <= 0:
        tokens.drop(token_id)


# -- REGISTER (run by the single writer, inside Field._register) --------------------


def admit(field: Field, request: dict[str, Any], ctx: Context) -> RegistrationToken | None:
    """Whether the policy lets this REGISTER in; the registration token it uses, if any.

    Raises REGISTRATION_CLOSED, REGISTRATION_TOKEN_INVALID, or INSUFFICIENT_AUTHORITY
    for an authority above what the caller may grant itself.
    """
    operator = ctx.agent is not None and ctx.agent.id == OPERATOR_ID
    token = None
    if not operator and field.registration == "closed":
        why, details = _operator_token(field, ctx)
        raise FieldError(
            f"registration is closed: only the operator registers agents on this Field, {why}",
            code=Code.REGISTRATION_CLOSED,
            recoverable=False,
            suggested_action=f"Start the Field with an operator token ({_GIVE_OPERATOR_TOKEN}): "
            "on a closed Field only the operator registers agents."
            if not field.has_operator
            else "Ask the Field's operator to register the agent and hand you its token.",
            details=details,
        )
    if not operator and field.registration == "token":
        token = _valid(field.state, request["registration_token"], ctx.now)
    ceiling = OPERATOR if operator else STANDARD if token is None else token.authority
    if request["authority"] > ceiling and token is not None:
        raise AuthError(
            f"registering with authority {request['authority']} needs a registration token "
            f"that grants it (this one grants up to {ceiling})",
            code=Code.INSUFFICIENT_AUTHORITY,
            recoverable=False,
            suggested_action=f"Register at authority {ceiling} or lower, or have the operator "
            "register the agent (or issue a token that grants more).",
        )
    if request["authority"] > ceiling:
        why, details = _operator_token(field, ctx)
        raise AuthError(
            f"registering with authority {request['authority']} needs the operator token, {why}",
            code=Code.INSUFFICIENT_AUTHORITY,
            recoverable=False,
            suggested_action=f"Start the Field with an operator token ({_GIVE_OPERATOR_TOKEN}) "
            f"and send it as the REGISTER request's bearer token, or register at authority "
            f"{ceiling} or lower."
            if not field.has_operator
            else f"Send the operator token as the REGISTER request's bearer token, have the "
            f"operator register the agent, or register at authority {ceiling} or lower.",
            details={"authority": request["authority"], "allowed": ceiling, **details},
        )
    return token


#: How a Field is given its operator token (``suggested_action``).
_GIVE_OPERATOR_TOKEN = (
    "field serve --operator-token-file FILE, or FIELD_OPERATOR_TOKEN in its environment; "
    "at least 16 characters"
)


def _operator_token(field: Field, ctx: Context) -> tuple[str, dict[str, Any]]:
    """Why a REGISTER that needs the operator token does not have it: the end of the
    error's message, and its ``details.operator_token``.

    The Field has no operator token at all (no one can act as the operator
    until it is started with one), or a bearer token was sent that is not the
    operator's, or none was. Nothing here says more about the operator token
    than a REGISTER sent with it would.
    """
    if not field.has_operator:
        why = "and this Field has no operator token (it was started without one)"
        return why, {"operator_token": "not_configured"}
    if ctx.bearer:
        return "and the bearer token given is not the operator's", {
            "operator_token": "not_the_operators"
        }
    return "and no bearer token was given", {"operator_token": "missing"}


def _valid(state: FieldState, secret: str | None, now: float) -> RegistrationToken:
    if secret is None:
        raise _invalid("this Field registers agents only with a registration token")
    token_id = state.registration_tokens.by_hash.get(digest(secret))
    token = None if token_id is None else state.registration_tokens.by_id[token_id]
    if token is None or not hmac.compare_digest(token.hash, digest(secret)) or token.expired(now):
        raise _invalid("the registration token is not valid: unknown, used up, expired or revoked")
    return token


def _invalid(message: str) -> AuthError:
    return AuthError(
        message,
        code=Code.REGISTRATION_TOKEN_INVALID,
        recoverable=False,
        suggested_action="Send a registration token the operator issued, in the REGISTER "
        "payload's registration_token; ask the operator for a new one.",
    )


def require_room(field: Field) -> None:
    """Refuse a new agent when ``max_agents`` are registered."""
    if len(field.state.agents) >= field.max_agents:
        raise StateError(
            f"the Field already has {field.max_agents} registered agents, as many as it holds",
            code=Code.AGENT_LIMIT,
            recoverable=True,
            suggested_action="Retry once agents have deregistered, or ask the operator to "
            "raise --max-agents.",
        )


# -- the operator's endpoints (run by the single writer) ----------------------------

_FIELDS = frozenset({"uses", "expires_at", "authority", "note"})


def validate_request(body: Any, now: float) -> dict[str, Any]:
    """The token a ``POST /v1/registration-tokens`` asks for; raises INVALID_PAYLOAD."""
    if not isinstance(body, dict):
        raise InvalidPayload("a registration token request is a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidPayload(f"unknown field(s) {', '.join(repr(u[:64]) for u in unknown[:5])}")
    uses = body.get("uses", 1)
    if isinstance(uses, bool) or not isinstance(uses, int) or not 1 <= uses <= MAX_USES:
        raise InvalidPayload(f"uses must be an integer from 1 to {MAX_USES}")
    authority = body.get("authority", STANDARD)
    if isinstance(authority, bool) or not isinstance(authority, int) or not 0 <= authority <= 10:
        raise InvalidPayload("authority must be an integer from 0 to 10")
    note = body.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE_CHARS):
        raise InvalidPayload(f"note must be null or a string of at most {MAX_NOTE_CHARS}")
    return {
        "uses": uses,
        "expires_at": _expiry(body.get("expires_at"), now),
        "authority": authority,
        "note": note,
    }


def _expiry(value: Any, now: float) -> float | None:
    if value is None:
        return None
    wrong = "expires_at must be null or an ISO 8601 time with its offset, e.g. 2030-01-31T12:00Z"
    if not isinstance(value, str) or len(value) > 64:
        raise InvalidPayload(wrong)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidPayload(wrong) from None
    if moment.tzinfo is None:
        raise InvalidPayload(wrong)
    seconds = moment.timestamp()
    if not math.isfinite(seconds) or seconds <= now:
        raise InvalidPayload("expires_at must be in the future")
    return seconds


def require_operator(field: Field, token: str | None) -> None:
    """Only the operator issues, lists and revokes registration tokens."""
    authority.require_operator(
        field.authenticate(token),
        "registration tokens are the operator's: this needs the operator token",
    )


def issue(field: Field, token: str | None, body: Any) -> Outcome:
    """``registration_token.issued``: a new token; its secret is in the response only."""
    require_operator(field, token)
    request = validate_request(body, field.now())
    tokens = field.state.registration_tokens
    live = sum(not t.expired(field.now()) for t in tokens.by_id.values())
    if live >= MAX_TOKENS:
        raise StateError(
            f"the Field already holds {MAX_TOKENS} registration tokens",
            code=Code.REGISTRATION_TOKEN_LIMIT,
            suggested_action="Revoke tokens that are no longer needed first.",
        )
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token_id = field.new_id("regtok")

    def build(epoch: int, now: float) -> list[LogEntry]:
        stored = {"id": token_id, "hash": digest(secret), **request, "created_at": now}
        return [LogEntry(epoch, "registration_token.issued", {"token": stored}, OPERATOR_ID, now)]

    outcome = field.system(build)
    shown = tokens.by_id[token_id].public(field.now())
    outcome.response = {
        "status": "ok",
        "registration_token": {**shown, "token": secret},  # shown once: the Field keeps a hash
        "epoch": outcome.response["epoch"],
    }
    return outcome


def listing(field: Field, token: str | None) -> dict[str, Any]:
    """The tokens held (not used up, not revoked), oldest first, without their secrets."""
    require_operator(field, token)
    now = field.now()
    held = sorted(field.state.registration_tokens.by_id.values(), key=lambda t: t.created_at)
    return {
        "status": "ok",
        "registration": field.registration,
        "registration_tokens": [t.public(now) for t in held],
        "epoch": field.epoch,
    }


def revoke(field: Field, token: str | None, token_id: str) -> Outcome:
    """``registration_token.revoked``: the token lets no one in from now on."""
    require_operator(field, token)
    if token_id not in field.state.registration_tokens.by_id:
        raise NotFound(
            f"no registration token {token_id[:64]!r} is held by this Field "
            "(never issued, used up or revoked)",
            code=Code.NOT_FOUND,
            suggested_action="List the tokens with GET /v1/registration-tokens.",
        )

    def build(epoch: int, now: float) -> list[LogEntry]:
        return [LogEntry(epoch, "registration_token.revoked", {"id": token_id}, OPERATOR_ID, now)]

    outcome = field.system(build)
    outcome.response = {"status": "ok", "id": token_id, "epoch": outcome.response["epoch"]}
    return outcome
