"""The asyncio engine around the pure core: the single writer, the push router (it
decides with no I/O: ``router.py``) and the hub that drives it, durable delivery,
liveness, snapshots beside the server, embedding after the commit and admission control.
It knows no web framework; the transports drive it."""
