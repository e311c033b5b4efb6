"""MCP over Streamable HTTP at ``/mcp`` of ``field serve`` (both protocol eras), the
resources of its sessions and agents, and MCP 2026-07-28's listen streams (``field mcp``,
the stdio bridge that relays them, is :mod:`field.cli.mcp_bridge`)."""
