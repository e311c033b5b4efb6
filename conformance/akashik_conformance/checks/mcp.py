"""The MCP binding (spec 10.2), where the Field serves MCP over Streamable HTTP itself: the
tools map to operations, and an MCP agent polls ATTUNE with `since_epoch`."""

from __future__ import annotations

from typing import Any

import orjson

from ..registry import Binding, Context, Skipped, check, expect, fail
from ..wire import Agent

PROTOCOL_VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


class _Session:
    """One MCP session over Streamable HTTP, as the agent of ``agent.token``."""

    def __init__(self, ctx: Context, path: str, agent: Agent) -> None:
        self.ctx, self.path, self.agent = ctx, path, agent
        self.session_id: str | None = None
        self._ids = 0

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._ids += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._ids, "method": method}
        if params is not None:
            message["params"] = params
        return await self._post(message)

    async def notify(self, method: str) -> None:
        await self._post({"jsonrpc": "2.0", "method": method})

    async def _post(self, message: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
        answer = await self.ctx.wire.request(
            "POST", self.path, data=orjson.dumps(message), token=self.agent.token, headers=headers
        )
        if "Mcp-Session-Id" in answer.headers:
            self.session_id = answer.headers["Mcp-Session-Id"]
        if "id" not in message:
            expect(answer.status in (200, 202), f"{message['method']}: HTTP {answer.status}")
            return {}
        expect(answer.status == 200, f"{message['method']}: {answer.describe()}")
        body = answer.body
        if not isinstance(body, dict):  # an SSE answer: its last data line is the response
            fail(f"{message['method']}: the answer is not one JSON object")
        return body

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = (await self.call("tools/call", {"name": name, "arguments": arguments})).get(
            "result"
        )
        if not isinstance(result, dict):
            fail(f"{name}: no result")
        expect(result.get("isError") is not True, f"{name} failed: {result.get('content')}")
        text = result["content"][0]["text"]
        payload = orjson.loads(text)
        if not isinstance(payload, dict):
            fail(f"{name}: the result is not the operation's response")
        return payload

    async def close(self) -> None:
        if self.session_id is not None:
            await self.ctx.wire.request(
                "DELETE",
                self.path,
                token=self.agent.token,
                headers={"Mcp-Session-Id": self.session_id},
            )


async def _mcp_path(ctx: Context) -> str:
    index = await ctx.wire.request("GET", "/", headers={"Accept": "application/json"})
    links = index.body.get("links") if isinstance(index.body, dict) else None
    path = links.get("mcp") if isinstance(links, dict) else None
    if not isinstance(path, str):
        raise Skipped("the Field names no MCP endpoint (GET / links.mcp): MCP is not served")
    return path


@check("M-mcp-polling", level=2, section="10.2", binding=Binding.MCP)
async def mcp_polling(ctx: Context) -> None:
    """Over MCP the tools answer as the operations, and polling with `since_epoch` works."""
    path = await _mcp_path(ctx)
    recorder = await ctx.wire.register("mcp-rec")
    poller = await ctx.wire.register("mcp-poll")
    session = _Session(ctx, path, poller)
    try:
        init = await session.call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "akashik-conformance", "version": "0.1.0"},
            },
        )
        expect("result" in init, f"initialize: {init.get('error')}")
        await session.notify("notifications/initialized")
        listed = await session.call("tools/list")
        names = {tool["name"] for tool in listed.get("result", {}).get("tools", [])}
        wanted = {"akashik_record", "akashik_attune", "akashik_detect", "akashik_replay"}
        expect(wanted <= names, f"missing tools: {sorted(wanted - names)}")
        first = await session.tool("akashik_attune", {"scope": {"role": "r", "max_units": 5}})
        since = first["epoch"]
        unit = (await recorder.record("Seen by an MCP poller."))["memory_unit_id"]
        scope = {"role": "r", "max_units": 50}
        polled = await session.tool("akashik_attune", {"scope": scope, "since_epoch": since})
        ids = [item["memory_unit"]["id"] for item in polled["record"]]
        expect(unit in ids, "the poll does not return the unit recorded since")
        again = await session.tool(
            "akashik_attune", {"scope": scope, "since_epoch": polled["epoch"]}
        )
        expect(unit not in [i["memory_unit"]["id"] for i in again["record"]], "polled twice")
        own = await session.tool(
            "akashik_record",
            {
                "type": "finding",
                "content": "Recorded over MCP.",
                "intent": {"purpose": "conformance"},
                "confidence": {"score": 0.7, "reasoning": "the suite"},
            },
        )
        expect(own.get("status") == "accepted", f"akashik_record: {own}")
    finally:
        await session.close()
