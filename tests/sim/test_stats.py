"""Seed-paired differences and their verdicts."""

from __future__ import annotations

import pytest

from nexus_admit.sim.stats import paired_difference, verdict


def test_paired_difference_is_signed_so_positive_means_ours_is_better() -> None:
    same_lead = paired_difference([3.0, 4.0, 5.0], [1.0, 2.0, 3.0], higher=True)
    assert same_lead == {"mean": 2.0, "ci95": 0.0}
    assert verdict(same_lead) == "ahead"
    lower_is_better = paired_difference([3.0, 4.0, 5.0], [1.0, 2.0, 3.0], higher=False)
    assert lower_is_better["mean"] == -2.0
    assert verdict(lower_is_better) == "behind"


def test_paired_difference_interval_uses_students_t() -> None:
    # differences -2 and +2: mean 0, sd 2.83, t(0.975, 1) = 12.706
    noisy = paired_difference([1.0, 5.0], [3.0, 3.0], higher=True)
    assert noisy["mean"] == 0.0
    assert noisy["ci95"] == pytest.approx(12.706 * 2 ** 1.5 / 2 ** 0.5, abs=1e-3)
    assert verdict(noisy) == "within noise"
    one_seed = paired_difference([9.0], [1.0], higher=True)
    assert verdict(one_seed) == "within noise"  # one seed says nothing about noise
    assert verdict(paired_difference([0.0, 0.0], [0.0, 0.0], higher=True)) == "tie"
