"""Memory per push connection: server RSS before and after opening idle subscribers.

    python benchmarks/memory.py [--cases ws:10000 sse:10000 ws:1000 sse:1000 ws-deflate:1000
                                 redis:10000] [--procs 3] [--settle 3]

For each case, starts ``field serve --in-memory`` as a child process and
``--procs`` client processes (the lean clients of ``fanout.py``). Every
subscriber is its own agent, registered over HTTP, with one subscription
to ``memory.recorded``. The server's VmRSS (``/proc/<pid>/status``) is read

* **before**: after every agent and subscription exists, before any push
  connection is opened;
* **after**: once every connection has received its ``live`` frame (event)
  and ``--settle`` seconds have passed with the connections idle;
* **closed**: ``--settle`` seconds after the clients closed them all.

KB per connection = (after - before) / connections. The cost of the
agents and subscriptions themselves (before - the fresh server) is shown
for reference, per agent. Case kinds: ``ws`` (WebSocket, no extensions
offered), ``ws-deflate`` (the client offers permessage-deflate, as browsers
and the ``websockets`` library do by default, to a server started with
``--ws-deflate``, so that it accepts), ``sse`` (one stream per
subscription) and the baseline ``redis`` (a private ``redis-server`` with
that many connections SUBSCRIBEd to one channel). The machine's speed is
read before and after the run (``_common.machine_line``). A REGISTER or
SUBSCRIBE refused ``503 OVERLOADED`` or ``429 RATE_LIMITED`` is sent again
after its ``Retry-After`` (``fanout.py``'s clients); a line per case counts
the refusals by kind.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from _common import bracketed
from _refusals import Refusals
from fanout import ClientPool, raise_nofile, rss_kb, start_field, start_redis

KINDS = {
    "ws": "WebSocket",
    "ws-deflate": "WebSocket+deflate",
    "sse": "SSE",
    "redis": "Redis SUBSCRIBE",
}


def measure(kind: str, count: int, procs: int, settle: float) -> dict[str, float]:
    """RSS of a fresh server, with its agents, with the connections open, after they close."""
    if kind == "redis":
        server, port = start_redis(count)
    else:
        server, port = start_field(*(["--ws-deflate"] if kind == "ws-deflate" else []))
    pool = None
    try:
        time.sleep(1)
        fresh = rss_kb(server.pid)
        client_kind = {"ws-deflate": "ws"}.get(kind, kind)
        pool = ClientPool(client_kind, count, procs, port, deflate=kind == "ws-deflate")
        label = f"{kind} {count / 1000:g}k"
        refused = Refusals()
        for reply in pool.ask(("setup",), f"{label} setup" if kind != "redis" else None):
            refused.add(reply[2])
        time.sleep(settle)
        before = rss_kb(server.pid)
        replies = pool.ask(("connect",), f"{label} conn", timeout=300)
        opened = sum(r[1] for r in replies)
        time.sleep(settle)
        after = rss_kb(server.pid)
        pool.close()
        pool = None
        time.sleep(settle)
        closed = rss_kb(server.pid)
    finally:
        if pool is not None:
            pool.close()
        server.stop()
    return {
        "opened": opened,
        "fresh": fresh,
        "before": before,
        "after": after,
        "closed": closed,
        "per_connection": (after - before) / max(1, opened),
        "per_agent": (before - fresh) / count,
        "refused": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["ws:10000", "sse:10000", "ws:1000", "sse:1000", "ws-deflate:1000", "redis:10000"],
        help="kind:count, kind one of " + ", ".join(KINDS),
    )
    parser.add_argument("--procs", type=int, default=3, help="client processes")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before each reading")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop children on the way out
    cases = []
    for case in args.cases:
        kind, _, count = case.partition(":")
        if kind not in KINDS or not count.isdigit():
            parser.error(f"a case is kind:count, kind one of {', '.join(KINDS)}; not {case!r}")
        cases.append((kind, int(count)))
    limit = raise_nofile()
    need = max(count for _, count in cases) + 200
    if limit < need:
        parser.error(f"the open-file limit is {limit}; {need} are needed")
    rows = [(kind, count, measure(kind, count, args.procs, args.settle)) for kind, count in cases]

    print(
        f"\nServer resident memory (VmRSS, MB) with idle push connections; {args.procs} client "
        f"processes, readings {args.settle:g} s after each step"
    )
    print(
        f"{'connections':<19}{'count':>7}{'fresh':>8}{'before':>8}{'after':>8}{'closed':>8}"
        f"{'KB/conn':>9}{'KB/agent':>10}"
    )
    for kind, _, r in rows:
        agent = f"{r['per_agent']:>10.1f}" if kind != "redis" else f"{'':>10}"
        print(
            f"{KINDS[kind]:<19}{r['opened']:>7,}{r['fresh'] / 1024:>8.1f}{r['before'] / 1024:>8.1f}"
            f"{r['after'] / 1024:>8.1f}{r['closed'] / 1024:>8.1f}{r['per_connection']:>9.1f}{agent}"
        )
    for kind, count, r in rows:
        if r["refused"]:
            print(f"  {KINDS[kind]} {count:,}: set-up refused {r['refused'].describe()}")
    for kind, count, r in rows:
        if r["opened"] != count:
            print(f"  ! {KINDS[kind]} {count:,}: only {r['opened']:,} connections went live")
    redis = {count: r for kind, count, r in rows if kind == "redis"}
    for kind, count, r in rows:
        base = redis.get(count)
        if kind != "redis" and base is not None and base["per_connection"] > 0:
            ratio = r["per_connection"] / base["per_connection"]
            print(f"{KINDS[kind]} {count:,}: {ratio:.1f}x Redis's KB per subscriber connection")
    websocket = {count: r for kind, count, r in rows if kind == "ws"}
    for kind, count, r in rows:
        base = websocket.get(count)
        if kind == "sse" and base is not None:
            print(
                f"SSE {count:,}: {r['per_connection']:.1f} KB per stream beside "
                f"{base['per_connection']:.1f} KB per WebSocket"
            )
    print("target: <= 20 KB per connection")


if __name__ == "__main__":
    bracketed(main)
