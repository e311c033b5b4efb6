"""The event loop under write load with a sentence model: RECORD/s and the status page's latency.

    python benchmarks/loop_stall.py [--embedders hashing minilm] [--clients 32]
                                    [--seconds 10] [--warmup 1] [--rounds 2]
                                    [--period 0.01] [--target-ms 50]

For each embedder of ``--embedders`` (alternating, the order flipped every
round), starts a ``field serve --embedder NAME`` on loopback with a fresh
data directory (a durable SQLite log, ``--sync full``) and drives it as
``writes.py`` does: ``--clients`` clients, each with its own HTTP connection
and writer agent, send RECORD after RECORD (closed loop, flat out) for
``--warmup`` + ``--seconds`` seconds; a RECORD refused for now (``503
OVERLOADED``) is waited out for its ``Retry-After`` and sent again.

Beside the load, a **probe** in a process of its own (so that the load
generator's busy loop does not delay it) sends ``GET /v1/field/status``
every ``--period`` seconds on one keep-alive connection, one at a time (the
next at once after a late answer), and records each answer's latency: the
time the server's event loop took to get to it. Over the measured window it
reports p50, p99 and max, the answers slower than ``--target-ms`` and the
longest run of time with no answer (a stall). Beside them, from the
kernel's accounting of the server's main thread (the event loop), the share
of the run it ran and the share it was ready to run but waited for a CPU:
on a shared machine that share, not the server's code, is what the slowest
answers are made of.

Prints one table, a column per embedder (the median over the rounds; max:
the largest), each other embedder's RECORD/s as a ratio of the first's (the
baseline, run in the same command), and whether every status answer of
every run came within ``--target-ms`` (max) and p99 did. After each run the
script checks that the status page counts every acknowledged unit.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import bracketed, pct
from writes import FieldServer, Run, drive, get_json, new_loop

#: Seconds a probe's answer may take before the probe counts it as failed.
PROBE_TIMEOUT = 30.0


# -- the probe, in its own process ----------------------------------------------------


def probe_main(url: str, period: float) -> None:
    """GET the status page every ``period`` seconds until SIGTERM; then print one JSON
    line: ``[[sent, latency], ...]`` (perf_counter seconds, comparable across processes
    on Linux: CLOCK_MONOTONIC) and the failures."""
    host, port = url.removeprefix("http://").split(":")
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    samples: list[tuple[float, float]] = []
    failures: dict[str, int] = {}
    conn = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT)
    print("ready", flush=True)
    next_at = time.perf_counter()
    while not stop[0]:
        sent = time.perf_counter()
        try:
            conn.request("GET", "/v1/field/status")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures[str(response.status)] = failures.get(str(response.status), 0) + 1
        except (OSError, http.client.HTTPException) as error:
            failures[type(error).__name__] = failures.get(type(error).__name__, 0) + 1
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT)
        done = time.perf_counter()
        samples.append((sent, done - sent))
        next_at = max(next_at + period, done)
        time.sleep(max(0.0, next_at - time.perf_counter()))
    print(json.dumps({"samples": samples, "failures": failures}), flush=True)


class Probe:
    """The probe process against ``url``: started, then stopped for its samples."""

    def __init__(self, url: str, period: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--probe", url, "--period", str(period)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the probe did not start")

    def stop(self) -> tuple[list[tuple[float, float]], dict[str, int]]:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=PROBE_TIMEOUT + 10)
        found = json.loads(out.strip().splitlines()[-1])
        return [(s, lat) for s, lat in found["samples"]], found["failures"]


# -- one run ----------------------------------------------------------------------------


def schedstat(pid: int) -> tuple[int, int]:
    """Nanoseconds the process's main thread has run, and waited to run (Linux)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as found:
            running, waiting, _ = found.read().split()
        return int(running), int(waiting)
    except (OSError, ValueError):
        return 0, 0


@dataclass
class Result:
    rate: float
    p50_ms: float
    p99_ms: float
    status_p50: float
    status_p99: float
    status_max: float
    over_target: int
    probes: int
    #: the longest time, in the window, from one status answer to the next (ms)
    gap_max: float
    queued_after: int
    #: the server's main thread (the event loop) over the run: its share of the time
    #: running, and waiting for a CPU while it could run (percent of wall time)
    loop_running: float
    loop_waiting: float
    durable: bool
    failures: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    refusals: str = ""


def run_case(args: argparse.Namespace, name: str, label: str) -> Result:
    with tempfile.TemporaryDirectory(prefix="field-loop-") as tmp:
        flags = ["--sync", "full", "--max-queue", str(args.max_queue), "--log-level", "info"]
        flags += ["--embedder", name]
        with FieldServer(Path(tmp) / "data", *flags) as server:
            probe = Probe(server.url, args.period)
            loop, _ = new_loop()
            try:
                sched0, wall0 = schedstat(server.pid), time.perf_counter()
                run: Run = loop.run_until_complete(drive(server, args, label))
                sched1, wall1 = schedstat(server.pid), time.perf_counter()
                status = loop.run_until_complete(get_json(server.url + "/v1/field/status"))
            finally:
                samples, failures = probe.stop()
                loop.close()
    t0, t1 = run.window
    inside = [(s, lat) for s, lat in samples if s >= t0 and s + lat <= t1]
    latencies = [lat * 1000 for _, lat in inside]
    ends = sorted(s + lat for s, lat in inside)
    gaps = [(b - a) * 1000 for a, b in zip(ends, ends[1:], strict=False)]
    embedding = status.get("embedding") or {}
    return Result(
        rate=run.rate,
        p50_ms=run.latency(0.5),
        p99_ms=run.latency(0.99),
        status_p50=pct(latencies, 0.5),
        status_p99=pct(latencies, 0.99),
        status_max=max(latencies),
        over_target=sum(1 for lat in latencies if lat > args.target_ms),
        probes=len(latencies),
        gap_max=max(gaps, default=0.0),
        queued_after=int(embedding.get("queued", 0)),
        loop_running=100 * (sched1[0] - sched0[0]) / 1e9 / (wall1 - wall0),
        loop_waiting=100 * (sched1[1] - sched0[1]) / 1e9 / (wall1 - wall0),
        durable=run.status_units == run.acknowledged == run.log_units,
        failures=failures,
        errors=run.errors,
        refusals=run.refusals.describe() if run.refusals else "",
    )


ROWS = [
    ("rate", "RECORD/s", ",.0f"),
    ("p50_ms", "RECORD latency p50 ms", ".1f"),
    ("p99_ms", "RECORD latency p99 ms", ".1f"),
    ("status_p50", "status page p50 ms", ".1f"),
    ("status_p99", "status page p99 ms", ".1f"),
    ("status_max", "status page max ms", ".1f"),
    ("gap_max", "longest gap between answers ms", ".1f"),
    ("over_target", "status answers over target", "d"),
    ("probes", "status answers in the window", ",d"),
    ("queued_after", "units queued for embedding, end", ",d"),
    ("loop_running", "loop thread running, % of the run", ".0f"),
    ("loop_waiting", "loop thread waiting for a CPU, %", ".0f"),
]


def report(results: dict[str, list[Result]], args: argparse.Namespace) -> bool:
    names = list(results)
    base = names[0]
    _, loop_name = new_loop()
    print(
        f"\nThe event loop under write load: `field serve --embedder NAME` on SQLite (--sync "
        f"full), {args.clients} clients RECORD flat out (closed loop), {args.seconds:g} s "
        f"measured after {args.warmup:g} s warm-up, {args.rounds} round(s); probe: GET "
        f"/v1/field/status every {args.period * 1000:g} ms from its own process; load "
        f"generator: one Python process, {loop_name}; median over rounds (max rows: the largest)"
    )
    width = max(12, *(len(n) + 2 for n in names))
    print(f"{'figure':<36}" + "".join(f"{n:>{width}}" for n in names))
    for key, label, spec in ROWS:
        values = []
        for name in names:
            found = [getattr(r, key) for r in results[name]]
            value = (
                max(found)
                if key in ("status_max", "gap_max", "over_target")
                else (statistics.median(found))
            )
            values.append(format(int(value) if spec.endswith("d") else value, spec))
        print(f"{label:<36}" + "".join(f"{v:>{width}}" for v in values))
    base_rates = [r.rate for r in results[base]]
    for name in names[1:]:
        ratios = [r.rate / b for r, b in zip(results[name], base_rates, strict=True)]
        print(
            f"{name} RECORD/s / {base}: {statistics.median(ratios):.2f}x (rounds: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + ")"
        )
    failed = False
    for name in names:
        worst = max(r.status_max for r in results[name])
        p99 = max(r.status_p99 for r in results[name])
        print(
            f"{name}: status page within {args.target_ms:g} ms: max {worst:.1f} ms "
            f"({'yes' if worst <= args.target_ms else 'NO'}), p99 {p99:.1f} ms "
            f"({'yes' if p99 <= args.target_ms else 'NO'})"
        )
        for i, r in enumerate(results[name], 1):
            where = f"  {name} round {i}"
            if not r.durable:
                print(f"{where}: FAILED: the status page does not count every acknowledged unit")
                failed = True
            if r.errors:
                print(f"{where}: FAILED: RECORD errors {r.errors}")
                failed = True
            if r.failures:
                print(f"{where}: status probes failed {r.failures}")
            if r.refusals:
                print(f"{where}: RECORDs refused {r.refusals}")
    return failed


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        probe_main(sys.argv[2], float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedders", nargs="+", default=["hashing", "minilm"])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per case")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--period", type=float, default=0.01, help="seconds between probes")
    parser.add_argument("--target-ms", type=float, default=50.0)
    parser.add_argument("--max-queue", type=int, default=10_000, help="the servers' --max-queue")
    args = parser.parse_args()
    if args.rounds < 1 or not 1 <= args.clients <= 256 or not 0 < args.seconds <= 600:
        parser.error("--rounds must be positive, --clients in [1, 256], --seconds in (0, 600]")
    names = list(dict.fromkeys(args.embedders))
    results: dict[str, list[Result]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            results[name].append(run_case(args, name, f"{name}{round_ + 1}"))
    if report(results, args):
        print("FAILED: see the lines above")
        FAILED.append(True)


#: set by main when a run failed (the exit status, after the machine's readings)
FAILED: list[bool] = []

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        main()
    else:
        bracketed(main)
        sys.exit(1 if FAILED else 0)
