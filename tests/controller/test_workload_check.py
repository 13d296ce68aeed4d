"""`workload_check.beside_other_checks`: our podSetUpdates as Kueue v0.19.2 merges them
with the other checks' (`podset.Merge` refuses a key set to two values)."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.controller.workload_check import beside_other_checks
from nexus_admit.kube.views import WorkloadView


def _workload(*theirs: dict[str, Any]) -> WorkloadView:
    return WorkloadView.of({"metadata": {"name": "w"}, "status": {"admissionChecks": [
        {"name": "prov", "state": "Ready", "podSetUpdates": list(theirs)},
        {"name": "nexus", "state": "Pending", "podSetUpdates": [
            {"name": "main", "nodeSelector": {"pool": "stale"}}]},  # our own: not theirs
    ]}})


OURS = {"name": "main", "labels": {"r": "rr-1"}, "nodeSelector": {"pool": "a", "rack": "r1"}}


@pytest.mark.parametrize(
    ("theirs", "expected"),
    [
        pytest.param({"name": "main", "nodeSelector": {"pool": "a"}}, OURS, id="same-value"),
        pytest.param(
            {"name": "main", "nodeSelector": {"pool": "b"}},
            {"name": "main", "labels": {"r": "rr-1"}, "nodeSelector": {"rack": "r1"}},
            id="theirs-stands"),
        pytest.param({"name": "other", "nodeSelector": {"pool": "b"}}, OURS,
                     id="another-pod-set"),
        pytest.param(
            {"name": "main", "annotations": {"x": "1"}, "labels": {"r": "else"}},
            {"name": "main", "nodeSelector": {"pool": "a", "rack": "r1"}},
            id="labels-too"),
    ],
)
def test_no_key_of_another_check_is_set_to_another_value(
    theirs: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert beside_other_checks([OURS], _workload(theirs), "nexus") == (expected,)


def test_one_entry_per_pod_set() -> None:
    updates = [{"name": "main", "labels": {"a": "1"}}, {"name": "main", "labels": {"b": "2"}},
               {"name": "side", "labels": {"a": "1"}}]
    assert beside_other_checks(updates, _workload(), "nexus") == (
        {"name": "main", "labels": {"a": "1", "b": "2"}}, {"name": "side", "labels": {"a": "1"}})
