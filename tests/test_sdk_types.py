"""The SDK's ``Literal`` types name exactly the values the Field accepts: the client's
signatures cannot drift from the server's validation."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from field import model
from field.client import types
from field.core import validation
from field.subscriptions.events import SUBSCRIPTION_EVENTS

PAIRS = [
    (types.MemoryType, model.MEMORY_TYPES),
    (types.UnitStatus, model.UNIT_STATUSES),
    (types.RelationType, model.RELATION_TYPES),
    (types.SubscriptionEvent, SUBSCRIPTION_EVENTS),
    (types.Strategy, model.CONFLICT_STRATEGIES),
    (types.ConflictStatus, model.CONFLICT_STATUSES),
    (types.ConflictType, model.CONFLICT_TYPES),
    (types.DetectMode, model.DETECT_MODES),
    (types.AttuneFormat, model.ATTUNE_FORMATS),
    (types.ReplayTarget, validation.REPLAY_TARGETS),
    (types.ReplayDepth, validation.REPLAY_DEPTHS),
    (types.CompactStrategy, validation.COMPACT_STRATEGIES),
]


@pytest.mark.parametrize(("literal", "accepted"), PAIRS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_literal_names_what_the_field_accepts(literal: Any, accepted: Any) -> None:
    assert set(get_args(literal)) == set(accepted)
