"""The asyncio engine around the pure core: the single writer, the push hub,
durable delivery, liveness, snapshots beside the server, embedding after the commit and
admission control. It knows no web framework; the transports drive it."""
