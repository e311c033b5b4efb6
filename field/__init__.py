"""field: a server that hosts an Akashik Protocol Field."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "0.1.0"
