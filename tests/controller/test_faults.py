"""The test-only crash points: parsed once, validated with what to write, inert when unset."""

from __future__ import annotations

import pytest

from nexus_admit.controller.faults import Faults, parse_fault
from nexus_admit.controller.options import OptionsError, RunOptions


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        pytest.param(None, None, id="unset"),
        pytest.param("kill-after-solve", ("kill-after-solve", 1), id="first-time"),
        pytest.param("kill-while-ungating:7", ("kill-while-ungating", 7), id="seventh-time"),
    ],
)
def test_parse_fault(spec, parsed) -> None:
    assert parse_fault(spec) == parsed


@pytest.mark.parametrize("spec", ["kill-now", "kill-after-solve:0", "kill-after-solve:x"])
def test_a_bad_fault_stops_the_options_with_what_to_write(spec) -> None:
    with pytest.raises(OptionsError, match="NEXUS_FAULT"):
        RunOptions(webhook=False, fault=spec).validate()


def test_hit_exits_only_at_its_point_on_the_nth_time(monkeypatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr("os._exit", exits.append)
    faults = Faults.from_spec("kill-after-reservation:2")
    faults.hit("kill-after-solve")
    faults.hit("kill-after-reservation")
    assert exits == []
    faults.hit("kill-after-reservation")
    assert exits == [137]
    Faults().hit("kill-after-solve")  # unset: inert
    assert exits == [137]
