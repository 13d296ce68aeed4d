"""A reserved slot whose node a pod nexus-admit does not place took moves within its domain,
only the displaced gang's, or that gang alone goes back through Retry
(`controller/displaced.py`, over `FakeApi`; e2e/tests/test_displaced.py does it on the real
control plane)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from nexus_admit.controller.displaced import find_displaced
from nexus_admit.controller.ungating.ungater import sync_ungating
from nexus_admit.kube import labels as L
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import check_of, cluster, controller, pending, run, watch
from tests.controller.ungating.test_ungater import gated_pod, pinned, setup
from tests.kube.kube_factories import pod, tas_workload

RR = L.KIND_RESOURCE_RESERVATION


def _slots(api: FakeApi) -> dict[str, tuple[str, str]]:
    """Workload → (reservation uid or name, node of its slot main/0)."""
    out = {}
    for rr in api.of_kind(RR):
        slot = rr["spec"]["podSets"][0]["slots"][0]
        out[rr["spec"]["workloadRef"]["name"]] = (rr["metadata"]["name"], slot["node"])
    return out


def _two_gangs(nodes: tuple[str, ...]) -> tuple[Any, FakeApi, dict[str, tuple[str, str]]]:
    """Gangs a and b of one 8-GPU pod each, reserved (their pods not created yet)."""
    api = cluster(pending("a", pods=1, gpus=8),
                  pending("b", pods=1, gpus=8, created="2026-01-01T00:00:05Z"), nodes=nodes)
    ctx, _ = controller(api)
    run(ctx)
    watch(ctx, api)
    before = _slots(api)
    assert set(before) == {"a", "b"} and before["a"][1] != before["b"][1]
    return ctx, api, before


def _hog(api: FakeApi, ctx: Any, node: str, gpus: int = 8) -> None:
    """A pod of no queue bound onto `node` by kube-scheduler, which sees no reservation."""
    api.put(pod("hog", node, gpus=gpus))
    watch(ctx, api)


def test_a_pod_bound_onto_a_reserved_node_moves_only_the_displaced_gangs_slot() -> None:
    ctx, api, before = _two_gangs(("n0", "n1", "n2"))
    taken = before["a"][1]
    other = copy.deepcopy(api.get(RR, before["b"][0], "default"))
    _hog(api, ctx, taken)
    run(ctx)
    after = _slots(api)
    assert after["a"][0] == before["a"][0], "the same reservation, patched in place"
    assert after["a"][1] not in (taken, before["b"][1])
    assert api.get(RR, before["b"][0], "default") == other, "the other gang untouched"
    assert check_of(api, "a")["state"] == "Ready" and check_of(api, "b")["state"] == "Ready"
    (moved,) = [e for e in api.of_kind("Event") if e["reason"] == "SlotMoved"]
    assert (f"slot main/0 moved from node {taken}, which has no room left for it: what "
            "nexus-admit does not place took it (pod default/hog)") in moved["note"]
    assert api.count("create", RR) == 2


def test_no_room_in_its_domain_sends_only_the_displaced_gang_back() -> None:
    ctx, api, before = _two_gangs(("n0", "n1"))
    other = copy.deepcopy(api.get(RR, before["b"][0], "default"))
    _hog(api, ctx, before["a"][1])
    run(ctx)
    entry = check_of(api, "a")
    assert entry["state"] == "Retry", entry
    assert f"node {before['a'][1]} of slot main/0 has no room left for it" in entry["message"]
    assert check_of(api, "b")["state"] == "Ready"
    assert [rr["metadata"]["name"] for rr in api.of_kind(RR)] == [before["b"][0]]
    assert api.get(RR, before["b"][0], "default") == other


def test_a_slot_that_still_fits_beside_the_pod_stays() -> None:
    ctx, api, before = _two_gangs(("n0", "n1", "n2"))
    _hog(api, ctx, before["a"][1], gpus=0)
    run(ctx)
    assert _slots(api) == before
    assert not [e for e in api.of_kind("Event") if e["reason"] == "SlotMoved"]


def test_a_tas_assignment_naming_a_reserved_node_moves_only_that_gangs_slot() -> None:
    ctx, api, before = _two_gangs(("n0", "n1", "n2"))
    taken = before["a"][1]
    api.put(tas_workload("tas", {taken: 1}, gpus=8))  # its pods held back by another check
    watch(ctx, api)
    run(ctx)
    after = _slots(api)
    assert after["a"][0] == before["a"][0] and after["a"][1] not in (taken, before["b"][1])
    assert after["b"] == before["b"]
    (moved,) = [e for e in api.of_kind("Event") if e["reason"] == "SlotMoved"]
    assert "(TAS Workload default/tas)" in moved["note"]


def test_a_gated_pod_is_never_pinned_to_a_displaced_slot() -> None:
    ctx, api = setup(gated_pod("p-0", 0), gated_pod("p-1", 1))
    api.put(pod("hog", "n0", gpus=8))
    ctx.store.replace("Pod", *api.list("Pod"))
    asyncio.run(find_displaced(ctx))
    asyncio.run(sync_ungating(ctx))
    assert pinned(api, "p-0") == (None, [{"name": L.GATE_PLACEMENT}]), "waits for the move"
    assert pinned(api, "p-1") == ("n1", [])


def test_only_nodes_whose_objects_changed_are_counted_again(monkeypatch: Any) -> None:
    import nexus_admit.controller.displaced as displaced

    ctx, api, before = _two_gangs(("n0", "n1", "n2"))
    counted: list[str] = []
    real = displaced.displaced_slots

    def counting(node: Any, *args: Any, **kwargs: Any) -> Any:
        counted.append(node["metadata"]["name"])
        return real(node, *args, **kwargs)

    monkeypatch.setattr(displaced, "displaced_slots", counting)
    asyncio.run(find_displaced(ctx))
    assert sorted(counted) == sorted(n for _, n in before.values()), "the reserved nodes"
    counted.clear()
    asyncio.run(find_displaced(ctx))
    assert counted == [], "nothing changed"
    api.put(pod("other", before["b"][1], gpus=0))
    watch(ctx, api)
    asyncio.run(find_displaced(ctx))
    assert counted == [before["b"][1]]


def test_a_pod_bound_to_its_slot_counts_only_its_own_node_again(monkeypatch: Any) -> None:
    """The store marks every node of a running pod's reservation for the live snapshot;
    nothing on the others changed, so they are not counted again (a burst binds
    thousands of pods)."""
    import nexus_admit.controller.displaced as displaced

    api = cluster(pending("a", pods=2, gpus=8), nodes=("n0", "n1", "n2"))
    ctx, _ = controller(api)
    run(ctx)
    watch(ctx, api)
    (rr,) = api.of_kind(RR)
    slots = {s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}
    asyncio.run(find_displaced(ctx))
    counted: list[str] = []
    real = displaced._count_node

    def counting(ctx: Any, name: str) -> Any:
        counted.append(name)
        return real(ctx, name)

    monkeypatch.setattr(displaced, "_count_node", counting)
    slot = rr["spec"]["podSets"][0]["slots"][0]
    api.put(pod("a-0", slot["node"], gpus=8,
                labels={L.LABEL_RESERVATION: rr["metadata"]["name"]},
                annotations={L.ANN_SLOT: f"{rr['spec']['podSets'][0]['name']}/0"}))
    watch(ctx, api)
    feed = ctx.component(displaced.DisplacedState).feed
    assert feed is not None and feed.nodes == slots and feed.touched == {slot["node"]}
    asyncio.run(find_displaced(ctx))
    assert len(slots) == 2 and counted == [slot["node"]]
    assert all(e["reason"] != "SlotMoved" for e in api.of_kind("Event"))
