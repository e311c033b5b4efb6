"""The Field: operations in, responses and log entries out, with no I/O (:mod:`.field`).

Its state is a projection of the log (:mod:`.state`); it imports the subscriptions, ranking,
expressions and the contract below it, and nothing of the engine, the transports or the
store (the layers contract in ``pyproject.toml``)."""
