"""`kube/kueue.py`: what a Workload's other checks say (Kueue's provisioning check)."""

from __future__ import annotations

from typing import Any

import pytest

# kube.podspec imported before kube.cluster is a cycle (cluster.snapshot imports podspec)
import nexus_admit.kube.cluster  # noqa: F401
from nexus_admit.kube.kueue import (
    PROVISIONING_CONTROLLER,
    provisioned_by,
    provisioning_check_names,
    sibling_node_selectors,
    unready_provisioning_check,
)
from tests.kube.kube_factories import admission_check


def _with_checks(*entries: Any) -> dict[str, Any]:
    return {"status": {"admissionChecks": list(entries)}}


def test_provisioning_checks_are_known_by_their_controller() -> None:
    checks = [admission_check("prov", PROVISIONING_CONTROLLER), admission_check("nexus"),
              {"metadata": {"name": "bad"}, "spec": "not an object"}]
    assert provisioning_check_names(checks) == {"prov"}


def test_the_first_provisioning_check_not_ready_is_named_malformed_entries_skipped() -> None:
    wl = _with_checks("junk", {"name": "prov", "state": "Ready"},
                      {"name": "prov2", "state": "Pending", "message": "ETA 5m"},
                      {"name": "nexus", "state": "Pending"})
    assert unready_provisioning_check(wl, {"prov", "prov2"}) == ("prov2", "Pending", "ETA 5m")
    assert unready_provisioning_check(wl, {"prov"}) is None
    assert unready_provisioning_check({"status": {"admissionChecks": "x"}}, {"prov"}) is None
    assert provisioned_by(wl, {"prov", "prov2"}) == "prov"
    assert provisioned_by(wl, {"prov2"}) is None


def test_sibling_selectors_come_from_other_ready_checks_only() -> None:
    wl = _with_checks(
        {"name": "prov", "state": "Ready",
         "podSetUpdates": [{"name": "main", "nodeSelector": {"pool": "a"}}, "junk"]},
        {"name": "late", "state": "Pending",
         "podSetUpdates": [{"name": "main", "nodeSelector": {"pool": "b"}}]},
        {"name": "nexus", "state": "Ready",
         "podSetUpdates": [{"name": "main", "nodeSelector": {"rack": "r1"}}]},
    )
    assert sibling_node_selectors(wl, {"nexus"}) == {"main": {"pool": "a"}}
    wl["status"]["admissionChecks"][1]["state"] = "Ready"
    assert sibling_node_selectors(wl, {"nexus"})["main"] == {"pool": "b", "\0conflict": ""}


@pytest.mark.parametrize(("entry", "count"), [
    ({"retryCount": 3}, 3),
    ({"retryCount": "2"}, 2),
    ({}, 0),
    ({"retryCount": "many"}, 0),  # unreadable: the smallest backoff, never a crashed pass
    ({"retryCount": -1}, 0),
    ({"retryCount": True}, 0),
    ({"retryCount": [1]}, 0),
])
def test_retry_count_reads_our_entry_and_never_raises(entry: dict[str, Any], count: int
                                                     ) -> None:
    from nexus_admit.kube.kueue import retry_count

    wl = {"status": {"admissionChecks": [
        {"name": "other", "state": "Retry", "retryCount": 9},
        {"name": "nexus", "state": "Pending", **entry}, "not an entry"]}}
    assert retry_count(wl, "nexus") == count
    assert retry_count({"status": "nope"}, "nexus") == 0
