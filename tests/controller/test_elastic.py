"""`controller/elastic.py` through the pass: an elastic Job's Workload slices.

Kueue answers a running elastic Job's scale-up with a new slice that names the old one,
and finishes the old slice once the new one holds quota; the Job's pods keep the first
slice's reservation label. The new slice's reservation carries the running pods' slots
over and places only the added pods; a scale-down and reclaimable pods give slots back.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from nexus_admit.controller.lifecycle import sync_lifecycle
from nexus_admit.controller.ungater_state import UngaterState
from nexus_admit.controller.ungating.ungater import sync_ungating
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster.snapshot import build_snapshot
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import RR, check_of, cluster, controller, pending, run, watch
from tests.kube.kube_factories import pod

JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid",
       "controller": True}


def _slice(name: str, pods: int, label: str | None = None, replaces: str | None = None,
           created: str = "2025-05-01T10:00:00Z") -> dict[str, Any]:
    w = pending(name, pods=pods, gpus=4, created=created)
    w["metadata"]["ownerReferences"] = [dict(JOB)]
    w["metadata"]["annotations"] = {"kueue.x-k8s.io/elastic-job": "true"}
    if replaces:
        w["metadata"]["annotations"][L.KUEUE_WORKLOAD_SLICE_REPLACES] = f"default/{replaces}"
    if label:
        w["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {L.LABEL_RESERVATION: label}
    return w


def _pods_on(api: FakeApi, rr: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """The Job's pods bound to their slots, as kube-scheduler leaves them."""
    out = []
    for s in rr["spec"]["podSets"][0]["slots"]:
        p = pod(f"train-{s['index']}", s["node"], gpus=4, labels={L.LABEL_RESERVATION: label},
                annotations={L.ANN_SLOT: f"main/{s['index']}"})
        p["metadata"]["uid"] = f"pod-{s['index']}"
        p["metadata"]["ownerReferences"] = [dict(JOB)]
        out.append(api.put(p))
    return out


def _scaled_up(api: FakeApi, label: str) -> None:
    """What Kueue does on the scale-up 2 → 4: a new slice with quota, the old finished,
    two new pods gated (our gate and Kueue's elastic gate) with the old label."""
    old = api.get("Workload", "w1", "default")
    assert old is not None
    old["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"})
    api.put(old)
    api.put(_slice("w2", 4, label=label, replaces="w1", created="2025-05-01T10:05:00Z"))
    for i in (2, 3):
        p = pod(f"train-{i}", None, gpus=4, phase="Pending",
                labels={L.LABEL_RESERVATION: label},
                spec_extra={"schedulingGates": [{"name": L.GATE_PLACEMENT},
                                                {"name": "kueue.x-k8s.io/elastic-job"}]})
        p["metadata"]["uid"] = f"pod-{i}"
        p["metadata"]["ownerReferences"] = [dict(JOB)]
        api.put(p)


def _running_slice(nodes: tuple[str, ...] = ("n0", "n1", "n2")) -> tuple[FakeApi, Any, str]:
    api = cluster(_slice("w1", 2), nodes=nodes)
    ctx, _ = controller(api)
    run(ctx)
    (rr1,) = api.of_kind(RR)
    label = rr1["metadata"]["name"]
    _pods_on(api, rr1, label)
    watch(ctx, api)
    return api, ctx, label


def _slots(rr: dict[str, Any]) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {s["index"]: (s["node"], tuple(s["gpus"])) for s in rr["spec"]["podSets"][0]["slots"]}


def test_a_scale_up_carries_the_running_slots_over_and_places_only_the_added_pods() -> None:
    api, ctx, label = _running_slice()
    (rr1,) = api.of_kind(RR)
    _scaled_up(api, label)
    watch(ctx, api)
    run(ctx)
    rr2 = next(r for r in api.of_kind(RR) if r["spec"]["workloadRef"]["name"] == "w2")
    assert rr2["metadata"]["annotations"][L.ANN_POD_LABEL] == label
    carried, slots = _slots(rr1), _slots(rr2)
    assert sorted(slots) == [0, 1, 2, 3]
    assert {i: slots[i] for i in (0, 1)} == carried, "the running pods keep their slots"
    taken = {(n, g) for n, gpus in slots.values() for g in gpus}
    assert len(taken) == 16, "no GPU held twice"
    entry = check_of(api, "w2")
    assert entry["state"] == "Ready", entry
    assert entry["podSetUpdates"][0]["labels"][L.LABEL_RESERVATION] == rr2["metadata"]["name"]
    # the old slice's reservation is released once the new one exists, not before
    assert rr1["metadata"]["name"] in {r["metadata"]["name"] for r in api.of_kind(RR)}
    watch(ctx, api)
    run(ctx)
    assert [r["metadata"]["name"] for r in api.of_kind(RR)] == [rr2["metadata"]["name"]]
    # the added pods (old label) are pinned to the new slots
    asyncio.run(sync_ungating(ctx))
    for i in (2, 3):
        p = api.get("Pod", f"train-{i}", "default")
        assert p is not None
        assert p["metadata"]["annotations"][L.ANN_SLOT] == f"main/{i}", p["metadata"]
        assert p["spec"]["nodeSelector"][L.HOSTNAME_LABEL] == slots[i][0]
        assert [g["name"] for g in p["spec"]["schedulingGates"]] == ["kueue.x-k8s.io/elastic-job"]


def test_the_running_pods_are_counted_once_under_the_new_reservation() -> None:
    api, ctx, label = _running_slice()
    _scaled_up(api, label)
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    run(ctx)  # the old slice's reservation is released
    (rr2,) = api.of_kind(RR)
    snap = build_snapshot(api.of_kind("Node"), api.of_kind("Pod"), [rr2])
    used = sum(8 - n.free_whole_gpus for n in snap.nodes.values())
    assert used == 16, "4 pods of 4 GPUs: the bound ones counted as pods, not as slots too"


def test_the_old_reservation_holds_while_the_added_pods_wait_for_room() -> None:
    api, ctx, label = _running_slice(nodes=("n0",))
    (rr1,) = api.of_kind(RR)
    _scaled_up(api, label)
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    run(ctx)
    entry = check_of(api, "w2")
    assert entry["state"] == "Pending", entry
    assert entry["message"].startswith("waiting for room for the 2 pod(s) the scale-up adds")
    assert [r["metadata"]["name"] for r in api.of_kind(RR)] == [rr1["metadata"]["name"]]


def test_a_scale_down_and_reclaimable_pods_give_their_free_slots_back() -> None:
    api, ctx, label = _running_slice()
    _scaled_up(api, label)
    watch(ctx, api)
    run(ctx)
    watch(ctx, api)
    run(ctx)
    (rr2,) = api.of_kind(RR)
    for i in (0, 1, 2, 3):
        p = api.get("Pod", f"train-{i}", "default")
        assert p is not None
        p["spec"]["nodeName"] = _slots(rr2)[i][0]
        p["spec"]["schedulingGates"] = []
        p["metadata"]["annotations"][L.ANN_SLOT] = f"main/{i}"
        p["status"]["phase"] = "Running"
        api.put(p)
    # scale-down 4 → 2: Kueue shrinks the slice in place; pod 3 still runs, pod 2 is gone
    w2 = api.get("Workload", "w2", "default")
    assert w2 is not None
    w2 = copy.deepcopy(w2)
    w2["spec"]["podSets"][0]["count"] = 2
    api.put(w2)
    api.delete("Pod", "train-2", "default")
    watch(ctx, api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    assert sorted(_slots(rr)) == [0, 1, 3], "a slot a pod still holds is kept"
    api.delete("Pod", "train-3", "default")
    watch(ctx, api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    assert sorted(_slots(rr)) == [0, 1]
    # pod 1 finished and is not replaced: Kueue counts it reclaimable
    p1 = api.get("Pod", "train-1", "default")
    assert p1 is not None
    p1["status"]["phase"] = "Succeeded"
    api.put(p1)
    w2 = copy.deepcopy(api.get("Workload", "w2", "default"))
    assert w2 is not None
    w2["status"]["reclaimablePods"] = [{"name": "main", "count": 1}]
    api.put(w2)
    watch(ctx, api)
    run(ctx)
    (rr,) = api.of_kind(RR)
    assert sorted(_slots(rr)) == [0]
    assert check_of(api, "w2")["state"] == "Ready"


def test_a_slot_just_handed_to_a_replacement_is_not_given_back() -> None:
    """Pod 1 finished; the ungater hands its slot to the replacement (the pin in flight, not
    yet in the store) as pod 0 finishes too and Kueue counts one pod reclaimable: the slot
    given back is pod 0's, not the one the replacement's pin names."""
    api, ctx, label = _running_slice()
    for i in (0, 1):
        p = api.get("Pod", f"train-{i}", "default")
        assert p is not None
        p["status"]["phase"] = "Succeeded"
        api.put(p)
    replacement = pod("train-2", None, gpus=4, phase="Pending",
                      labels={L.LABEL_RESERVATION: label},
                      spec_extra={"schedulingGates": [{"name": L.GATE_PLACEMENT}]})
    replacement["metadata"]["uid"] = "pod-2"
    replacement["metadata"]["ownerReferences"] = [dict(JOB)]
    api.put(replacement)
    w1 = copy.deepcopy(api.get("Workload", "w1", "default"))
    assert w1 is not None
    w1["status"]["reclaimablePods"] = [{"name": "main", "count": 1}]
    api.put(w1)
    watch(ctx, api)
    ctx.component(UngaterState).claims["pod-2"] = "main/1"
    asyncio.run(sync_lifecycle(ctx))
    (rr,) = api.of_kind(RR)
    assert sorted(_slots(rr)) == [1]
