"""Each check of the suite, as a test: see conftest.py."""

from __future__ import annotations

import pytest
from akashik_conformance import Report, Strength


def test_check(report: Report, check_id: str, strict: bool) -> None:
    result = next(r for r in report.results if r.id == check_id)
    label = f"{result.strength} (spec {result.section}): {result.title}"
    if result.outcome == "skip":
        pytest.skip(f"{check_id}: {result.detail}")
    if result.outcome == "fail":
        if result.strength != Strength.MUST and not strict:
            pytest.xfail(f"{check_id}, {label}: {result.detail}")
        pytest.fail(f"{check_id}, {label}: {result.detail}", pytrace=False)
