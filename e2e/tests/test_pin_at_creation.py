"""Pin at creation (`webhook.pinAtCreation`, on by default; `controller/ungating/
at_creation.py`) on the real control plane: the Job controller's pods get their slot's pin
in their create request from the `pod-pin` hook, after the gate policy gated them, so no pin
patch follows; with nexus-admit down the hook (failurePolicy Ignore) refuses nothing, the pod
is created gated and the ungater pins it once nexus-admit is back.

Every other module runs with the hook on too (e2e/conftest.py's `pin_at_creation`), but
test_faults.py, whose ungating faults need gated Job pods: their checks (each pod's slot is
its rank, bound to the slot's node, pinned by hostname and node name, no gate left) hold for
pods pinned at creation. This module shows that the pin came in the create request. Its
first test also runs in webhook gate mode on the oldest plane (test_gate_webhook.py), where
the gate hook gives the pin instead of the gate (`/pod-gate-pin`).
"""

from __future__ import annotations

import signal

import pytest
from e2e_util import metric, wait_for
from test_controller import (
    GATE,
    INDEX,
    SLOT,
    job,
    job_pods,
    reservation_of,
    running,
    slots_of,
    wait_check,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture(scope="module")
def pin_at_creation() -> bool:
    return True


PINNED = ("nexus_admit_webhook_requests_total", 'answer="pinned"')
UNGATED = ("nexus_admit_ungate_seconds_count", "")


def test_a_gangs_pods_are_created_pinned_and_never_patched(
    nexus_namespace, nexus_controller, core_v1, batch_v1, custom_objects
):
    ns = nexus_namespace
    pinned_before, ungated_before = metric(nexus_controller, *PINNED), metric(
        nexus_controller, *UNGATED
    )
    batch_v1.create_namespaced_job(ns, job("gang", "nexus-silver", pods=4, gpus=8))
    wl = wait_check(custom_objects, ns, "gang", ("Ready",))
    slots = slots_of(reservation_of(custom_objects, ns, wl))
    pods = wait_for("4 pods Running", lambda: running(core_v1, ns, "gang", 4), timeout=120)
    for p in pods:
        slot = p.metadata.annotations[SLOT]
        assert slot == f"main/{p.metadata.annotations[INDEX]}", p.metadata.name
        assert p.spec.node_name == slots[slot]["node"]
        assert p.spec.node_selector["kubernetes.io/hostname"] == p.spec.node_name
        assert not [g for g in p.spec.scheduling_gates or [] if g.name == GATE]
        # the spec was never updated after the create: no pin patch, no gate lifted
        assert p.metadata.generation == 1, (p.metadata.name, p.metadata.generation)
    assert metric(nexus_controller, *PINNED) - pinned_before == 4
    assert metric(nexus_controller, *UNGATED) == ungated_before


def test_with_nexus_down_a_pod_is_created_gated_and_the_ungater_pins_it_later(
    nexus_namespace, nexus_controller, core_v1, batch_v1, custom_objects
):
    ns = nexus_namespace
    batch_v1.create_namespaced_job(
        ns, job("again", "nexus-silver", pods=2, gpus=8, backoff_limit=3)
    )
    wl = wait_check(custom_objects, ns, "again", ("Ready",))
    slots = slots_of(reservation_of(custom_objects, ns, wl))
    pods = wait_for("2 pods Running", lambda: running(core_v1, ns, "again", 2), timeout=120)
    victim = pods[0]

    def replacement():
        return next(
            (p for p in job_pods(core_v1, ns, "again")
             if p.metadata.uid != victim.metadata.uid and not p.metadata.deletion_timestamp
             and p.metadata.annotations.get(INDEX) == victim.metadata.annotations[INDEX]),
            None,
        )

    nexus_controller.stop(signal.SIGKILL)
    try:
        core_v1.delete_namespaced_pod(victim.metadata.name, ns, grace_period_seconds=0)
        # the Job re-creates it after its pod-failure backoff; the hook cannot be reached
        # and refuses nothing (failurePolicy Ignore): created, with the policy's gate
        fresh = wait_for("the Job re-created the pod", replacement, timeout=90)
        assert [g.name for g in fresh.spec.scheduling_gates or []] == [GATE]
        # no pin yet (Kueue's podSetUpdates may have put the reservation's rack there)
        assert "kubernetes.io/hostname" not in (fresh.spec.node_selector or {})
    finally:
        nexus_controller.start()
    again = wait_for("both Running again", lambda: running(core_v1, ns, "again", 2), timeout=120)
    pinned = next(p for p in again if p.metadata.uid == fresh.metadata.uid)
    slot = pinned.metadata.annotations[SLOT]
    assert slot == victim.metadata.annotations[SLOT]
    assert pinned.spec.node_name == slots[slot]["node"] == victim.spec.node_name
    assert pinned.metadata.generation > 1  # the ungater's patch
