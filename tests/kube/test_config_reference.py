"""docs/placement-config.md is what the model renders, and every field has a meaning."""

from __future__ import annotations

from nexus_admit.kube.config_reference import DOC, MEANINGS, field_paths, render


def test_every_field_of_the_model_has_a_meaning_and_no_meaning_is_stale() -> None:
    paths = field_paths()
    assert "weights.tierMismatch" in paths and "tiers[].classCosts" in paths
    assert sorted(set(paths) - set(MEANINGS)) == [], "fields without a meaning in MEANINGS"
    assert sorted(set(MEANINGS) - set(paths)) == [], "meanings of fields the model lacks"


def test_the_reference_in_docs_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/placement-config.md is stale: run python -m nexus_admit.kube.config_reference"
    )


def test_defaults_and_bounds_come_from_the_model() -> None:
    text = render()
    assert "| `weights.islandBroken` | integer | ≥ 0, ≤ 1000000 | `2000` |" in text
    # upper bounds too, of optional fields as well
    assert "| `reservationTtlSeconds` | integer | ≥ 10, ≤ 86400 | `600` |" in text
    assert "| `preemption.drainAfterSeconds` | number | ≥ 0.0, ≤ 604800 | absent |" in text
    assert "| `tiers` | list of objects | items ≤ 32 |" in text
    assert "| `solver.timeLimitSeconds` | number | > 0.0, ≤ 600.0 | `1.0` |" in text
    assert "`single-numa-node` \\| `preferred` \\| `none`" in text
