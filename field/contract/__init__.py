"""The protocol's vocabulary, its one exception tree, the Lamport clock and the
primitives every layer uses (short texts, token buckets). Imports nothing of the Field."""
