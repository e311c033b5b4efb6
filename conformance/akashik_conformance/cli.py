"""``akashik-conformance URL`` (or ``field conformance URL``): run the suite, print a summary,
write the JSON report; exit 0 only when every applicable MUST check passes."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson

from .runner import run
from .wire import WireError

#: Seconds to wait for the Field to answer again after --restart-command.
RESTART_WAIT = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the Field's base URL, e.g. http://127.0.0.1:8765")
    parser.add_argument(
        "--operator-token",
        default=os.environ.get("AKASHIK_OPERATOR_TOKEN"),
        help="the operator's bearer token, for the checks that need authority above 4 "
        "(or set AKASHIK_OPERATOR_TOKEN); without it they are skipped",
    )
    parser.add_argument(
        "--restart-command",
        help="a shell command that restarts the Field (same URL, same data); allows the "
        "checks of persistence and of resuming across a restart",
    )
    parser.add_argument("--json", type=Path, help="write the JSON report to this file")
    parser.add_argument(
        "--level", type=int, choices=range(4), default=3, help="check Levels up to this one"
    )
    parser.add_argument("--check", action="append", help="run only this check (repeatable)")
    parser.add_argument(
        "--strict-should",
        action="store_true",
        help="exit 1 when any applicable check fails, SHOULD and extension checks too "
        "(a server that claims this Field's extensions)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the last lines")


def restarter(command: str, url: str) -> Callable[[], Awaitable[None]]:
    """Run ``command``, then wait until ``GET /v1/field/status`` answers again."""

    async def restart() -> None:
        process = await asyncio.create_subprocess_shell(command)
        if await process.wait() != 0:
            raise RuntimeError(f"the restart command exited with {process.returncode}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESTART_WAIT
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline:
                try:
                    async with session.get(url.rstrip("/") + "/v1/field/status") as answer:
                        if answer.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)  # polling a process we do not own: no event to await
        raise RuntimeError("the Field did not answer after the restart command")

    return restart


def execute(args: argparse.Namespace) -> int:
    restart = restarter(args.restart_command, args.url) if args.restart_command else None
    try:
        report = asyncio.run(
            run(
                args.url,
                operator_token=args.operator_token,
                restart=restart,
                ids=args.check,
                max_level=args.level,
            )
        )
    except (aiohttp.ClientError, OSError, WireError) as exc:
        print(f"cannot check {args.url}: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"no such check: {exc}", file=sys.stderr)
        return 2
    text = report.summary()
    print("\n".join(text.splitlines()[-6:]) if args.quiet else text)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    return 0 if (report.strict_ok if args.strict_should else report.ok) else 1


def main(argv: list[str] | None = None, *, prog: str = "python -m akashik_conformance") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check a running Akashik Field against the protocol, over the wire: "
        "exit 0 only when every applicable MUST check passes (with --strict-should, every "
        "applicable check), 1 otherwise, 2 when the Field cannot be reached.",
    )
    add_arguments(parser)
    return execute(parser.parse_args(argv))
