"""The six paper baselines on the openb `default` trace, full cluster, against the figures
the FGD paper published (../shared/data/README.md, `openb.PUBLISHED`: GPU allocation at
100 % and 130 % arrived, mean of seeds 42-51).

Seeds and tolerance. The project claims every baseline's 10-seed mean lands within ±0.5
points of the published figure (the full study, `docs/`). This test runs two seeds (42, 43)
to keep CI short. Measured on seeds 42-45, one run's allocation has a seed-to-seed
standard deviation of at most 0.35 points (GpuClustering at 100 % arrived; Random 0.30,
GpuPacking 0.25, DotProd 0.23, FGD 0.17, BestFit 0.14). The mean of 2 seeds then sits
within 3 × 0.35 × √(1/2 − 1/10) ≈ 0.66 points of the 10-seed mean, so it is within
0.5 + 0.66 ≈ 1.2 points of the published figure unless a baseline changed. The gaps
between the baselines are 1-4 points (GpuClustering and GpuPacking alone are 0.1 apart),
so a policy that lost its scoring or its tie-breaking also breaks the published order,
which is checked with those two taken as tied.

Runtime: twelve full-cluster runs, 6-20 s each: 88 s of CPU, 2.6 min of wall time on a
2-core machine loaded by other jobs.
"""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import pytest

from nexus_admit.sim import openb
from nexus_admit.sim.openb import PUBLISHED, run_openb

SEEDS = (42, 43)
TOLERANCE = 1.2  # points; see the module docstring
# the published order at both arrival levels, lowest first (one tie: 0.1 points apart)
ORDER = ("paper-random", "dotprod", ("gpu-clustering", "gpu-packing"), "paper-bestfit", "fgd")
POLICIES = [p for (trace, p) in PUBLISHED if trace == "default"]

needs_data = pytest.mark.skipif(
    not (openb.DEFAULT_DATA / "openb").is_dir(), reason="openb data missing"
)


@cache
def _mean(policy: str) -> tuple[float, float]:
    runs = [run_openb("default", policy, seed) for seed in SEEDS]
    return (
        sum(r.alloc_100 for r in runs) / len(runs),
        sum(r.alloc_130 for r in runs) / len(runs),
    )


def test_the_published_table_is_what_the_data_readme_says() -> None:
    assert sorted(POLICIES) == sorted(
        ["paper-random", "dotprod", "gpu-clustering", "gpu-packing", "paper-bestfit", "fgd"]
    )


@needs_data
@pytest.mark.parametrize("policy", POLICIES)
def test_baseline_lands_on_its_published_figure(policy: str) -> None:
    at_100, at_130 = _mean(policy)
    published_100, published_130 = PUBLISHED[("default", policy)]
    assert at_100 == pytest.approx(published_100, abs=TOLERANCE)
    assert at_130 == pytest.approx(published_130, abs=TOLERANCE)


@needs_data
@pytest.mark.parametrize("level", [0, 1], ids=["arrived 100 %", "arrived 130 %"])
def test_baselines_keep_the_published_order(level: int) -> None:
    means = {p: _mean(p)[level] for p in POLICIES}
    groups = [g if isinstance(g, tuple) else (g,) for g in ORDER]
    for lower, higher in pairwise(groups):
        assert max(means[p] for p in lower) < min(means[p] for p in higher), means
