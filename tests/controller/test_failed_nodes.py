"""A reservation's slot whose node failed moves within its domain before any pod is pinned
there, or the gang goes back through Retry (`controller/failed_nodes.py`, over `FakeApi`;
e2e/tests/test_failed_nodes.py does it on the real control plane)."""

from __future__ import annotations

import asyncio
from typing import Any

from nexus_admit.controller.ungating.ungater import sync_ungating
from nexus_admit.kube import labels as L
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import check_of, cluster, controller, pending, run, watch
from tests.controller.ungating.test_ungater import gated_pod, pinned, setup
from tests.kube.kube_factories import node
from tests.kube.kube_factories import pod as make_pod

RR = L.KIND_RESOURCE_RESERVATION
ZONE = "topology.kubernetes.io/zone"


def not_ready(api: FakeApi, name: str) -> None:
    n = api.get("Node", name)
    assert n is not None
    n["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    api.put(n)


def placed_in_zones() -> tuple[Any, FakeApi, str, str, str]:
    """One 8-GPU pod placed; its node and one other in zone a, the third in zone b."""
    api = cluster(pending("w", pods=1, gpus=8))
    ctx, _ = controller(api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    placed = rr["spec"]["podSets"][0]["slots"][0]["node"]
    mate, far = (n for n in ("n0", "n1", "n2") if n != placed)
    for name, zone in ((placed, "a"), (mate, "a"), (far, "b")):
        api.put(node(name, labels={ZONE: zone}))
    watch(ctx, api)
    return ctx, api, placed, mate, far


def slot_node(api: FakeApi) -> str:
    (rr,) = api.of_kind(RR)
    return str(rr["spec"]["podSets"][0]["slots"][0]["node"])


def test_an_unclaimed_slot_on_a_not_ready_node_moves_within_its_zone() -> None:
    ctx, api, placed, mate, _ = placed_in_zones()
    not_ready(api, placed)
    watch(ctx, api)
    run(ctx)
    assert slot_node(api) == mate
    assert check_of(api, "w")["state"] == "Ready" and api.count("create", RR) == 1
    (moved,) = [e for e in api.of_kind("Event") if e["reason"] == "SlotMoved"]
    assert f"from node {placed}, which is NotReady (Ready False: KubeletNotReady)" in moved["note"]


def test_no_room_in_its_zone_sends_the_gang_back_whatever_is_free_elsewhere() -> None:
    ctx, api, placed, mate, far = placed_in_zones()
    not_ready(api, mate)
    not_ready(api, placed)
    watch(ctx, api)
    run(ctx)
    entry = check_of(api, "w")
    assert entry["state"] == "Retry", entry
    assert f"node {placed} of slot main/0 is NotReady" in entry["message"]
    assert f"no healthy node in {ZONE}=a has room" in entry["message"]
    assert api.of_kind(RR) == [], "released"
    assert not [e for e in api.of_kind("Event") if far in e["note"] and e["reason"] == "SlotMoved"]


def test_a_bound_pod_on_a_not_ready_node_keeps_its_slot_and_its_replacement_moves() -> None:
    ctx, api, placed, mate, _ = placed_in_zones()
    (rr,) = api.of_kind(RR)
    bound = make_pod("w-0", placed, gpus=8, labels={L.LABEL_RESERVATION: rr["metadata"]["name"]},
                     annotations={L.ANN_SLOT: "main/0"},
                     spec_extra={"nodeSelector": {L.HOSTNAME_LABEL: placed}})
    api.put(bound)
    not_ready(api, placed)
    watch(ctx, api)
    run(ctx)
    assert slot_node(api) == placed, "not nexus's to delete: it may come back"
    assert api.count("delete", "Pod") == 0 and check_of(api, "w")["state"] == "Ready"
    api.delete("Pod", "w-0", "default")  # the taint eviction, or the Job's policy
    watch(ctx, api)
    run(ctx)
    assert slot_node(api) == mate
    assert check_of(api, "w")["state"] == "Ready"


def test_a_gated_pod_is_never_pinned_to_a_failed_nodes_slot() -> None:
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    not_ready(api, "n0")
    ctx.store.replace("Node", *api.list("Node"))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == (None, [{"name": L.GATE_PLACEMENT}]), "waits for the move"
    assert pinned(api, "p-1") == ("n1", [])


def test_a_pod_sets_domain_is_what_its_nodes_share_within_its_ready_selector() -> None:
    from nexus_admit.controller.failed_nodes import pod_set_domains
    from nexus_admit.kube.views import ReservationView, WorkloadView
    from tests.kube.kube_factories import reservation

    rr = reservation("rr-1", "w", [{"index": 0, "node": "a1", "gpus": [0]},
                                   {"index": 1, "node": "a2", "gpus": [0]}])
    rr["spec"]["podSets"].append({"name": "leader", "slots": [{"index": 0, "node": "gone"}]})
    nodes = {n: node(n, labels={ZONE: "a", "rack": r})
             for n, r in (("a1", "r1"), ("a2", "r2"))}
    levels = (ZONE, "rack", L.HOSTNAME_LABEL)
    workload = {"status": {"admissionChecks": [{"name": "nexus", "podSetUpdates": [
        {"name": "main", "nodeSelector": {"pool": "p"}}]}]}}
    assert pod_set_domains(ReservationView.of(rr), WorkloadView.of(workload), "nexus", nodes,
                           levels) == {
        "main": {ZONE: "a", "pool": "p"},  # its two racks: the zone they share
        "leader": {ZONE: "a"},  # its node deleted: what the gang's nodes share
    }


def test_a_pod_is_never_pinned_at_creation_to_a_failed_nodes_slot() -> None:
    """Before: the replacement of a pod lost with its NotReady node was pinned there at
    creation; now it stays gated until its slot moved, then the ungater pins it."""
    import copy

    from tests.controller.ungating.test_at_creation import answer

    for fail in ("not-ready", "cordoned"):
        ctx, _ = setup()
        n0 = copy.deepcopy(ctx.store.get("Node", "n0"))
        assert n0 is not None
        if fail == "cordoned":
            n0["spec"]["unschedulable"] = True
        else:
            n0["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
        ctx.store.upsert("Node", n0)
        assert not answer(ctx, gated_pod("p-0", 0))["patched"], fail
        assert answer(ctx, gated_pod("p-1", 1))["patched"], "a healthy node's slot is"
