"""The openb study's seed-paired comparison of nexus against FGD."""

from __future__ import annotations

from nexus_admit.sim.openb import OpenbRun
from nexus_admit.sim.study import BROKEN_LEVELS, paired_against


def _run(policy: str, seed: int, alloc: float, partial: int) -> OpenbRun:
    arrived = list(range(131))
    return OpenbRun("default", policy, seed, pods=10, failed=0, capacity_milli=8000,
                    seconds=1.0, place_seconds=0.5, alloc_100=alloc, alloc_130=alloc + 1,
                    curve_arrived=arrived, curve_partial8=[partial] * len(arrived))


def test_nexus_is_compared_with_fgd_on_the_seeds_both_ran() -> None:
    runs = [_run("fgd", 42, 90.0, 10), _run("fgd", 43, 91.0, 12), _run("fgd", 44, 99.0, 0),
            _run("nexus", 42, 92.0, 4), _run("nexus", 43, 93.0, 6)]
    rows = paired_against(runs)
    assert [r["metric"] for r in rows] == [
        "allocation @100 %", "allocation @130 %",
        *[f"partly idle 8-GPU nodes @{level} %" for level in BROKEN_LEVELS]]
    assert all(r["seeds"] == 2 and r["trace"] == "default" for r in rows)
    alloc = rows[0]
    assert (alloc["mean"], alloc["ci95"], alloc["verdict"]) == (2.0, 0.0, "ahead")
    idle = rows[2]  # 6 fewer partly idle nodes on both seeds: better, so positive
    assert (idle["mean"], idle["verdict"]) == (6.0, "ahead")
    assert paired_against([r for r in runs if r.policy == "fgd"]) == []
