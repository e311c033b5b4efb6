"""The checks, one module per Level and one for push; importing this registers them all."""

from . import level0, level1, level2, level3, mcp, push

__all__ = ["level0", "level1", "level2", "level3", "mcp", "push"]
