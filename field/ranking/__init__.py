"""Relevance: embedders, calibrated similarity, the learned part of interests and
the columnar scoring ATTUNE and the matcher share. Free of I/O."""
