"""What Kueue TAS holds (kube/cluster/tas.py): a topology assignment of a Workload with
quota reserved takes its pods' requests on the nodes it names until they are bound there
(then the pods count, once) or the Workload loses its quota or finishes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_factories import node, pod_set, tas_pod, tas_workload, topology_assignment

from nexus_admit.kube.cluster import build_snapshot
from nexus_admit.kube.cluster.tas import assignment_nodes, tas_pod_sets_of
from nexus_admit.kube.errors import Skipped, TranslationError
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.model import ClusterSnapshot

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
NODES = [node("n0"), node("n1"), node("n2")]


def snap(workloads: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = (),
         skipped: list[Skipped] | None = None) -> ClusterSnapshot:
    return build_snapshot(NODES, pods, (), workloads=workloads, now=NOW, skipped=skipped)


def free_gpus(s: ClusterSnapshot) -> dict[str, int]:
    return {n: s.nodes[n].free_whole_gpus for n in s.nodes}


def test_slices_decode_prefix_roots_suffix_and_both_pod_count_forms() -> None:
    wl = tas_workload("w", {"n0": 1})
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = {
        "levels": ["example.com/block", "kubernetes.io/hostname"],
        "slices": [
            {"domainCount": 2,
             "valuesPerLevel": [{"universal": "b1"},
                                {"individual": {"prefix": "node-", "suffix": "-a",
                                                "roots": ["1", "2"]}}],
             "podCounts": {"universal": 3}},
            {"domainCount": 1,
             "valuesPerLevel": [{"universal": "b2"}, {"universal": "node-9"}],
             "podCounts": {"individual": [2]}},
        ]}
    [ps] = tas_pod_sets_of(wl)
    assert ps.names_nodes
    assert ps.pods == {"node-1-a": 3, "node-2-a": 3, "node-9": 2}
    assert assignment_nodes(wl) == {"node-1-a", "node-2-a", "node-9"}


def test_an_assignment_holds_its_pods_requests_on_the_nodes_it_names() -> None:
    s = snap([tas_workload("w", {"n0": 2, "n1": 1}, gpus=2, cpu="4")])
    assert free_gpus(s) == {"n0": 4, "n1": 6, "n2": 8}
    assert s.nodes["n0"].free_cpu_milli == 64_000 - 2 * 4_000
    assert s.nodes["n0"].free_pods == 110 - 2


def test_a_bound_pod_of_the_assignment_is_counted_once() -> None:
    wl = tas_workload("w", {"n0": 2, "n1": 1})
    pods = [tas_pod("p0", "n0", "w"), tas_pod("p1", None, "w"),  # p1 gated, not bound yet
            tas_pod("p2", "n1", "w")]
    assert free_gpus(snap([wl], pods)) == {"n0": 4, "n1": 6, "n2": 8}
    # a pod of another Workload or pod set on the node is no pod of this assignment
    other = [tas_pod("q0", "n0", "other"), tas_pod("q1", "n0", "w", pod_set_name="x")]
    assert free_gpus(snap([wl], other))["n0"] == 0


def test_a_finished_pod_frees_nothing_while_the_workload_holds_its_quota() -> None:
    # Kueue TAS counts the assignment until the Workload finishes: a pod replaced after a
    # failure lands on the same node
    wl = tas_workload("w", {"n0": 1})
    assert free_gpus(snap([wl], [tas_pod("p0", "n0", "w", phase="Failed")]))["n0"] == 6


@pytest.mark.parametrize("conditions", [
    {"QuotaReserved": "False"},
    {"QuotaReserved": "True", "Finished": "True"},
    {},
], ids=["quota-lost", "finished", "no-conditions"])
def test_a_workload_without_quota_or_finished_holds_nothing(conditions: dict[str, str]) -> None:
    wl = tas_workload("w", {"n0": 2}, conditions=conditions)
    assert free_gpus(snap([wl]))["n0"] == 8


def test_a_node_not_in_the_snapshot_is_passed_over() -> None:
    assert free_gpus(snap([tas_workload("w", {"gone": 4, "n2": 1})]))["n2"] == 6


def test_a_mixed_workload_holds_only_its_tas_pod_set() -> None:
    wl = tas_workload("w", {"n0": 1}, others=[pod_set("workers", 2, gpus=4)])
    assert free_gpus(snap([wl])) == {"n0": 6, "n1": 8, "n2": 8}


KATA = {"kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "160Mi"}}}
CPU_DEFAULT = {"kind": "LimitRange", "metadata": {"name": "d", "namespace": "default"},
               "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "2"}}]}}


def test_an_assignment_holds_its_pods_as_the_apiserver_admits_them() -> None:
    # the template asks no CPU: its namespace's LimitRange gives the container its default
    # request and the RuntimeClass adds the pod's overhead, which the template lacks
    wl = tas_workload("w", {"n0": 2})
    spec = wl["spec"]["podSets"][0]["template"]["spec"]
    spec["runtimeClassName"] = "kata"
    del spec["containers"][0]["resources"]["requests"]["cpu"]
    admitted = KueueIndex.of(runtime_classes=[KATA], limit_ranges=[CPU_DEFAULT])
    raw = snap([wl]).nodes["n0"]
    s = build_snapshot(NODES, (), (), workloads=[wl], admitted=admitted, now=NOW)
    assert raw.free_cpu_milli == 64_000
    assert s.nodes["n0"].free_cpu_milli == 64_000 - 2 * (2_000 + 250)
    assert s.nodes["n0"].free_memory_mib == raw.free_memory_mib - 2 * 160
    # a LimitRange of another namespace gives this one nothing
    elsewhere = {**CPU_DEFAULT, "metadata": {"name": "d", "namespace": "other"}}
    s = build_snapshot(NODES, (), (), workloads=[wl],
                       admitted=KueueIndex.of(limit_ranges=[elsewhere]), now=NOW)
    assert s.nodes["n0"].free_cpu_milli == 64_000


@pytest.mark.parametrize("broken", [
    {"levels": [], "slices": []},
    {"levels": ["kubernetes.io/hostname"], "slices": [
        {"domainCount": 2, "valuesPerLevel": [{"individual": {"roots": ["n0"]}}],
         "podCounts": {"universal": 1}}]},
    {"levels": ["kubernetes.io/hostname"], "slices": [
        {"domainCount": 1, "valuesPerLevel": [{"universal": "n0"}],
         "podCounts": {"individual": [1, 2]}}]},
    {"levels": ["kubernetes.io/hostname"], "slices": "n0"},
    "n0",
], ids=["no-levels", "roots-short", "counts-long", "slices-not-a-list", "not-an-object"])
def test_a_malformed_assignment_is_left_out_and_listed(broken: Any) -> None:
    wl = tas_workload("w", {"n0": 1})
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = broken
    other = tas_workload("v", {"n1": 1})
    skipped: list[Skipped] = []
    assert free_gpus(snap([wl, other], skipped=skipped)) == {"n0": 8, "n1": 6, "n2": 8}
    assert [(s.name, s.reason) for s in skipped] == [("w", "malformed")]
    assert skipped[0].field.startswith("status.admission.podSetAssignments[0]")
    with pytest.raises(TranslationError):
        snap([wl])
    assert assignment_nodes(wl) == set()


def test_an_assignment_above_the_hostname_level_is_not_counted_and_told() -> None:
    wl = tas_workload("w", {"n0": 1})
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = (
        topology_assignment({"rack-1": 2}, levels=("example.com/rack",)))
    skipped: list[Skipped] = []
    assert free_gpus(snap([wl], skipped=skipped))["n0"] == 8
    assert [(s.name, s.reason) for s in skipped] == [("w", "not-counted")]
    assert "example.com/rack" in skipped[0].message
    assert free_gpus(snap([wl]))["n0"] == 8  # a plan: counted nowhere, nothing raised
