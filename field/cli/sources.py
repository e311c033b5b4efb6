"""``field source add|remove|list``: the operator's commands for inbound event sources.

Each is one request to a running Field (``POST``, ``DELETE``, ``GET /v1/sources``) with
the operator's bearer token, taken from ``--operator-token-file``, ``FIELD_OPERATOR_TOKEN``
or ``--operator-token`` (which ``ps`` shows: prefer the other two). The answer is
printed as JSON on stdout; an error response on stderr, with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

#: Seconds to wait for the Field.
TIMEOUT = 30.0


def add_parser(commands: Any) -> None:
    """The ``source`` command and its three actions."""
    source = commands.add_parser("source", help="define, remove or list inbound event sources")
    actions = source.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="define a source (or redefine one of that name)")
    add.add_argument("name", help="the source's name: lower-case letters, digits, _ and -")
    add.add_argument("--scheme", choices=["github", "standard"], required=True)
    add.add_argument(
        "--secret-file",
        type=Path,
        help="file holding the secret (github: any string; standard: whsec_...); "
        "without it the Field makes one and prints it once",
    )
    add.add_argument("--filter", help="CEL expression over payload and headers")
    add.add_argument("--type", default="observation", help="memory type of the units")
    add.add_argument(
        "--content", required=True, help="template of a unit's content: {payload.a.b} ..."
    )
    add.add_argument("--purpose", help="template of the units' intent.purpose")
    add.add_argument("--confidence", type=float, help="the units' confidence score (0.5)")
    add.add_argument("--task-id", help="intent.task_id of the units")
    add.add_argument("--session-id", help="session the units are recorded in")
    add.add_argument("--max-payload-bytes", type=int, help="largest event body (65536)")
    remove = actions.add_parser("remove", help="remove a source")
    remove.add_argument("name")
    listing = actions.add_parser("list", help="list the sources with their counts")
    for parser in (add, remove, listing):
        parser.add_argument(
            "--url",
            default=os.environ.get("FIELD_URL", "http://127.0.0.1:8765"),
            help="the Field's base URL (or set FIELD_URL; default http://127.0.0.1:8765)",
        )
        parser.add_argument(
            "--operator-token-file", type=Path, help="file holding the operator token"
        )
        parser.add_argument(
            "--operator-token",
            default=os.environ.get("FIELD_OPERATOR_TOKEN"),
            help="the operator token (better: FIELD_OPERATOR_TOKEN, which ps does not show)",
        )


def run(args: argparse.Namespace) -> int:
    """Send the action's request; print the answer."""
    try:
        token = _token(args)
        if args.action == "add":
            answer = _request(args.url, "POST", "/v1/sources", token, _definition(args))
        elif args.action == "remove":
            name = urllib.parse.quote(args.name, safe="")
            answer = _request(args.url, "DELETE", f"/v1/sources/{name}", token)
        else:
            answer = _request(args.url, "GET", "/v1/sources", token)
    except _Failed as failed:
        print(f"field source {args.action}: {failed}", file=sys.stderr)
        return 1 if failed.answered else 2
    print(json.dumps(answer, indent=2))
    return 0


class _Failed(Exception):
    def __init__(self, message: str, *, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


def _token(args: argparse.Namespace) -> str:
    token_file: Path | None = args.operator_token_file
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise _Failed(f"cannot read the operator token file: {exc}") from None
    if not args.operator_token:
        raise _Failed("needs --operator-token-file, FIELD_OPERATOR_TOKEN or --operator-token")
    return str(args.operator_token)


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    unit: dict[str, Any] = {"type": args.type, "content": args.content}
    for key in ("purpose", "confidence", "task_id", "session_id"):
        if getattr(args, key) is not None:
            unit[key] = getattr(args, key)
    body: dict[str, Any] = {"name": args.name, "scheme": args.scheme, "unit": unit}
    if args.secret_file is not None:
        try:
            body["secret"] = args.secret_file.read_text().strip()
        except OSError as exc:
            raise _Failed(f"cannot read the secret file: {exc}") from None
    if args.filter is not None:
        body["filter"] = args.filter
    if args.max_payload_bytes is not None:
        body["max_payload_bytes"] = args.max_payload_bytes
    return body


def _request(url: str, method: str, path: str, token: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            answer = json.loads(error.read())
            message = f"{error.code} {answer['code']}: {answer['message']}"
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {error.code}"
        raise _Failed(message, answered=True) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _Failed(f"cannot reach the Field at {url}: {exc}") from None
