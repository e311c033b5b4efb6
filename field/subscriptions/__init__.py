"""Subscriptions: the events of the log, the columnar registry, the vectorized matcher and
the filter stage, allow lists, debounced streams and a durable delivery's state machine."""
