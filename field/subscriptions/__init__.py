"""Subscriptions: the events of the log, their matching, debounced streams and bounded outboxes."""
