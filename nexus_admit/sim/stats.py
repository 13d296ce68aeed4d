"""Seed-paired comparisons: every policy sees the same arrivals on a seed, so two policies
are compared by their per-seed differences, with a 95 % confidence interval (Student's t)
saying whether one is ahead, behind or within noise of the other."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["paired_difference", "verdict"]

# two-sided 95 % quantiles of Student's t by degrees of freedom (larger: the normal's 1.96)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def _t95(dof: int) -> float:
    usable = [d for d in _T95 if d <= dof]
    return _T95[max(usable)] if dof <= 30 else 1.96


def paired_difference(ours: Sequence[float], theirs: Sequence[float], higher: bool
                      ) -> dict[str, float]:
    """Per-seed differences `ours − theirs` (signed so positive means ours is better), their
    mean and the half-width of its 95 % confidence interval (Student's t; the same seeds
    give both policies the same arrivals, so the pairing removes most of the scenario's
    noise). Half-width is inf with fewer than two seeds."""
    sign = 1.0 if higher else -1.0
    d = np.array([sign * (a - b) for a, b in zip(ours, theirs, strict=True)])
    if len(d) < 2:
        return {"mean": round(float(d.mean()), 3) if len(d) else 0.0, "ci95": math.inf}
    half = _t95(len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return {"mean": round(float(d.mean()), 3), "ci95": round(half, 3)}


def verdict(diff: dict[str, float]) -> str:
    """'ahead' / 'behind' when the 95 % interval of the paired difference excludes 0,
    otherwise 'within noise' (a difference of exactly 0 on every seed is a 'tie')."""
    if diff["mean"] == 0 and diff["ci95"] == 0:
        return "tie"
    if diff["mean"] - diff["ci95"] > 0:
        return "ahead"
    if diff["mean"] + diff["ci95"] < 0:
        return "behind"
    return "within noise"
