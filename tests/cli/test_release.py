"""What `nexus-admit release` would write: every Pending entry of our checks on a Workload
with quota reserved, every pod with our gate; nothing of anyone else's, no crash on junk.
(e2e/tests/test_outage.py runs the command against the real control plane.)"""

from __future__ import annotations

from typing import Any

from nexus_admit.commands.release import plan_release
from nexus_admit.kube import labels as L

CHECKS = [
    {"metadata": {"name": "nexus"}, "spec": {"controllerName": L.ADMISSION_CHECK_CONTROLLER}},
    {"metadata": {"name": "prov"}, "spec": {"controllerName": "kueue.x-k8s.io/provisioning"}},
]


def workload(name: str, *entries: tuple[str, str], reserved: bool = True) -> dict[str, Any]:
    conds = [{"type": "QuotaReserved", "status": "True" if reserved else "False"}]
    return {
        "metadata": {"name": name, "namespace": "t"},
        "status": {
            "conditions": conds,
            "admissionChecks": [{"name": n, "state": s} for n, s in entries],
        },
    }


def pod(name: str, *gates: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t"},
        "spec": {"schedulingGates": [{"name": g} for g in gates]},
    }


def test_only_our_pending_checks_and_our_gates_are_released() -> None:
    workloads = [
        workload("waits", ("nexus", "Pending"), ("prov", "Pending")),
        workload("placed", ("nexus", "Ready")),
        workload("not-reserved", ("nexus", "Pending"), reserved=False),
        workload("other-check-only", ("prov", "Pending")),
        {"metadata": {"name": "junk", "namespace": "t"}, "status": "x"},
        "junk",
    ]
    pods = [
        pod("gated", L.GATE_PLACEMENT, "kueue.x-k8s.io/admission"),
        pod("kueue-only", "kueue.x-k8s.io/admission"),
        pod("free"),
        {"metadata": {"name": "odd", "namespace": "t"}, "spec": {"schedulingGates": "x"}},
    ]
    plan = plan_release(CHECKS, workloads, pods)  # type: ignore[arg-type]
    assert plan.checks == [("t", "waits", "nexus")]
    assert plan.pods == [("t", "gated")]


def test_nothing_to_release_after_a_release() -> None:
    plan = plan_release(CHECKS, [workload("w", ("nexus", "Ready"))], [pod("p")])
    assert plan.checks == [] and plan.pods == []
