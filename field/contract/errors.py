"""The one exception tree of the Field.

Every failure the Field reports to a client is a :class:`FieldError`. It
carries the error code of spec section 8.2 (or one of the documented
extension codes), a message, whether the client can recover, and a
suggested action. How an error reaches the wire (HTTP status, WebSocket
close code) is decided only at the edge, from :data:`HTTP_STATUS`::

    FieldError
    ├── ValidationError          4xx: the request itself is wrong
    │   ├── InvalidJSON              INVALID_JSON
    │   ├── InvalidEnvelope          INVALID_ENVELOPE
    │   ├── InvalidPayload           INVALID_PAYLOAD and the spec's field codes
    │   └── PayloadTooLarge          PAYLOAD_TOO_LARGE
    ├── AuthError                401/403: identity
    ├── NotFound                 UNIT_NOT_FOUND, CONFLICT_NOT_FOUND, NOT_FOUND
    ├── StateError               AGENT_ID_TAKEN, INVALID_TRANSITION, UNSUPPORTED_OPERATION
    └── OperationalError         5xx: STORAGE_FULL, LOG_UNAVAILABLE, EPOCH_OVERFLOW, OVERLOADED,
                                 INTERNAL_ERROR

An error may also say how soon a retry makes sense (``retry_after``, in
seconds); the HTTP edge sends it as ``Retry-After``.
"""

from __future__ import annotations

from typing import Any


class Code:
    """Error codes: the spec's (section 8.2) and this server's extensions."""

    # spec 8.2, validation
    MISSING_INTENT = "MISSING_INTENT"
    MISSING_CONFIDENCE = "MISSING_CONFIDENCE"
    INVALID_CONFIDENCE = "INVALID_CONFIDENCE"
    INVALID_TYPE = "INVALID_TYPE"
    AGENT_NOT_REGISTERED = "AGENT_NOT_REGISTERED"
    AGENT_ID_TAKEN = "AGENT_ID_TAKEN"
    CONFLICT_NOT_FOUND = "CONFLICT_NOT_FOUND"
    UNIT_NOT_FOUND = "UNIT_NOT_FOUND"
    INVALID_TRANSITION = "INVALID_TRANSITION"
    UNSUPPORTED_OPERATION = "UNSUPPORTED_OPERATION"
    # spec 8.2, operational
    ENRICHMENT_FAILED = "ENRICHMENT_FAILED"
    DETECTION_TIMEOUT = "DETECTION_TIMEOUT"
    MERGE_FAILED = "MERGE_FAILED"
    REPLAY_TOO_LARGE = "REPLAY_TOO_LARGE"
    STORAGE_FULL = "STORAGE_FULL"
    # spec 8.2, system
    EPOCH_OVERFLOW = "EPOCH_OVERFLOW"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # extensions (protocol/README.md, "Error codes")
    INVALID_JSON = "INVALID_JSON"
    INVALID_ENVELOPE = "INVALID_ENVELOPE"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    INVALID_EPOCH = "INVALID_EPOCH"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    OVERLOADED = "OVERLOADED"
    SUBSCRIPTION_NOT_FOUND = "SUBSCRIPTION_NOT_FOUND"
    SUBSCRIPTION_LIMIT = "SUBSCRIPTION_LIMIT"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    AGENT_NOT_FOUND = "AGENT_NOT_FOUND"
    INSUFFICIENT_AUTHORITY = "INSUFFICIENT_AUTHORITY"
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    LOG_UNAVAILABLE = "LOG_UNAVAILABLE"
    INVALID_HANDSHAKE = "INVALID_HANDSHAKE"
    TOOLSET_CHANGED = "TOOLSET_CHANGED"
    INVALID_FILTER = "INVALID_FILTER"
    SOURCE_NOT_FOUND = "SOURCE_NOT_FOUND"
    SOURCE_LIMIT = "SOURCE_LIMIT"
    INVALID_SIGNATURE = "INVALID_SIGNATURE"
    STALE_TIMESTAMP = "STALE_TIMESTAMP"
    INVALID_HTTP = "INVALID_HTTP"
    RATE_LIMITED = "RATE_LIMITED"
    REGISTRATION_CLOSED = "REGISTRATION_CLOSED"
    REGISTRATION_TOKEN_INVALID = "REGISTRATION_TOKEN_INVALID"
    REGISTRATION_TOKEN_LIMIT = "REGISTRATION_TOKEN_LIMIT"
    AGENT_LIMIT = "AGENT_LIMIT"
    SUBSCRIPTION_NAME_TAKEN = "SUBSCRIPTION_NAME_TAKEN"
    MISDIRECTED_REQUEST = "MISDIRECTED_REQUEST"


#: HTTP status of each code; the only place where codes meet HTTP.
HTTP_STATUS: dict[str, int] = {
    Code.INVALID_JSON: 400,
    Code.INVALID_ENVELOPE: 400,
    Code.INVALID_PAYLOAD: 422,
    Code.INVALID_FILTER: 422,
    Code.MISSING_INTENT: 422,
    Code.MISSING_CONFIDENCE: 422,
    Code.INVALID_CONFIDENCE: 422,
    Code.INVALID_TYPE: 422,
    Code.INVALID_EPOCH: 422,
    Code.UNSUPPORTED_OPERATION: 422,
    Code.UNAUTHENTICATED: 401,
    Code.AGENT_NOT_REGISTERED: 401,
    Code.FORBIDDEN: 403,
    Code.NOT_FOUND: 404,
    Code.UNIT_NOT_FOUND: 404,
    Code.CONFLICT_NOT_FOUND: 404,
    Code.SUBSCRIPTION_NOT_FOUND: 404,
    Code.SUBSCRIPTION_LIMIT: 409,
    Code.TASK_NOT_FOUND: 404,
    Code.SESSION_NOT_FOUND: 404,
    Code.AGENT_NOT_FOUND: 404,
    Code.INSUFFICIENT_AUTHORITY: 403,
    Code.METHOD_NOT_ALLOWED: 405,
    Code.AGENT_ID_TAKEN: 409,
    Code.INVALID_TRANSITION: 409,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.UNSUPPORTED_MEDIA_TYPE: 415,
    Code.ENRICHMENT_FAILED: 500,
    Code.DETECTION_TIMEOUT: 503,
    Code.MERGE_FAILED: 409,
    Code.REPLAY_TOO_LARGE: 422,
    Code.STORAGE_FULL: 507,
    Code.EPOCH_OVERFLOW: 503,
    Code.OVERLOADED: 503,
    Code.INTERNAL_ERROR: 500,
    Code.TOO_MANY_CONNECTIONS: 429,
    Code.REQUEST_TIMEOUT: 408,
    Code.LOG_UNAVAILABLE: 503,
    Code.INVALID_HANDSHAKE: 400,
    Code.TOOLSET_CHANGED: 409,
    Code.SOURCE_NOT_FOUND: 404,
    Code.SOURCE_LIMIT: 409,
    Code.INVALID_SIGNATURE: 401,
    Code.STALE_TIMESTAMP: 401,
    Code.INVALID_HTTP: 400,
    Code.RATE_LIMITED: 429,
    Code.REGISTRATION_CLOSED: 403,
    Code.REGISTRATION_TOKEN_INVALID: 403,
    Code.REGISTRATION_TOKEN_LIMIT: 409,
    Code.AGENT_LIMIT: 409,
    Code.SUBSCRIPTION_NAME_TAKEN: 409,
    Code.MISDIRECTED_REQUEST: 421,
}


#: What a client should do about an error, where the code alone tells (spec 8.2).
SUGGESTED_ACTIONS: dict[str, str] = {
    Code.MISSING_INTENT: "Resubmit with intent.purpose saying why the unit is recorded.",
    Code.MISSING_CONFIDENCE: "Resubmit with confidence.score and confidence.reasoning.",
    Code.INVALID_CONFIDENCE: "Resubmit with a confidence.score between 0.0 and 1.0.",
    Code.INVALID_TYPE: "Resubmit with one of the MemoryTypes of spec 5.3.",
}


class FieldError(Exception):
    """Base of every error the Field reports to a client."""

    code: str = Code.INTERNAL_ERROR
    recoverable: bool = False
    suggested_action: str | None = None
    #: seconds after which a retry makes sense, when the error is temporary
    retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        recoverable: bool | None = None,
        suggested_action: str | None = None,
        operation: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if recoverable is not None:
            self.recoverable = recoverable
        if suggested_action is not None:
            self.suggested_action = suggested_action
        elif code in SUGGESTED_ACTIONS:
            self.suggested_action = SUGGESTED_ACTIONS[code]
        self.operation = operation
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_response(self, operation: str | None = None) -> dict[str, Any]:
        """The error response of spec 8.1 (plus ``details`` when there are any)."""
        body: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "operation": self.operation or operation,
            "recoverable": self.recoverable,
            "suggested_action": self.suggested_action,
        }
        if self.details:
            body["details"] = self.details
        return body


class ValidationError(FieldError):
    """The request is malformed; resubmitting a corrected one will work."""

    code = Code.INVALID_PAYLOAD
    recoverable = True
    suggested_action = "Correct the request and resubmit it."


class InvalidJSON(ValidationError):
    code = Code.INVALID_JSON
    suggested_action = "Send a single JSON object as the request body."


class InvalidEnvelope(ValidationError):
    code = Code.INVALID_ENVELOPE
    suggested_action = "Wrap the payload in the message envelope of spec 5.1."


class InvalidPayload(ValidationError):
    code = Code.INVALID_PAYLOAD


class PayloadTooLarge(ValidationError):
    code = Code.PAYLOAD_TOO_LARGE
    suggested_action = "Send a smaller request; the limit is in GET /v1/field/status."


class AuthError(FieldError):
    code = Code.UNAUTHENTICATED
    recoverable = True
    suggested_action = "Send 'Authorization: Bearer <token>' with the token REGISTER returned."


class NotFound(FieldError):
    code = Code.NOT_FOUND
    recoverable = False


class StateError(FieldError):
    """The request is well formed but not allowed in the Field's current state."""

    code = Code.INVALID_TRANSITION
    recoverable = True


class OperationalError(FieldError):
    """The Field could not complete a valid request."""

    code = Code.INTERNAL_ERROR
    recoverable = False


class StorageFull(OperationalError):
    """The log's disk (or database) is full: writes are refused, reads go on."""

    code = Code.STORAGE_FULL
    recoverable = True
    retry_after = 5
    suggested_action = (
        "Free disk space for the data directory: the Field resumes writes by itself "
        "within seconds, so retry then. Reads keep working meanwhile."
    )


class LogUnavailable(OperationalError):
    """The log cannot be written now (locked by another process, an I/O error)."""

    code = Code.LOG_UNAVAILABLE
    recoverable = True
    retry_after = 2
    suggested_action = (
        "Retry in a few seconds: the Field resumes writes by itself. If it persists, check "
        "that no other process holds the data directory's field.db locked."
    )


class LogWriteError(OperationalError):
    """The event log could not make an append durable; nothing was acknowledged."""

    code = Code.INTERNAL_ERROR
    recoverable = True
    suggested_action = "Retry the request; the Field was left unchanged."


class Overloaded(OperationalError):
    code = Code.OVERLOADED
    recoverable = True
    retry_after: float | None = 1  # admission sets its policy's, which may be a fraction
    suggested_action = "Retry after a short delay."


def internal_error(operation: str | None = None) -> FieldError:
    """The error reported for an unexpected failure: no stack trace leaves the server."""
    return OperationalError(
        "The Field hit an unexpected internal error; the request was not applied.",
        code=Code.INTERNAL_ERROR,
        operation=operation,
        suggested_action="Retry later; if it persists, report it with the server log.",
    )
