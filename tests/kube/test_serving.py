"""Serving Workloads as Kueue v0.19 records them: classification, the service key, the
siblings from live reservations, and the gang `ClusterDump.gang` builds."""

from __future__ import annotations

from typing import Any

import pytest
from kube_factories import cluster_queue, node, pod, pod_set, reservation, workload

from nexus_admit.controller.store import Store
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.serving import (
    ServiceIndex,
    is_serving_pod,
    service_key,
    serving_templates,
    with_siblings,
)
from nexus_admit.kube.workload import classify_workload
from nexus_admit.model import Gang, PlacementConfig, PodSet, SpreadRule, WorkloadType

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def _owned(obj: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"u-{name}",
         "controller": True}
    ]
    return obj


def _replica(
    i: int, rs: str = "web-7d9f", gpus: int = 1, spec_extra: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment's replica as Kueue v0.19 makes it: the Pod (owned by the ReplicaSet,
    labelled pod-template-hash) and its own single-pod Workload owned by the Pod, whose
    template carries only the pod spec."""
    labels = {"app": "web", "pod-template-hash": "7d9f"}
    p = _owned(pod(f"web-{i}", None, gpus=gpus, labels=labels, spec_extra=spec_extra),
               "ReplicaSet", rs)
    wl = workload(f"pod-web-{i}", [pod_set(gpus=gpus, spec_extra=spec_extra)], owner_kind=None)
    wl["spec"]["podSets"][0]["template"]["metadata"] = {}
    return p, _owned(wl, "Pod", f"web-{i}")


def _deployment(name: str = "web", rs: str = "web-7d9f") -> tuple[dict, dict]:
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": "default"}}
    rset = _owned({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": rs, "namespace": "default"}}, "Deployment", name)
    return dep, rset


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize(("gpus", "expected"),
                         [(1, WorkloadType.INFERENCE), (0, WorkloadType.SERVICE)])
def test_a_deployments_replica_classifies_from_its_owner_pod(gpus: int, expected: Any) -> None:
    p, wl = _replica(0, gpus=gpus)
    kueue = KueueIndex.of(owners=[p])
    assert kueue.owner_of(wl) is p
    assert classify_workload(wl, kueue.owner_of(wl)) is expected
    # without its Pod the Workload says nothing of what it is: Kueue copies only the spec
    assert classify_workload(wl) is WorkloadType.BATCH


def test_a_statefulsets_pod_as_its_own_workload_is_serving() -> None:
    p = _owned(pod("db-0", None, gpus=2, labels={"controller-revision-hash": "db-5c"}),
               "StatefulSet", "db")
    wl = _owned(workload("pod-db-0", [pod_set(gpus=2)], owner_kind=None), "Pod", "db-0")
    assert is_serving_pod(p)
    assert classify_workload(wl, p) is WorkloadType.INFERENCE


def test_a_serving_pod_group_classifies_as_inference() -> None:
    """A StatefulSet or LWS group: Kueue's pod-group-serving annotation on the templates."""
    ann = {"kueue.x-k8s.io/pod-group-serving": "true"}
    wl = workload("statefulset-db-1a2b", [pod_set(count=3, gpus=2, annotations=ann)],
                  owner_kind="Unknown")
    assert serving_templates(wl)
    assert classify_workload(wl) is WorkloadType.INFERENCE
    cpu = workload("g", [pod_set(count=2, gpus=0, annotations=ann)], owner_kind=None)
    assert classify_workload(cpu) is WorkloadType.SERVICE


def test_a_plain_pod_keeps_its_labels_say() -> None:
    """A plain pod (no controller) is read by its own labels; one without is batch."""
    lone = pod("lone", None, gpus=1)
    wl = _owned(workload("pod-lone", [pod_set(gpus=1)], owner_kind=None), "Pod", "lone")
    assert not is_serving_pod(lone)
    assert classify_workload(wl, lone) is WorkloadType.BATCH
    server = pod("srv", None, gpus=1, labels={"app.kubernetes.io/component": "inference"})
    assert classify_workload(wl, server) is WorkloadType.INFERENCE


# ---------------------------------------------------------------- service and siblings


def test_service_key_follows_the_owner_chain_when_the_index_has_it() -> None:
    p, wl = _replica(0)
    dep, rset = _deployment()
    assert service_key(wl, KueueIndex.of(owners=[p])) == "ReplicaSet/default/web-7d9f"
    assert service_key(wl, KueueIndex.of(owners=[p, rset, dep])) == "Deployment/default/web"
    assert service_key(wl, KueueIndex()) is None  # its Pod unknown
    sts = workload("statefulset-db-1a2b", [pod_set(count=3)], owner_kind="StatefulSet")
    assert service_key(sts, KueueIndex()) == "StatefulSet/default/statefulset-db-1a2b"
    job = workload("job-x", [pod_set()], owner_kind="Job")
    assert service_key(job, KueueIndex()) is None


def test_a_dumps_owner_lookup_reads_the_kind_it_is_asked_for() -> None:
    """A pass looks a few owners up: by kind, namespace and name, from the dump's objects
    or from the controller store's own maps (no index of every pod per pass)."""
    p, wl = _replica(0)
    dep, rset = _deployment()
    other = pod("web-0", None, namespace="tenant-b")  # same name, another namespace
    dump = ClusterDump.of([p, other, dep, rset, wl])
    store = Store()
    for o in (p, other, dep, rset, wl):
        store.upsert(str(o["kind"]), o)
    for kueue in (dump.kueue_index(), store.dump().kueue_index()):
        found = kueue.owner_of(wl)
        assert found is not None and found["metadata"]["namespace"] == "default"
        assert found["metadata"]["name"] == "web-0" and found["kind"] == "Pod"
        assert service_key(wl, kueue) == "Deployment/default/web"
        assert ("Pod", "tenant-b", "web-0") in kueue.owners
        assert ("Pod", "nowhere", "web-0") not in kueue.owners
        assert ("Workload", "default", "pod-web-0") not in kueue.owners  # never an owner
        assert len(kueue.owners) == 4 and set(kueue.owners) >= {("Deployment", "default", "web")}


def test_siblings_are_the_other_workloads_live_slots() -> None:
    pods, wls = zip(*(_replica(i) for i in range(4)), strict=True)
    kueue = KueueIndex.of(owners=list(pods))
    rrs = [
        reservation("rr0", "pod-web-0", [{"index": 0, "node": "n1", "gpus": [0]}]),
        reservation("rr1", "pod-web-1", [{"index": 0, "node": "n1", "gpus": [1]}]),
        reservation("rr2", "pod-web-2", [{"index": 0, "node": "n2", "gpus": [0]}],
                    phase="Released"),
        reservation("other", "job-x", [{"index": 0, "node": "n3", "gpus": [0]}]),
    ]
    index = ServiceIndex.of(wls, rrs, kueue)
    service = "ReplicaSet/default/web-7d9f"
    assert index.siblings(service, "default/pod-web-3") == {"n1": 2}
    assert index.siblings(service, "default/pod-web-0") == {"n1": 1}  # not its own
    assert index.siblings("ReplicaSet/default/other", "default/x") == {}


def test_with_siblings_adds_up() -> None:
    gang = Gang("ns/w", (PodSet("main", 1, gpus=1),), siblings={"a": 1})
    assert with_siblings(gang, {"a": 2, "b": 1}).siblings == {"a": 3, "b": 1}
    assert with_siblings(gang, {}) is gang


def _dump(*objects: dict[str, Any]) -> ClusterDump:
    nodes = [node(f"n{i}", gpus=8, labels={ZONE: f"z{i % 2}"}) for i in range(4)]
    return ClusterDump.of([*nodes, cluster_queue("cq", "silver"), *objects])


def test_the_dump_gives_a_replica_its_service_siblings_and_rules() -> None:
    anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}}]}}}
    p0, wl0 = _replica(0)
    p1, wl1 = _replica(1, spec_extra=anti)
    dep, rset = _deployment()
    rr0 = reservation("rr0", "pod-web-0", [{"index": 0, "node": "n1", "gpus": [0]}])
    dump = _dump(p0, p1, wl0, wl1, dep, rset, rr0)
    config = PlacementConfig()
    gang = dump.gang(wl1, config, dump.snapshot(exclude_workloads=["default/pod-web-1"]))
    assert gang.workload_type is WorkloadType.INFERENCE
    assert gang.service == "Deployment/default/web"
    assert gang.siblings == {"n1": 1}
    assert gang.spread_rules == (SpreadRule(HOST, max_per_domain=1),)


def test_the_dump_refuses_a_rule_it_cannot_honour_with_the_field() -> None:
    spread = {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "example.com/row", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"app": "web"}}}]}
    p, wl = _replica(0, spec_extra=spread)
    dump = _dump(p, wl)
    with pytest.raises(TranslationError) as err:
        dump.gang(wl, PlacementConfig(), dump.snapshot())
    assert err.value.field == "spec.podSets[0].template.spec.topologySpreadConstraints[0]" \
        ".topologyKey"
    assert "not a topology level" in str(err.value)


def test_a_workload_that_is_no_service_is_left_as_translated() -> None:
    wl = workload("job-x", [pod_set()], owner_kind="Job")
    dump = _dump(wl)
    gang = dump.gang(wl, PlacementConfig(), dump.snapshot())
    assert gang.service is None and gang.siblings == {} and gang.spread_rules == ()
