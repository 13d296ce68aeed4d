"""The pass record's timed engine: every solve's time for the histograms, and the slow ones
logged with what the engine looked at."""

from __future__ import annotations

import logging

import pytest

from nexus_admit.bench.fleet import bench_config, bench_gang, generate_fleet
from nexus_admit.controller.loop import record
from nexus_admit.placement.engine import CpSatEngine


def _solve(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, slow: float):
    monkeypatch.setattr(record, "SLOW_SOLVE_SECONDS", slow)
    policy = record.TimedPolicy(CpSatEngine())
    with caplog.at_level(logging.INFO, logger="nexus_admit.controller.loop.record"):
        placement = policy.place(generate_fleet(16, seed=3), bench_gang(1), bench_config())
    return policy, placement, [r.getMessage() for r in caplog.records]


def test_a_slow_solve_is_logged_with_what_the_engine_looked_at(monkeypatch, caplog):
    policy, placement, lines = _solve(monkeypatch, caplog, 0.0)
    (solve,) = policy.solves
    # a plain snapshot keeps nothing between decisions: the facts are derived over the fleet
    assert (solve.outcome, solve.pods, solve.facts) == ("feasible", "1", "fleet")
    assert placement.feasible
    (line,) = lines
    assert line.startswith("slow solve of bench/")
    assert "(pods 1, feasible, 16 nodes, facts fleet)" in line, line
    # the one-pod scan says how many candidates it ranked and costed
    assert "candidate nodes ranked by cost" in line, line


def test_a_quick_solve_is_only_timed(monkeypatch, caplog):
    policy, _, lines = _solve(monkeypatch, caplog, 3600.0)
    assert len(policy.solves) == 1 and policy.solves[0].cpu_seconds >= 0
    assert lines == []
