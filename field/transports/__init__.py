"""The edges: each binding decodes its own framing and does everything else through the one
front door (:mod:`.door`); the push hub's frames leave through them as WebSocket frames,
SSE events, MCP resource updates and the console's stream.

The bindings (``http``, ``sse``, ``streaming``, ``rap``, ``sources``, ``registration``,
``metrics``, ``health``, ``console``, ``mcp``) import none of one another (an independence
contract of ``lint-imports``). The composition root builds each with explicit arguments;
what they share are modules of their own: the runtime they read the started Field's parts
from (:mod:`.runtime`), the door, the answers, bodies and tokens of HTTP (:mod:`.web`), the
framing of an event stream (:mod:`.eventstream`), the ASGI application with its fast
paths (:mod:`.asgi`), and the access log, CORS, hosts, connections, bounded documents, the
index and the OpenAPI document."""
