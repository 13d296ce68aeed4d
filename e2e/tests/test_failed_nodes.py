"""Issue 56 item 4 on the real control plane: a node that fails under a reservation or a
running gang.

A slot whose node goes NotReady before a pod holds it, and the slot of a pod that left a
NotReady node, move to a healthy node of the same rack (the reservation patched in place,
an Event `SlotMoved`); the Workload keeps its admission and its running pods their uids,
and no pod is ever pinned to the dead node. The test plays the failed node's kubelet: it
writes the node's Ready condition False (KWOK, which would write it back, stops driving
that node meanwhile), and deletes the pod there as the taint eviction would. Checked
against the cluster's own objects, never the controller's view.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from builders import SLOT, job
from e2e_util import condition, wait_for
from kubernetes import client
from test_changing_fleet import _now, _sibling_ready, queue_with_a_sibling_check
from test_controller import (
    RACK,
    check_entry,
    event,
    job_pods,
    reservation_of,
    running,
    slots_of,
    wait_check,
    workload_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

HOSTNAME = "kubernetes.io/hostname"


KWOK = "kwok.x-k8s.io/node"


def _ready(core, name: str, status: str, reason: str) -> None:
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": "the e2e test",
        "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})


@contextlib.contextmanager
def not_ready(core, name: str) -> Iterator[float]:
    """Node `name` reports Ready False, its kubelet gone: KWOK stops driving it (it would
    write Ready back at once) and the test writes the condition. KWOK drives it again at
    the end, which reports it Ready. Yields the monotonic time of the write."""
    kwok = core.read_node(name).metadata.annotations[KWOK]
    core.patch_node(name, {"metadata": {"annotations": {KWOK: None}}})
    try:
        _ready(core, name, "False", "KubeletNotReady")
        yield time.monotonic()
    finally:
        core.patch_node(name, {"metadata": {"annotations": {KWOK: kwok}}})
        wait_for(f"{name} Ready again", lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in core.read_node(name).status.conditions or []), timeout=60)


def _rack(core, node: str) -> str:
    return core.read_node(node).metadata.labels[RACK]


def test_a_reserved_slot_on_a_node_gone_not_ready_moves_within_its_rack_and_the_gang_runs(
    nexus_namespace, e2e_cluster, core_v1, batch_v1, custom_objects
):
    """A reservation whose pods do not exist yet (another check of the ClusterQueue still
    Pending). Before: the gang went back through Retry at once; Kueue evicted it and reset
    the other check, so it never ran. Now: the slot moves to a node of the same rack, the
    reservation and our Ready stay, and the gang runs there once the other check is Ready."""
    ns = nexus_namespace
    with queue_with_a_sibling_check(custom_objects, ns) as queue:
        batch_v1.create_namespaced_job(ns, job("reserved", queue, pods=2, gpus=8))
        wl = wait_check(custom_objects, ns, "reserved", ("Ready",))
        rr = reservation_of(custom_objects, ns, wl)
        dead = slots_of(rr)["main/0"]["node"]
        rack = _rack(core_v1, dead)
        with not_ready(core_v1, dead) as t0:
            def moved_off() -> dict | None:
                now = workload_of(custom_objects, ns, "reserved")
                if not check_entry(now).get("podSetUpdates"):  # sent back through Retry
                    raise AssertionError(f"not moved: {check_entry(now)}")
                r = reservation_of(custom_objects, ns, now)
                return r if slots_of(r)["main/0"]["node"] != dead else None

            moved = wait_for("slot main/0 moved off the NotReady node", moved_off, timeout=60,
                             interval=0.5)
            t_moved = time.monotonic() - t0
            assert moved["metadata"]["uid"] == rr["metadata"]["uid"], "the same reservation"
            slots = slots_of(moved)
            assert dead not in {s["node"] for s in slots.values()}
            assert {_rack(core_v1, s["node"]) for s in slots.values()} == {rack}
            assert slots["main/1"] == slots_of(rr)["main/1"], "the other slot stays"
            assert event(core_v1, ns, "SlotMoved", f"moved from node {dead}")
            wl = workload_of(custom_objects, ns, "reserved")
            assert check_entry(wl)["state"] == "Ready", check_entry(wl)
            _sibling_ready(e2e_cluster, ns, wl)
            pods = wait_for("the gang Running on its moved slots", lambda: running(
                core_v1, ns, "reserved", 2), timeout=60 - (time.monotonic() - t0))
            t_running = time.monotonic() - t0
        for p in pods:
            assert p.spec.node_name == slots[p.metadata.annotations[SLOT]]["node"] != dead
        wl = workload_of(custom_objects, ns, "reserved")
        assert condition(wl, "Admitted") == "True"
        assert check_entry(wl).get("retryCount") in (None, 0), "never evicted"
        batch_v1.delete_namespaced_job("reserved", ns, propagation_policy="Background")
    print(f"\n[failed node] NotReady -> slot moved {t_moved:.1f}s, gang Running "
          f"{t_running:.1f}s (the other check answered at once)")


def test_the_replacement_of_a_pod_on_a_not_ready_node_is_pinned_to_a_healthy_node_of_its_rack(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """A running gang; one node goes NotReady and its pod there is deleted (the taint
    eviction's part; it stays Terminating, as on a node whose kubelet is gone). Before: the
    Job's replacement pod was pinned to the dead node's slot and the whole gang went back
    through Retry. Now: the slot moves within the rack, the replacement runs there without
    waiting for the old pod, the other pod keeps running."""
    ns = nexus_namespace
    # Kubernetes' backoffLimit: the pod deleted with its node is replaced, not the Job failed
    batch_v1.create_namespaced_job(ns, job("running", "nexus-gold", pods=2, gpus=8,
                                           backoff_limit=None))
    pods = wait_for("running: 2 pods Running", lambda: running(core_v1, ns, "running", 2),
                    timeout=120)
    wl = workload_of(custom_objects, ns, "running")
    rr = reservation_of(custom_objects, ns, wl)
    lost = next(p for p in pods if p.metadata.annotations[SLOT] == "main/0")
    (kept,) = [p for p in pods if p.metadata.uid != lost.metadata.uid]
    dead = lost.spec.node_name
    rack = _rack(core_v1, dead)
    with not_ready(core_v1, dead) as t0:
        # as the taint eviction deletes it: its grace period, which no kubelet on the dead
        # node ends, so it stays Terminating there while its replacement comes
        core_v1.delete_namespaced_pod(lost.metadata.name, ns)
        t_deleted = time.monotonic() - t0

        def replaced() -> list[client.V1Pod] | None:
            now = [p for p in job_pods(core_v1, ns, "running")
                   if p.metadata.uid not in (lost.metadata.uid, kept.metadata.uid)]
            for p in now:  # never pinned to the dead node, not even for a moment seen here
                assert (p.spec.node_selector or {}).get(HOSTNAME) != dead, p.spec.node_selector
            return [p for p in now if p.status.phase == "Running"] or None

        (new,) = wait_for("the replacement Running", replaced, timeout=60, interval=0.5)
        t_running = time.monotonic() - t0
    moved = reservation_of(custom_objects, ns, workload_of(custom_objects, ns, "running"))
    assert moved["metadata"]["uid"] == rr["metadata"]["uid"], "the same reservation"
    slot = slots_of(moved)["main/0"]
    assert new.metadata.annotations[SLOT] == "main/0"
    assert new.spec.node_name == slot["node"] != dead
    assert _rack(core_v1, new.spec.node_name) == rack
    still = core_v1.read_namespaced_pod(kept.metadata.name, ns)
    assert still.metadata.uid == kept.metadata.uid and still.status.phase == "Running"
    wl = workload_of(custom_objects, ns, "running")
    assert check_entry(wl).get("retryCount") in (None, 0), "never evicted"
    assert condition(wl, "Evicted") != "True"
    batch_v1.delete_namespaced_job("running", ns, propagation_policy="Background")
    print(f"\n[failed node] pod deleted {t_deleted:.1f}s after NotReady; its replacement "
          f"Running on {new.spec.node_name} {t_running:.1f}s after NotReady")
