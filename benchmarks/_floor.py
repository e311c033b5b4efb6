"""The floor of one HTTP round trip: a bare Starlette app served as ``field serve`` serves
the Field (uvicorn, its default loop, the httptools protocol, no access log).

    python benchmarks/_floor.py --port 0 --size full=5120 --size poll=2048

Each ``--size NAME=BYTES`` makes ``POST /NAME`` read and parse a JSON body and answer
with a JSON object of exactly ``BYTES`` bytes. Prints ``listening on http://HOST:PORT``
once it accepts connections.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Awaitable, Callable

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def body_of(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (at least 12)."""
    empty = orjson.dumps({"pad": ""})
    return orjson.dumps({"pad": "x" * max(0, size - len(empty))})


def app_of(sizes: dict[str, int]) -> Starlette:
    def endpoint(answer: bytes) -> Callable[[Request], Awaitable[Response]]:
        async def answer_it(request: Request) -> Response:
            orjson.loads(await request.body())
            return Response(answer, media_type="application/json")

        return answer_it

    routes = [
        Route(f"/{name}", endpoint(body_of(size)), methods=["POST"]) for name, size in sizes.items()
    ]
    return Starlette(routes=routes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--size", action="append", default=[], help="NAME=BYTES")
    args = parser.parse_args()
    sizes = {name: int(size) for name, size in (pair.split("=", 1) for pair in args.size)}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app_of(sizes), http="httptools", access_log=False, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    print(f"listening on http://{args.host}:{port}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
