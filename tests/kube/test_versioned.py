"""One remembered value per object, replaced when its version changes; an error is not kept."""

from __future__ import annotations

import pytest

from nexus_admit.kube.versioned import VersionedCache


def test_a_value_is_computed_once_per_version_and_one_entry_is_kept_per_key() -> None:
    cache: VersionedCache[str] = VersionedCache(maxsize=4)
    calls: list[str] = []

    def compute(v: str) -> str:
        calls.append(v)
        return f"value@{v}"

    assert cache.get("obj", "1", lambda: compute("1")) == "value@1"
    assert cache.get("obj", "1", lambda: compute("1")) == "value@1"
    assert cache.get("obj", "2", lambda: compute("2")) == "value@2"
    assert cache.get("obj", "1", lambda: compute("1")) == "value@1"  # replaced, not kept
    assert calls == ["1", "2", "1"]


def test_an_error_is_raised_again_rather_than_remembered() -> None:
    cache: VersionedCache[int] = VersionedCache()

    def broken() -> int:
        raise ValueError("malformed")

    for _ in range(2):
        with pytest.raises(ValueError):
            cache.get("obj", "1", broken)
    assert cache.get("obj", "1", lambda: 3) == 3
