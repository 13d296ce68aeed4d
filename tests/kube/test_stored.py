"""What the store keeps of an object (`kube/stored.py`): the fields no reader uses are gone,
and the real objects read from the e2e plane (`tests/kube/data/live_objects.json`: nodes,
a placed 2 × 8-GPU Job's pods, its Workload and reservation, Kueue's objects, with
managedFields) and the repository's sample dump translate to exactly the same snapshot and
gangs stripped as whole."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from nexus_admit.kube.dump import ClusterDump, load_dump
from nexus_admit.kube.stored import LAST_APPLIED, StoredObject, stripped

LIVE = Path(__file__).parent / "data" / "live_objects.json"
SAMPLE = Path(__file__).parents[2] / "config" / "samples" / "cluster-dump.yaml"
NOW = None


def live_dump() -> ClusterDump:
    return ClusterDump(by_kind=json.loads(LIVE.read_text()))


def stripped_dump(dump: ClusterDump) -> ClusterDump:
    return ClusterDump(
        by_kind={k: [stripped(k, o) for o in objs] for k, objs in dump.by_kind.items()}
    )


@pytest.mark.parametrize("source", ["live", "sample"])
def test_stripped_objects_translate_to_the_same_snapshot_and_gangs(source: str) -> None:
    full = live_dump() if source == "live" else load_dump(SAMPLE)
    before = copy.deepcopy(full.by_kind)
    thin = stripped_dump(full)
    assert full.by_kind == before  # stripping never changes what it is given
    skipped_full: list[Any] = []
    skipped_thin: list[Any] = []
    snapshot = full.snapshot(skipped=skipped_full)
    assert thin.snapshot(skipped=skipped_thin) == snapshot
    assert skipped_thin == skipped_full
    config = full.placement_config()
    assert thin.placement_config() == config
    assert full.kueue_index().our_checks() == thin.kueue_index().our_checks()
    workloads = full.kind("Workload")
    assert workloads
    for wl, thin_wl in zip(workloads, thin.kind("Workload"), strict=True):
        assert thin.gang(thin_wl, config, snapshot) == full.gang(wl, config, snapshot)


def test_the_live_fixture_is_what_the_apiserver_sends() -> None:
    """The fixture still holds what stripping removes (else the test above proves nothing)."""
    dump = live_dump()
    pod = dump.kind("Pod")[0]
    assert pod["metadata"]["managedFields"]
    assert pod["spec"]["containers"][0]["image"] and pod["status"]["containerStatuses"]
    assert dump.kind("Node")[0]["status"]["nodeInfo"]


def test_unread_fields_are_removed_and_read_ones_kept() -> None:
    dump = live_dump()
    pod = stripped("Pod", dump.kind("Pod")[0])
    assert "managedFields" not in pod["metadata"]
    assert set(pod["metadata"]) >= {"name", "namespace", "uid", "resourceVersion", "labels"}
    container = pod["spec"]["containers"][0]
    assert "image" not in container and container["resources"]
    assert "containerStatuses" not in pod["status"] and pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] and "volumes" not in pod["spec"]
    node = stripped("Node", dump.kind("Node")[0])
    assert node["status"]["allocatable"] and "nodeInfo" not in node["status"]
    wl = stripped("Workload", dump.kind("Workload")[0])
    template = wl["spec"]["podSets"][0]["template"]
    assert "image" not in template["spec"]["containers"][0]
    assert wl["status"]["admissionChecks"]


def test_last_applied_annotation_is_dropped_and_other_annotations_kept() -> None:
    obj = {"metadata": {"name": "a", "annotations": {LAST_APPLIED: "{}", "keep": "me"}}}
    assert stripped("ClusterQueue", obj)["metadata"]["annotations"] == {"keep": "me"}
    assert obj["metadata"]["annotations"][LAST_APPLIED] == "{}"


def test_stripping_is_idempotent_and_a_stored_object_is_returned_as_it_is() -> None:
    pod = live_dump().kind("Pod")[0]
    once = stripped("Pod", pod)
    assert isinstance(once, StoredObject) and stripped("Pod", once) is once
    assert stripped("Pod", dict(once)) == once


def test_malformed_fields_are_left_for_the_reader_to_report() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": "nonsense"}, "status": [1]}
    assert stripped("Pod", pod) == pod


def test_a_nodes_ready_condition_is_kept_without_its_heartbeats() -> None:
    node = live_dump().kind("Node")[0]
    node["status"]["conditions"] = [
        {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "t"},
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
         "lastHeartbeatTime": "t", "lastTransitionTime": "t", "message": "m"},
    ]
    kept = stripped("Node", node)["status"]["conditions"]
    assert kept == [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    broken = {"metadata": {"name": "n"}, "status": {"conditions": [1, {"type": "Ready"}]}}
    assert stripped("Node", broken)["status"]["conditions"] == [1, {"type": "Ready"}]
