"""The edges: each binding decodes its own framing and does everything else through the one
front door (:mod:`.door`); the push hub's frames leave through them as WebSocket frames,
SSE events, MCP resource updates and the console's stream."""
