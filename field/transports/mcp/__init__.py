"""MCP over Streamable HTTP at ``/mcp`` of ``field serve``, and the resources of its
sessions (``field mcp``, the stdio bridge, is :mod:`field.cli.mcp_bridge`)."""
