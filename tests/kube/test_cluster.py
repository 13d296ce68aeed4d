"""Fault isolation in the snapshot (issue 28, item 1): with `skipped`, one malformed object
is left out and listed with its field, everyone else is placed, and nothing is freer than
the truth: an unreadable share counts whole GPUs, an unreadable zone counts in every zone,
an unreadable expiry is live, and a use of capacity that cannot be read at all takes its
node out of placement. Without `skipped` (`plan`), the first one raises as before."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kube_factories import node, nrt, pod, reservation

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster import build_snapshot
from nexus_admit.kube.errors import Skipped, TranslationError
from nexus_admit.model import ClusterSnapshot

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def strict_raises(**kw: Any) -> None:
    with pytest.raises(TranslationError):
        build_snapshot(
            kw.pop("nodes", [node("n0"), node("n1")]),
            kw.pop("pods", ()),
            kw.pop("rrs", ()),
            now=NOW,
            **kw,
        )


def free_gpus(snap: ClusterSnapshot, name: str) -> float:
    return sum(snap.nodes[name].gpu_free) / 1000


def test_a_bound_pod_with_a_bad_gpu_fraction_counts_its_whole_gpus() -> None:
    bad = pod("odd", "n0", namespace="other", gpus=2, annotations={L.ANN_GPU_FRACTION: "lol"})
    strict_raises(pods=[bad])
    snap, skipped = lenient_snapshot(pods=[bad])
    assert free_gpus(snap, "n0") == 6 and free_gpus(snap, "n1") == 8
    (s,) = skipped
    assert (s.kind, s.namespace, s.name, s.reason) == ("Pod", "other", "odd", "counted-whole")
    assert s.field == f"metadata.annotations[{L.ANN_GPU_FRACTION}]"
    assert "'lol' is not a GPU share" in s.message and "2 whole GPU(s)" in s.message


def test_a_bad_gpu_fraction_on_a_replicated_node_still_counts_whole_devices() -> None:
    shared = node("n0", labels={L.GFD_GPU_REPLICAS: "4"}, gpus=32)  # 8 devices × 4 replicas
    bad = pod("odd", "n0", gpus=1, annotations={L.ANN_GPU_FRACTION: "2"})  # above 1
    snap, skipped = lenient_snapshot(nodes=[shared], pods=[bad])
    assert free_gpus(snap, "n0") == 7  # one whole device, not a quarter
    assert [s.reason for s in skipped] == ["counted-whole"]


def test_a_bound_pod_with_a_bad_numa_zone_takes_its_cpu_from_every_zone() -> None:
    bad = pod("odd", "n0", cpu="10", annotations={L.ANN_NUMA_ZONE: "zone-a"})
    nrts = [nrt("n0", [("32", 4), ("32", 4)])]
    strict_raises(pods=[bad], node_resource_topologies=nrts)
    snap, skipped = lenient_snapshot(pods=[bad], node_resource_topologies=nrts)
    assert [z.free_cpu_milli for z in snap.nodes["n0"].numa_zones] == [22000, 22000]
    (s,) = skipped
    assert s.reason == "counted-every-zone"
    assert s.field == f"metadata.annotations[{L.ANN_NUMA_ZONE}]"


def test_a_bound_pod_whose_requests_cannot_be_read_takes_its_node_out() -> None:
    bad = pod("odd", "n0", cpu="banana")
    snap, skipped = lenient_snapshot(pods=[bad, pod("fine", "n1", gpus=8)])
    assert set(snap.nodes) == {"n1"} and free_gpus(snap, "n1") == 0
    (s,) = skipped
    assert s.reason == "node-left-out" and "so that node is left out" in s.message
    assert s.field == "spec.containers[0].resources.requests[cpu]"


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({L.LABEL_NUMA_ZONES: "lots"}, f"metadata.labels[{L.LABEL_NUMA_ZONES}]"),
        ({L.GFD_GPU_REPLICAS: "-2"}, f"metadata.labels[{L.GFD_GPU_REPLICAS}]"),
        ({L.GFD_GPU_MEMORY: "80GB"}, f"metadata.labels[{L.GFD_GPU_MEMORY}]"),
    ],
)
def test_a_node_with_a_malformed_label_is_left_out_and_the_others_stay(
    labels: dict[str, str], field: str
) -> None:
    nodes = [node("n0", labels=labels), node("n1")]
    strict_raises(nodes=nodes)
    snap, skipped = lenient_snapshot(nodes=nodes)
    assert set(snap.nodes) == {"n1"}
    (s,) = skipped
    assert (s.kind, s.name, s.field, s.reason) == ("Node", "n0", field, "malformed")


def test_a_malformed_node_resource_topology_leaves_its_node_out() -> None:
    bad = nrt("n0", [("32", 4), ("32", 4)])
    bad["zones"][0]["resources"][0]["allocatable"] = "many"
    snap, skipped = lenient_snapshot(node_resource_topologies=[bad])
    assert set(snap.nodes) == {"n1"}
    (s,) = skipped
    assert (s.kind, s.name) == ("NodeResourceTopology", "n0")
    assert s.field == "zones[0].resources[0]"


def test_a_malformed_resource_slice_is_left_out() -> None:
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": "s"}, "spec": "junk"}  # fmt: skip
    snap, skipped = lenient_snapshot(resource_slices=[bad])
    assert set(snap.nodes) == {"n0", "n1"}
    assert [(s.kind, s.field) for s in skipped] == [("ResourceSlice", "spec")]


def test_a_reservation_that_cannot_be_read_takes_the_nodes_it_names_out() -> None:
    bad = reservation("rr", "w", [{"index": 0, "node": "n0", "gpus": [0]}], gpu_share="lots")
    strict_raises(rrs=[bad])
    snap, skipped = lenient_snapshot(rrs=[bad])
    assert set(snap.nodes) == {"n1"}
    (s,) = skipped
    assert (s.kind, s.name, s.reason) == ("ResourceReservation", "rr", "node-left-out")
    assert s.owner == "Workload default/w" and "(n0)" in s.message


def test_a_reservation_with_an_unreadable_expiry_is_counted_live() -> None:
    bad = reservation("rr", "w", [{"index": 0, "node": "n0", "gpus": [0, 1]}], expires_at="soon")
    strict_raises(rrs=[bad])
    snap, skipped = lenient_snapshot(rrs=[bad])
    assert free_gpus(snap, "n0") == 6
    (s,) = skipped
    assert (s.reason, s.field) == ("counted-live", "spec.expiresAt")


def test_a_malformed_topology_is_left_out() -> None:
    bad = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Topology",
           "metadata": {"name": "t"}, "spec": {"levels": []}}  # fmt: skip
    snap, skipped = lenient_snapshot(topologies=[bad])
    assert snap.kueue_topologies == {}
    assert [(s.kind, s.field) for s in skipped] == [("Topology", "spec.levels")]


def lenient_snapshot(**kw: Any) -> tuple[ClusterSnapshot, list[Skipped]]:
    skipped: list[Skipped] = []
    snap = build_snapshot(
        kw.pop("nodes", [node("n0"), node("n1")]),
        kw.pop("pods", ()),
        kw.pop("rrs", ()),
        now=NOW,
        skipped=skipped,
        **kw,
    )
    return snap, skipped


def test_past_its_ttl_a_reservation_with_a_bound_pod_still_holds_its_other_slots() -> None:
    """Before: after expiresAt a bound gang's reservation stopped counting, so the slot of
    a restarting pod was free for another gang while the ungater pinned the new pod to it."""
    rr = reservation(
        "rr",
        "w",
        [{"index": 0, "node": "n0", "gpus": list(range(8))},
         {"index": 1, "node": "n1", "gpus": list(range(8))}],
        expires_at="2000-01-01T00:00:00Z",
    )  # fmt: skip
    running = pod("p-0", "n0", gpus=8, labels={L.LABEL_RESERVATION: "rr"},
                  annotations={L.ANN_SLOT: "main/0"})  # fmt: skip
    snap, skipped = lenient_snapshot(pods=[running], rrs=[rr])
    assert free_gpus(snap, "n1") == 0 and skipped == []
    snap, _ = lenient_snapshot(rrs=[rr])  # never bound: the TTL frees it
    assert free_gpus(snap, "n1") == 8
