"""A conformance suite for Akashik Protocol Fields, spoken over the wire only.

Point it at a Field's base URL (``python -m akashik_conformance URL``) and it checks the
requirements of the Akashik specification 0.1.0, grouped by Level and binding.
"""

from .registry import REGISTRY, Binding, Check, Context, Failed, Skipped, Strength, check
from .runner import Report, Result, run

__all__ = [
    "REGISTRY",
    "Binding",
    "Check",
    "Context",
    "Failed",
    "Report",
    "Result",
    "Skipped",
    "Strength",
    "check",
    "run",
]
