"""Two nexus-admit replicas with leader election on the real control plane: only the Lease
holder decides, both serve the pod webhook, and when the leader is SIGKILLed mid-burst the
other takes over within about one lease duration and finishes the burst with nothing lost
or double-booked (the invariants of test_faults.py, read from the cluster's objects).

The webhook: in a cluster the chart's Service spreads webhook calls over every ready
replica. The local control plane has no Service proxy, and a MutatingWebhookConfiguration
webhook has one clientConfig, so here it points by URL at the replica that survives (the
follower), and each replica's webhook is also called directly with an AdmissionReview to
show that both serve it. Handover times are printed (run with -s).
"""

from __future__ import annotations

import json
import signal
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import demo
import pytest
from builders import create_local_queue
from e2e_util import GPU, QUEUE_LABEL, condition, metric, wait_for
from kubernetes import client
from nexus_controller import NexusController
from test_controller import GATE
from test_faults import (
    BURST,
    all_reservations,
    all_workloads,
    assert_invariants,
    settle_other_namespaces,
    submit_burst,
    wait_answered,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420, func_only=True)]

LEASE_SECONDS = 15  # the defaults of `nexus-admit run`
RETRY_SECONDS = 2
LEASE_NS = "default"


def is_leader(nc: NexusController) -> bool:
    try:
        return metric(nc, "nexus_admit_leader") == 1
    except OSError:
        return False


def lease_holder(custom: client.CustomObjectsApi, name: str) -> str:
    coordination = client.CoordinationV1Api(custom.api_client)
    try:
        return coordination.read_namespaced_lease(name, LEASE_NS).spec.holder_identity or ""
    except client.ApiException:
        return ""


def plain_pod(name: str, group: str, count: int) -> client.V1Pod:
    worker = client.V1Container(
        name="c",
        image="registry.invalid/nexus/worker:e2e",
        resources=client.V1ResourceRequirements(
            requests={"cpu": "2", "memory": "8Gi", GPU: "1"}, limits={GPU: "1"}
        ),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={QUEUE_LABEL: "nexus-bronze", "kueue.x-k8s.io/pod-group-name": group},
            # they run until the test's teardown finishes them (`queues`): a group that
            # completed mid-test would no longer count as Running on its slots
            annotations={"kueue.x-k8s.io/pod-group-total-count": str(count)},
        ),
        spec=client.V1PodSpec(restart_policy="Never", containers=[worker]),
    )


def admission_review(nc: NexusController) -> dict[str, Any]:
    """POST an AdmissionReview for a plain pod straight to one replica's webhook."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "userInfo": {"username": "e2e"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "probe", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    tls = ssl.create_default_context(cafile=str(nc.cluster.pki / "ca.crt"))
    req = urllib.request.Request(
        f"https://127.0.0.1:{nc.webhook_port}/pod-gate",
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, context=tls, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def replicas(e2e_cluster: Any) -> Iterator[tuple[NexusController, NexusController, str]]:
    """Replica `a` started first (it takes the Lease), `b` second; the webhook points at b."""
    lease = f"nexus-admit-e2e-{uuid.uuid4().hex[:5]}"
    args = ["--leader-elect", f"--lease-namespace={LEASE_NS}", f"--lease-name={lease}"]
    a = NexusController(e2e_cluster, name="nexus-admit-replica-a", extra_args=args)
    b = NexusController(e2e_cluster, name="nexus-admit-replica-b", extra_args=args)
    b.install()  # CRDs, Kueue objects, and the webhook registered at b's URL
    try:
        a.start()  # ready: synced, and the AdmissionCheck Active (a leads and wrote it)
        wait_for("replica a leads", lambda: is_leader(a), timeout=LEASE_SECONDS + 10)
        b.start()
        yield a, b, lease
    finally:
        for nc in (a, b):
            nc.stop()
        b.uninstall_webhook()
        e2e_cluster.kubectl("delete", "lease", lease, "-n", LEASE_NS, "--ignore-not-found")


@pytest.fixture
def queues(
    e2e_cluster: Any, e2e_namespace: str, custom_objects: client.CustomObjectsApi
) -> Iterator[str]:
    """The nexus-* LocalQueues in the test namespace; afterwards its plain pods are finished
    the way a kubelet would (demo.remove_namespace), or a group still gated would keep
    Kueue's finalizer and its reservation-free namespace Terminating for ever."""
    for tier in ("gold", "silver", "bronze"):
        create_local_queue(custom_objects, e2e_namespace, f"nexus-{tier}", f"nexus-{tier}")
    yield e2e_namespace
    demo.remove_namespace(e2e_cluster, e2e_namespace)


def test_leader_killed_mid_burst_the_follower_takes_over_and_nothing_is_lost(
    replicas, queues, core_v1, batch_v1, custom_objects
):
    a, b, lease = replicas
    ns = queues
    settle_other_namespaces(custom_objects, ns)
    assert not is_leader(b)
    assert lease_holder(custom_objects, lease).endswith(f"_{a.proc.pid}")
    for nc in (a, b):  # both serve the webhook, leader or not
        answer = admission_review(nc)
        assert answer["response"]["allowed"] is True, (nc.name, answer)
    # the apiserver calls the follower's webhook (the URL registered): a plain pod queued
    # under our check is gated there too, though the follower has run no pass
    group = [plain_pod(f"grp-{i}", "grp", 2) for i in range(2)]
    for p in group:
        created = core_v1.create_namespaced_pod(ns, p)
        assert GATE in [g.name for g in created.spec.scheduling_gates or []], "gated by b"

    submit_burst(batch_v1, ns)
    wait_for(
        "the leader placed part of the burst",
        lambda: len(all_reservations(custom_objects, ns)) >= 3,
        timeout=90,
    )
    assert metric(b, "nexus_admit_placements_total") == 0, "the follower answered a Workload"
    placed_by_a = metric(a, "nexus_admit_placements_total")
    assert placed_by_a > 0

    a.proc.send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    a.proc.wait(10)
    wait_for("b leads", lambda: is_leader(b), timeout=LEASE_SECONDS + 4 * RETRY_SECONDS + 10)
    handover = time.monotonic() - t_kill
    assert lease_holder(custom_objects, lease).endswith(f"_{b.proc.pid}")
    # b may take the lease only after a's last renewal went unrenewed for a lease duration
    # (it cannot know a died), and takes it within a few retries after that
    assert handover <= LEASE_SECONDS + 4 * RETRY_SECONDS + 5, f"handover took {handover:.1f}s"

    try:
        what = "every Workload answered after the handover"
        wait_answered(custom_objects, core_v1, ns, what, 120)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{b.log_tail(30)}") from None
    t_all = time.monotonic() - t_kill
    assert_invariants(custom_objects, core_v1, ns)
    admitted = sum(condition(w, "Admitted") == "True" for w in all_workloads(custom_objects, ns))
    assert "became leader" in b.log_tail(200)
    print(
        f"\n[leader] a answered {placed_by_a:.0f} before SIGKILL; b led {handover:.1f}s after "
        f"the kill; all {BURST} answered {t_all:.1f}s after it; {admitted} admitted"
    )


def test_a_leader_stopped_cleanly_hands_over_at_once(replicas, custom_objects):
    """SIGTERM: the leader empties the Lease's holder on the way out, so the follower does
    not wait for it to expire."""
    a, b, lease = replicas
    wait_for("b ready", b.ready, timeout=30)
    t0 = time.monotonic()
    a.stop(signal.SIGTERM)
    wait_for("b leads", lambda: is_leader(b), timeout=LEASE_SECONDS + 10)
    handover = time.monotonic() - t0
    assert "released" in a.log_tail(20)
    assert lease_holder(custom_objects, lease).endswith(f"_{b.proc.pid}")
    assert handover < LEASE_SECONDS, f"b waited for the lease to expire ({handover:.1f}s)"
    print(f"\n[leader] SIGTERM → b leads in {handover:.1f}s")
