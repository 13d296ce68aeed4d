"""The offline burst benchmark warms the waiting one-pod shapes after each gang, or also
beside its solves, and places the gangs alike either way."""

from __future__ import annotations

from bench_e2e import beside_bench
from bench_e2e import snapshot_bench as sb


def test_a_bursts_start_is_measured_with_and_without_warming_beside_the_solves() -> None:
    rows = {}
    for mode in ("after", "beside"):
        feed = sb.fleet(100, 2, 10, 0, vary=True)
        rows[mode] = beside_bench.run(feed, mode, 3, (8, 1), beside_bench.one_pod_shapes(3))
    assert rows["after"]["placed"] == rows["beside"]["placed"]
    assert rows["after"]["warmed_beside"] == 0
    for row in rows.values():
        assert row["shapes_left_cold"] == 0 and row["all_shapes_warm_s"] > 0
        firsts = row["one_pod_first_decisions"]
        assert len(firsts) == 3 and not any(f["fleet_scan"] for f in firsts)
