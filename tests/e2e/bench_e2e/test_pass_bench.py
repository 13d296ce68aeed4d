"""The pass benchmark runs the controller's real pass and reports a CPU time per pass."""

from __future__ import annotations

import asyncio

from bench_e2e import pass_bench


def test_a_pass_after_one_workloads_event_is_measured() -> None:
    row = asyncio.run(pass_bench.measure(5, 3))
    assert row["workloads_waiting"] == 5 and row["passes"] == 3
    cpu = row["pass_cpu_ms"]
    assert 0 < cpu["p50"] <= cpu["p90"] and cpu["mean"] > 0
