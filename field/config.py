"""Server configuration: typed, bounded, read once at start-up.

Every setting has a command-line flag (``field serve --help``) and an
environment variable ``FIELD_<NAME>``; a flag wins over the environment,
and the environment over the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .model import Limits
from .subscriptions.outbox import PushLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Settings of one ``field serve`` process."""

    host: str = "127.0.0.1"
    port: int = 8765
    #: Directory of the SQLite log; ``None`` keeps the log in memory (tests, demos).
    data_dir: Path | None = Path("./field-data")
    #: SQLite synchronous mode: "full" survives power loss, "normal" a process crash.
    sync: str = "full"
    #: Bound on requests waiting for the writer; past it requests get OVERLOADED.
    max_queue: int = 10_000
    #: Most operations committed in one group commit.
    max_batch: int = 512
    log_level: str = "info"
    #: Seconds an agent whose last push connection dropped has to come back.
    failure_grace: float = 30.0
    #: Seconds of silence (no request, no connection) before an agent fails; 0: never.
    heartbeat_timeout: float = 300.0
    #: The operator's bearer token (authority 10, spec 11.2); None: no operator.
    operator_token: str | None = field(default=None, repr=False)
    #: Embedder of semantic relevance: "hashing" or "sentence-transformers:<model or path>".
    embedder: str = "hashing"
    #: Accept WebSocket permessage-deflate when a client offers it (browsers always do). Off:
    #: its zlib state costs about 37 KB per connection, and every notification is then
    #: compressed once per subscriber.
    ws_deflate: bool = False
    limits: Limits = field(default_factory=Limits)
    push: PushLimits = field(default_factory=PushLimits)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.sync not in ("full", "normal"):
            raise ValueError(f'sync must be "full" or "normal", not {self.sync!r}')
        if self.max_queue < 1 or self.max_batch < 1:
            raise ValueError("max_queue and max_batch must be positive")
        if self.failure_grace <= 0 or self.heartbeat_timeout < 0:
            raise ValueError("failure_grace must be positive and heartbeat_timeout not negative")
        if self.operator_token is not None and len(self.operator_token) < 16:
            raise ValueError("operator_token must be at least 16 characters")
        if self.limits.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Defaults, then ``FIELD_*`` variables, then ``overrides`` (None means unset).

        ``max_body_bytes`` sets ``limits.max_body_bytes``; ``outbox_frames``
        and ``outbox_bytes`` set the push limits of every connection.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        names = [f.name for f in fields(cls) if f.name not in ("limits", "push")]
        for name in [*names, *_NESTED]:
            raw = environ.get(f"FIELD_{name.upper()}")
            if raw is not None:
                values[name] = _parse(name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        nested = {name: int(values.pop(name)) for name in _NESTED if name in values}
        config = cls(**values)
        if "max_body_bytes" in nested:
            limits = replace(config.limits, max_body_bytes=nested.pop("max_body_bytes"))
            config = replace(config, limits=limits)
        if nested:
            config = replace(config, push=replace(config.push, **nested))
        return config


#: Settings that live inside ``limits`` or ``push``.
_NESTED = ("max_body_bytes", "outbox_frames", "outbox_bytes")


def _parse(name: str, raw: str) -> Any:
    if name == "data_dir":
        return None if raw in ("", ":memory:") else Path(raw)
    if name in ("port", "max_queue", "max_batch", *_NESTED):
        return int(raw)
    if name in ("failure_grace", "heartbeat_timeout"):
        return float(raw)
    if name == "ws_deflate":
        flag = raw.strip().lower()
        if flag not in _BOOLEANS:
            raise ValueError(f"FIELD_WS_DEFLATE must be one of {', '.join(_BOOLEANS)}, not {raw!r}")
        return _BOOLEANS[flag]
    return raw


#: How a yes/no setting may be spelled in the environment.
_BOOLEANS = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}
