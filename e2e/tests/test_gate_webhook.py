"""The gating path of clusters before Kubernetes 1.36, run on the oldest plane (1.34).

On 1.34–1.35 the apiserver serves no `admissionregistration.k8s.io/v1`
MutatingAdmissionPolicy, so the chart's `webhook.gateMode: auto` renders `webhook`: no gate
policy, and the pod webhook gates every pod itself (its `pod-gate`, `queued-pod-gate` and
`statefulset-pod-gate` hooks). This module runs the tests that depend on who gates pods
with the controller in that mode (`NexusController(gate_mode="webhook")`, the hooks the
chart renders, checked equal in tests/charts): the test functions are the ones of their
own modules, imported, so they run once per gate mode without being copied (on the 1.36
plane they run in policy mode, this module is skipped there). The rest of the suite
(placement, leader election...) does not depend on who adds the gate and runs on 1.36 only;
the gating faults of test_faults.py run on both planes. With `webhook.pinAtCreation` (on,
as the chart ships) the gate hook answers at `/pod-gate-pin`: a Job's gang is created
pinned, never patched (test_pin_at_creation's first test). Two tests of this mode's own: every
gate above was the webhook's (no policy exists, its counter), and what an outage refuses in
this mode.

The chart in that mode is e2e/tests/test_chart_gate_webhook.py (its own module: the chart's
controller must not run beside this module's).
"""

from __future__ import annotations

import signal

import pytest
from kubernetes import client

# imported, so collected here too and run with this module's `gate_mode`
from test_controller import (  # noqa: F401
    GATE,
    test_gold_training_gang_lands_on_one_h100_rack_pinned_by_rank,
    test_malformed_annotation_is_rejected_and_foreign_reservation_denied,
    test_plain_pod_group_is_gated_placed_pinned_and_running,
)
from test_kinds_placed import (  # noqa: F401
    test_a_queue_without_the_check_is_never_touched,
    test_deployment_and_statefulset_stay_placed_and_scale,
)
from test_outage import _gates, _pod
from test_pin_at_creation import (  # noqa: F401
    test_a_gangs_pods_are_created_pinned_and_never_patched,
)

pytestmark = [pytest.mark.e2e, pytest.mark.gate_webhook, pytest.mark.timeout(360, func_only=True)]


@pytest.fixture(scope="module")
def gate_mode() -> str:
    return "webhook"


@pytest.fixture(scope="module")
def stay_seconds() -> int:
    # staying placed for 2 minutes is the policy-mode run's to show; here 30 s show that
    # no pod the webhook gated is re-created or moved once the ungater pinned it
    return 30


def test_the_pods_above_were_gated_by_the_webhook(nexus_controller, e2e_cluster) -> None:
    """Runs last (pytest keeps the module's order): no gate policy of ours exists, so every
    gate the tests above found on a pod was the webhook's, and it says it added them."""
    listed = e2e_cluster.kubectl("get", "mutatingadmissionpolicies", "-o", "name", check=False)
    if listed.returncode != 0:  # the oldest plane serves no v1 policy at all
        assert "doesn't have a resource type" in listed.stderr, listed.stderr
    policies = listed.stdout
    assert not [p for p in policies.split() if "nexus-admit" in p], policies
    gated = [
        float(line.split()[-1])
        for line in nexus_controller.metrics().splitlines()
        if line.startswith('nexus_admit_webhook_requests_total{answer="gated"}')
    ]
    # at least: the gang's 8 pods, "good"'s 1, the group's 3, the Deployment's 4 + 2 (scaled
    # up) and the StatefulSet's 3
    assert gated and gated[0] >= 21, gated


def test_controller_down_queued_pods_of_the_selected_namespaces_are_refused(
    e2e_namespace, nexus_controller, core_v1
) -> None:
    """The price of webhook mode (admin-guide, "Kubernetes versions"): with no replica
    answering, a queue-labelled pod of a namespace the webhook selects is refused, even on a
    queue without the check (the policy mode creates it: test_outage.py); a pod without a
    queue label is not the webhook's and is created. Once the controller is back, the same
    pod is created, ungated. After the metrics test: the restart resets its counters."""
    ns = e2e_namespace
    nexus_controller.stop(signal.SIGKILL)
    try:
        with pytest.raises(client.ApiException) as refused:
            core_v1.create_namespaced_pod(ns, _pod("queued", "silver"))
        assert "queued-pod-gate.scheduling.kubenexus.io" in str(refused.value.body)
        unqueued = _pod("unqueued", "silver")
        unqueued.metadata.labels = {}
        assert GATE not in _gates(core_v1.create_namespaced_pod(ns, unqueued))
    finally:
        nexus_controller.start()
    assert GATE not in _gates(core_v1.create_namespaced_pod(ns, _pod("queued", "silver")))
