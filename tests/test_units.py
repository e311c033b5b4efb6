"""Units held encoded (field.core.units): a mapping of unit dicts that holds JSON."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from field.core.units import Units


def unit(unit_id: str, status: str = "active", **extra: Any) -> dict[str, Any]:
    return {
        "id": unit_id,
        "mode": "committed",
        "type": "finding",
        "content": "The churn rate fell to 3.1% in Q3.",
        "intent": {"purpose": "report", "task_id": None, "question": None},
        "confidence": {"score": 0.8, "reasoning": "measured"},
        "relations": [{"type": "supports", "target_id": "mem-1"}],
        "source": {"agent_id": "a", "agent_role": "analyst", "session_id": None},
        "status": status,
        "epoch": 3,
        **extra,
    }


def test_a_unit_reads_back_equal_in_its_key_order() -> None:
    units = Units()
    units.add(unit("mem-2"))
    read = units["mem-2"]
    assert read == unit("mem-2")
    assert list(read) == list(unit("mem-2"))
    assert "mem-2" in units and "mem-3" not in units and len(units) == 1
    assert units.get("mem-3") is None
    with pytest.raises(KeyError):
        units["mem-3"]


def test_changing_a_read_dict_changes_nothing_held() -> None:
    units = Units()
    units.add(unit("mem-2"))
    read = units["mem-2"]
    read["status"] = "superseded"
    read["source"]["agent_id"] = "mallory"
    assert units["mem-2"] == unit("mem-2")
    assert units["mem-2"] is not units["mem-2"]  # every read is a new dict


def test_set_status_is_the_one_change_and_returns_the_status_before() -> None:
    units = Units()
    units.add(unit("mem-2"))
    before = units.encoded("mem-2")
    assert units.set_status("mem-2", "contested") == "active"
    assert units["mem-2"] == unit("mem-2", "contested")
    # what was read before the change stays as it was: bytes never change
    assert before != units.encoded("mem-2")
    assert b'"status":"active"' in before


def test_order_pop_and_equality_are_a_dicts() -> None:
    units, plain = Units(), {}
    for n in (5, 1, 3):
        units.add(unit(f"mem-{n}"))
        plain[f"mem-{n}"] = unit(f"mem-{n}")
    assert list(units) == list(plain) and list(reversed(units)) == list(reversed(plain))
    assert units == plain and dict(units.items()) == plain
    assert units.pop("mem-1") == plain.pop("mem-1")
    assert units == plain and "mem-1" not in units
    units["mem-9"] = unit("mem-9")
    assert units["mem-9"]["id"] == "mem-9"
    del units["mem-9"]
    assert len(units) == 2


def test_a_pickle_and_a_deep_copy_hold_the_same_units() -> None:
    units = Units()
    units.add(unit("mem-2"))
    units.set_status("mem-2", "archived")
    for again in (pickle.loads(pickle.dumps(units, protocol=5)), copy.deepcopy(units)):
        assert isinstance(again, Units) and again == units
        again.set_status("mem-2", "active")
        assert units["mem-2"]["status"] == "archived"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


# (not a key of the unit, nor a parameter of unit())
@given(
    extra=st.dictionaries(st.text().filter(lambda k: k not in {*unit("x"), "unit_id"}), json_values)
)
def test_any_json_unit_reads_back_equal(extra: dict[str, Any]) -> None:
    units = Units()
    units.add(unit("mem-2", **extra))
    assert units["mem-2"] == unit("mem-2", **extra)
