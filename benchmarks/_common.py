"""Helpers shared by the benchmark scripts: envelopes, a progress bar, percentiles."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VOCABULARY = (
    "market size growth pricing competitor churn retention revenue forecast hiring risk "
    "compliance regulation europe saas smb enterprise budget segment channel partner "
    "product roadmap launch feature adoption onboarding support security privacy audit"
).split()
ROLES = ["strategist", "market_researcher", "analyst", "engineer"]
#: ``field serve`` flags of every server a benchmark loads: one agent here sends (or is
#: sent) far more a second than the per-agent rate limits let a real agent, and the
#: figures are the server's, not its buckets'. The limits stay on, at rates no run
#: reaches, so their checks are paid as in production.
LOAD_RATES = (
    "--agent-rate", "1000000", "--agent-burst", "1000000",
    "--notify-rate", "100000000", "--notify-burst", "1000000",
)  # fmt: skip


#: the memory types the ATTUNE benchmarks' units are of
UNIT_TYPES = ["finding", "decision", "observation", "question", "assumption", "constraint"]


def unit_payload(rng: Any) -> dict[str, Any]:
    """A RECORD of the ATTUNE benchmarks: 12 random words, 4 of purpose, one of 200 tasks."""
    return {
        "type": rng.choice(UNIT_TYPES),
        "content": " ".join(rng.choices(VOCABULARY, k=12)),
        "intent": {
            "purpose": " ".join(rng.choices(VOCABULARY, k=4)),
            "task_id": f"task-{rng.randrange(200)}",
        },
        "confidence": {"score": rng.random(), "reasoning": "generated"},
    }


def envelope(operation: str, agent: str, payload: dict[str, Any], epoch: int = 0) -> Any:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": operation,
        "agent_id": agent,
        "session_id": None,
        "epoch": epoch,
        "payload": payload,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    if done % max(1, total // 50) and done != total:
        return
    bar = "#" * (30 * done // max(1, total))
    end = "\n" if done == total else ""
    print(f"\r{label:>12} [{bar:<30}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_line() -> str:
    """How fast this machine is at what the Field spends its time on, to compare runs across
    machines: a pure-Python loop (10M additions) and a 537-byte send on loopback TCP (a
    notification's write to one subscriber's socket), each the best of three."""
    import multiprocessing
    import os
    import socket
    import time

    def loop() -> float:
        start = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        return time.perf_counter() - start

    def drain(port: int, size: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as reader:
            got = 0
            while got < size:
                data = reader.recv(1 << 20)
                if not data:
                    return
                got += len(data)

    def sends(count: int = 20_000, size: int = 537) -> float:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            child = multiprocessing.get_context("fork").Process(
                target=drain, args=(port, count * size)
            )
            child.start()
            sender, _ = listener.accept()
            with sender:
                sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                data = b"x" * size
                start = time.perf_counter()
                for _ in range(count):
                    sender.sendall(data)
                elapsed = time.perf_counter() - start
            child.join()
        return elapsed / count

    python = min(loop() for _ in range(3))
    send = min(sends() for _ in range(3))
    return (
        f"machine: {os.cpu_count()} CPUs; a Python loop of 10M additions takes {python:.2f} s; "
        f"a 537-byte loopback TCP send {send * 1e6:.1f} us"
    )


def bracketed(main: Any) -> None:
    """Run a benchmark's ``main`` between two readings of :func:`machine_line`, printed after
    its figures (a shared machine's speed can change from one minute to the next)."""
    before = machine_line()
    main()
    print(f"before the run, {before}\nafter the run,  {machine_line()}")


#: Server flags of the baseline: no admission control, only the queue's bound.
NO_ADMISSION = (
    "--overload-write-target=0",
    "--overload-read-target=0",
    "--overload-write-budget=0",
)
