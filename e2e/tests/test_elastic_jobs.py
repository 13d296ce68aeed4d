"""Issue 56 item 6 on the real control plane: an elastic Job scaled up and down.

Kueue v0.19.2 (ElasticJobsViaWorkloadSlices, on by default) answers a running elastic
Job's scale-up with a new Workload slice (annotation
`kueue.x-k8s.io/workload-slice-replacement-for`) and finishes the old slice once the new
one holds quota; the Job's new pods carry the old slice's reservation label (its template
was stamped once). The new slice's reservation carries the running pods' slots over and
places only the added pods; the running pods keep their uids and nodes, the added pods
are pinned and run, nothing is evicted. A scale-down gives the removed slots back.
Checked against the cluster's own objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import RESERVATION, SLOT, job
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, condition, wait_for
from test_controller import (
    RACK,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    check_entry,
    job_pods,
    nodes_by_name,
    running,
    slots_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

ELASTIC = "kueue.x-k8s.io/elastic-job"
REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"


def _slices(custom, ns: str, job_name: str) -> list[dict[str, Any]]:
    """The Job's Workload slices, oldest first."""
    items = custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")
    owned = [w for w in items["items"]
             if any(r.get("name") == job_name for r in w["metadata"].get("ownerReferences") or [])]
    return sorted(owned, key=lambda w: w["metadata"]["creationTimestamp"])


def _active(custom, ns: str, job_name: str) -> dict[str, Any] | None:
    live = [w for w in _slices(custom, ns, job_name) if condition(w, "Finished") != "True"]
    return live[-1] if len(live) == 1 else None


def _reservation(custom, ns: str, wl: dict[str, Any]) -> dict[str, Any]:
    name = check_entry(wl)["podSetUpdates"][0]["labels"][RESERVATION]
    return custom.get_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL, name)


def _scale(batch, ns: str, name: str, pods: int) -> None:
    batch.patch_namespaced_job(name, ns, {"spec": {"parallelism": pods}})


def _not_evicted(custom, ns: str, name: str) -> None:
    for wl in _slices(custom, ns, name):
        assert condition(wl, "Evicted") != "True", wl["status"]
        assert wl["spec"].get("active") is not False, wl["metadata"]["name"]
        assert check_entry(wl).get("state") not in ("Retry", "Rejected"), check_entry(wl)


def test_an_elastic_job_scaled_up_keeps_its_pods_and_places_only_the_added_ones(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Before: the added pods carried the old slice's reservation label and stayed gated,
    the new slice's reservation lapsed and the Job's running pods were evicted with it."""
    ns, name = nexus_namespace, "elastic"
    gang = job(name, "nexus-gold", pods=2, gpus=4, backoff_limit=6)
    gang.metadata.annotations = {ELASTIC: "true"}
    gang.spec.completions = 8
    batch_v1.create_namespaced_job(ns, gang)
    first = {p.metadata.uid: p.spec.node_name
             for p in wait_for("2 pods Running", lambda: running(core_v1, ns, name, 2),
                               timeout=120)}
    old = wait_for("one admitted slice", lambda: (w := _active(custom_objects, ns, name))
                   and check_entry(w).get("state") == "Ready" and w)

    _scale(batch_v1, ns, name, 4)

    def scaled() -> dict[str, Any] | None:
        _not_evicted(custom_objects, ns, name)
        now = {p.metadata.uid: p for p in job_pods(core_v1, ns, name)}
        for uid, node in first.items():
            assert uid in now, "a running pod was deleted"
            assert now[uid].spec.node_name == node, "a running pod moved"
        wl = _active(custom_objects, ns, name)
        if wl is None or wl["metadata"]["name"] == old["metadata"]["name"]:
            return None
        ok = check_entry(wl).get("state") == "Ready" and running(core_v1, ns, name, 4)
        return wl if ok else None

    new = wait_for("the new slice admitted, 4 pods Running", scaled, timeout=150, interval=2)
    assert new["metadata"]["annotations"][REPLACES] == f"{ns}/{old['metadata']['name']}"
    rr = _reservation(custom_objects, ns, new)
    slots = slots_of(rr)
    assert sorted(slots) == [f"main/{i}" for i in range(4)], slots
    pods = running(core_v1, ns, name, 4)
    assert pods is not None
    for p in pods:  # every pod on its slot of the new reservation: nothing counted twice
        assert slots[p.metadata.annotations[SLOT]]["node"] == p.spec.node_name
    added = [p for p in pods if p.metadata.uid not in first]
    assert len(added) == 2
    nodes = nodes_by_name(core_v1)
    racks = {nodes[n].metadata.labels.get(RACK) for n in [*first.values(),
                                                           *(p.spec.node_name for p in added)]}
    assert len(racks) == 1, f"the added pods left the running pods' rack: {racks}"
    gpus_on = {}
    for p in pods:
        gpus_on[p.spec.node_name] = gpus_on.get(p.spec.node_name, 0) + 4
    assert all(v <= 8 for v in gpus_on.values()), gpus_on

    _scale(batch_v1, ns, name, 2)

    def shrunk() -> dict[str, Any] | None:
        _not_evicted(custom_objects, ns, name)
        if running(core_v1, ns, name, 2) is None or len(job_pods(core_v1, ns, name)) != 2:
            return None
        wl = _active(custom_objects, ns, name)
        held = slots_of(_reservation(custom_objects, ns, wl)) if wl else {}
        return held if len(held) == 2 else None

    held = wait_for("2 pods Running, 2 slots held", shrunk, timeout=90, interval=2)
    left = running(core_v1, ns, name, 2)
    assert left is not None
    assert {p.metadata.annotations[SLOT] for p in left} == set(held)
    for p in left:
        assert held[p.metadata.annotations[SLOT]]["node"] == p.spec.node_name


COMPLETE = "pod-complete.stage.kwok.x-k8s.io/delay"  # e2e/kwok/pod-complete.yaml


def _finish(core, ns: str, pod: str) -> None:
    """KWOK completes the pod (Succeeded, exit code 0) now: the stage selects pods that
    carry the annotation, so only the pods a test chooses finish."""
    core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {COMPLETE: "0s"}}})


def test_a_jobs_finished_pods_give_back_their_slots_while_it_runs(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Kueue v0.19.2 counts a Job's finished pods in `status.reclaimablePods` once fewer
    pods remain than its parallelism (`job_controller.go`, `ReclaimablePods`), and frees
    their quota. The reservation gives back their slots while the Job still runs; until
    then a finished pod's slot goes to the pod that replaces it."""
    ns, name = nexus_namespace, "reclaim"
    gang = job(name, "nexus-gold", pods=2, gpus=8)
    gang.spec.completions = 3  # indexes 0 and 1 run; 2 runs once one of them succeeded
    batch_v1.create_namespaced_job(ns, gang)
    first = wait_for("2 pods Running", lambda: running(core_v1, ns, name, 2), timeout=120)
    wl = wait_for("the Workload admitted", lambda: (w := _active(custom_objects, ns, name))
                  and check_entry(w).get("state") == "Ready" and w)
    assert sorted(slots_of(_reservation(custom_objects, ns, wl))) == ["main/0", "main/1"]
    by_index = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p
                for p in first}

    _finish(core_v1, ns, by_index["0"].metadata.name)

    def replaced() -> Any:
        _not_evicted(custom_objects, ns, name)
        pods = running(core_v1, ns, name, 2)
        uids = {p.metadata.uid for p in pods or ()}
        return pods if pods and by_index["0"].metadata.uid not in uids else None

    pods = wait_for("index 2 Running beside index 1", replaced, timeout=60)
    third = next(p for p in pods if p.metadata.uid != by_index["1"].metadata.uid)
    rr = _reservation(custom_objects, ns, wl)
    assert sorted(slots_of(rr)) == ["main/0", "main/1"], "a slot went before it was free"
    assert third.metadata.annotations[SLOT] == by_index["0"].metadata.annotations[SLOT]

    _finish(core_v1, ns, by_index["1"].metadata.name)

    def reclaimed() -> dict[str, Any] | None:
        _not_evicted(custom_objects, ns, name)
        w = _active(custom_objects, ns, name)
        if w is None or (w.get("status") or {}).get("reclaimablePods") != [
                {"name": "main", "count": 1}]:
            return None
        held = slots_of(_reservation(custom_objects, ns, w))
        return held if len(held) == 1 else None

    held = wait_for("reclaimablePods 1 and one slot held", reclaimed, timeout=60, interval=1)
    left = running(core_v1, ns, name, 1)
    assert left is not None and left[0].metadata.uid == third.metadata.uid
    assert set(held) == {third.metadata.annotations[SLOT]}
    assert held[third.metadata.annotations[SLOT]]["node"] == third.spec.node_name
    assert not batch_v1.read_namespaced_job_status(name, ns).status.completion_time
