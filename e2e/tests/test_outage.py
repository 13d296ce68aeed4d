"""An outage of nexus-admit stays inside nexus's queues (issue 28, item 3), on the real
control plane:

- with the controller killed, pods of a queue whose ClusterQueue does not list the check
  (a plain pod and a Job's pods) are created and run; before, the webhook's queued-pod
  hook refused the plain pod ("failed calling webhook ... connection refused");
- a pod of a queue that uses the check is still gated at creation, by the apiserver;
- `nexus-admit release` un-strands a gang gated while the controller is down;
- degraded mode: a follower that cannot take the expired Lease marks the AdmissionCheck
  Active=False (NoLeader); once it leads, Active=True again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
from builders import create_local_queue, job
from e2e_util import (
    ADMISSION_GATE,
    GPU,
    KUEUE_GROUP,
    KUEUE_VERSION,
    POD_GROUP_LABEL,
    POD_GROUP_TOTAL_ANNOTATION,
    QUEUE_LABEL,
    all_running,
    pods_with_labels,
    wait_for,
)
from kubernetes import client

from nexus_admit.kube import labels as L

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

CHECK = "nexus-placement"
# KWOK completes the pods: a plain pod still running when its namespace goes keeps Kueue's
# finalizer (its group never finishes) and holds its node for the tests after
COMPLETES = {"pod-complete.stage.kwok.x-k8s.io/delay": "20s"}
GATE = L.GATE_PLACEMENT


def _container(gpus: int) -> client.V1Container:
    return client.V1Container(
        name="c",
        image="registry.invalid/nexus/worker:e2e",
        resources=client.V1ResourceRequirements(
            requests={"cpu": "1", "memory": "1Gi", GPU: str(gpus)}, limits={GPU: str(gpus)}
        ),
    )


def _job(name: str, queue: str, pods: int) -> client.V1Job:
    # KWOK completes them: nothing of this test keeps GPUs busy for the next ones
    return job(name, queue, pods, gpus=1, cpu="1", memory="1Gi", annotations=dict(COMPLETES),
               container_name="c")

def _pod(name: str, queue: str, group: str | None = None, total: int = 1) -> client.V1Pod:
    labels = {QUEUE_LABEL: queue}
    annotations = dict(COMPLETES)
    if group:
        labels[POD_GROUP_LABEL] = group
        annotations[POD_GROUP_TOTAL_ANNOTATION] = str(total)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(restart_policy="Never", containers=[_container(1)]),
    )


def _gates(pod: client.V1Pod) -> list[str]:
    return [g.name for g in pod.spec.scheduling_gates or []]


def _gated_queues(core_v1: client.CoreV1Api) -> dict[str, str]:
    from nexus_controller import GATED_QUEUES_CONFIGMAP, GATED_QUEUES_NAMESPACE

    try:
        cm = core_v1.read_namespaced_config_map(GATED_QUEUES_CONFIGMAP, GATED_QUEUES_NAMESPACE)
    except client.ApiException:
        return {}
    return dict(cm.data or {})


def _active(custom: client.CustomObjectsApi) -> dict[str, Any]:
    ac = custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", CHECK)
    for c in (ac.get("status") or {}).get("conditions") or []:
        if c["type"] == "Active":
            return dict(c)
    return {}


def _gated_by_the_apiserver(core_v1: client.CoreV1Api, ns: str, queue: str) -> bool:
    """Would a pod of `queue` be gated if created now? A server-side dry run goes through
    the same admission (the gate policies read the ConfigMap from an informer, which may
    lag the ConfigMap itself on a loaded machine)."""
    probe = _pod(f"probe-{uuid.uuid4().hex[:6]}", queue)
    return GATE in _gates(core_v1.create_namespaced_pod(ns, probe, dry_run="All"))


def _queues_known(core_v1: client.CoreV1Api, ns: str) -> None:
    """The namespace's queues are listed (`nexus-silver` with its ClusterQueue, `silver`,
    which does not use the check, with "") and the apiserver gates by that list."""
    wait_for(
        "the queue list to name the namespace's queues",
        lambda: (q := _gated_queues(core_v1)).get(f"{ns}.nexus-silver") == "nexus-silver"
        and q.get(f"{ns}.silver") == "",
        timeout=60,
    )
    wait_for(
        "the apiserver to gate by the list",
        lambda: _gated_by_the_apiserver(core_v1, ns, "nexus-silver")
        and not _gated_by_the_apiserver(core_v1, ns, "silver"),
        timeout=60,
    )


@pytest.fixture
def controller_down(nexus_controller: Any):
    """The controller SIGKILLed, its webhook registration and gate policies left in place
    (as a crashed deployment leaves them); started again afterwards."""
    nexus_controller.stop(signal.SIGKILL)
    yield nexus_controller
    nexus_controller.start()


@pytest.fixture
def queues_known_then_down(nexus_namespace: str, core_v1, nexus_controller: Any):
    """The outage comes after the namespace's queues were listed: queues that existed
    before it are unaffected (one created during it is gated until nexus-admit is back)."""
    _queues_known(core_v1, nexus_namespace)
    nexus_controller.stop(signal.SIGKILL)
    yield nexus_controller
    nexus_controller.start()


def test_a_queue_created_a_moment_before_its_pods_is_gated_then_released(
    nexus_namespace: str, core_v1, custom_objects
) -> None:
    """Not listed yet (the controller writes the list on its next pass), a new queue's
    pods are gated to be safe: an unpinned pod of a queue with the check would be placed
    again and again. A pod of a queue without the check then gets the gate lifted as soon
    as Kueue admits it."""
    ns = nexus_namespace
    queue = f"fresh-{uuid.uuid4().hex[:6]}"
    create_local_queue(custom_objects, ns, queue, "silver")
    created = core_v1.create_namespaced_pod(ns, _pod("fresh", queue))
    if GATE in _gates(created):  # the usual case: the list did not name it yet
        wait_for(
            "the ungater to lift the gate of a pod whose queue does not use the check",
            lambda: GATE not in _gates(core_v1.read_namespaced_pod("fresh", ns)),
            timeout=90,
        )
    wait_for(
        "the pod Running",
        lambda: all_running([core_v1.read_namespaced_pod("fresh", ns)], 1),
        timeout=90,
    )
    wait_for("the pod finished", lambda: core_v1.read_namespaced_pod("fresh", ns).status.phase
             == "Succeeded", timeout=90)


def test_the_controller_keeps_the_gated_queue_list(nexus_namespace: str, core_v1) -> None:
    ns = nexus_namespace
    listed = wait_for(
        "the gated-queues ConfigMap to list the namespace's nexus queues",
        lambda: (q := _gated_queues(core_v1)) and f"{ns}.nexus-silver" in q and q,
        timeout=60,
    )
    assert listed[f"{ns}.nexus-silver"] == "nexus-silver"
    assert listed.get(f"{ns}.silver") == "", "a queue without the check is listed as not ours"


def test_controller_down_pods_of_a_queue_without_the_check_are_created_and_run(
    nexus_namespace: str, core_v1, batch_v1, queues_known_then_down
) -> None:
    ns = nexus_namespace
    # before: "failed calling webhook queued-pod-gate...: connection refused"
    plain = core_v1.create_namespaced_pod(ns, _pod("plain", "silver"))
    assert GATE not in _gates(plain)
    batch_v1.create_namespaced_job(ns, _job("plain-job", "silver", 2))
    # a pod of a queue that uses the check is still gated at creation, by the apiserver
    ours = core_v1.create_namespaced_pod(ns, _pod("ours", "nexus-silver"))
    assert GATE in _gates(ours)
    wait_for(
        "the plain pod Running",
        lambda: all_running([core_v1.read_namespaced_pod("plain", ns)], 1),
        timeout=90,
    )
    wait_for(
        "the Job's 2 pods Running",
        lambda: all_running(pods_with_labels(core_v1, ns, "job-name=plain-job"), 2),
        timeout=90,
    )
    assert GATE in _gates(core_v1.read_namespaced_pod("ours", ns)), "nobody lifted our gate"
    # gone before the controller is back: placed as the namespace goes, it would keep
    # Kueue's finalizer and its node for the tests after
    core_v1.delete_namespaced_pod("ours", ns)
    wait_for(
        "the gated pod gone",
        lambda: not pods_with_labels(core_v1, ns, f"{QUEUE_LABEL}=nexus-silver"),
        timeout=60,
    )


def _release(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "nexus-admit")
    return subprocess.run(
        [exe, "release", f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_release_unstrands_a_gang_gated_while_the_controller_is_down(
    nexus_namespace: str, e2e_cluster, core_v1, batch_v1, custom_objects, queues_known_then_down
) -> None:
    ns = nexus_namespace
    group = f"grp-{uuid.uuid4().hex[:6]}"
    for i in range(2):
        created = core_v1.create_namespaced_pod(
            ns, _pod(f"{group}-{i}", "nexus-silver", group=group, total=2)
        )
        assert {GATE, ADMISSION_GATE} <= set(_gates(created))
    batch_v1.create_namespaced_job(ns, _job("stranded", "nexus-silver", 2))

    def pending_checks() -> int:
        items = custom_objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, ns, "workloads"
        )["items"]
        return sum(
            1
            for w in items
            for c in (w.get("status") or {}).get("admissionChecks") or []
            if c.get("name") == CHECK and c.get("state") == "Pending"
        )

    wait_for("both Workloads waiting on the check", lambda: pending_checks() == 2, timeout=60)

    dry = _release(e2e_cluster, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: 2 check(s) answered" in dry.stdout
    assert pending_checks() == 2, "--dry-run wrote something"

    done = _release(e2e_cluster)
    assert done.returncode == 0, done.stderr
    assert f"ungate  Pod {ns}/{group}-0" in done.stdout
    wait_for(
        "the pod group Running",
        lambda: all_running(pods_with_labels(core_v1, ns, f"{POD_GROUP_LABEL}={group}"), 2),
        timeout=90,
    )
    wait_for(
        "the Job's pods Running",
        lambda: all_running(pods_with_labels(core_v1, ns, "job-name=stranded"), 2),
        timeout=90,
    )
    again = _release(e2e_cluster)
    assert again.returncode == 0 and "nothing waits on nexus-admit" in again.stdout, again.stdout
    wait_for(
        "the pod group finished (nothing left for the tests after)",
        lambda: all(p.status.phase == "Succeeded" for p in
                    pods_with_labels(core_v1, ns, f"{POD_GROUP_LABEL}={group}")),
        timeout=120,
    )


LEASE = "nexus-admit-outage"


def _lease_held_by_a_dead_replica(now: str) -> tuple[dict[str, Any], ...]:
    """The Lease a dead replica holds, and a ValidatingAdmissionPolicy with its binding
    that refuses every write to it."""
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "default"},
        "spec": {
            "holderIdentity": "dead-replica",
            "leaseDurationSeconds": 3,
            "renewTime": now,
            "acquireTime": now,
        },
    }
    vap = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": LEASE},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["leases"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.metadata.name != '{LEASE}'",
                    "message": "e2e: this Lease cannot be written",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": LEASE},
        "spec": {"policyName": LEASE, "validationActions": ["Deny"]},
    }
    return lease, vap, binding


def test_degraded_a_follower_marks_the_check_inactive_while_nobody_leads(
    e2e_cluster, custom_objects, controller_down
) -> None:
    """The Lease is held by a dead replica and a ValidatingAdmissionPolicy refuses every
    write to it: the follower cannot lead, and says so on the AdmissionCheck."""
    from nexus_controller import NexusController

    kubectl = e2e_cluster.kubectl
    now = subprocess.run(
        ["date", "-u", "+%Y-%m-%dT%H:%M:%S.000000Z"], capture_output=True, text=True, check=True
    ).stdout.strip()
    lease, vap, binding = _lease_held_by_a_dead_replica(now)
    follower = NexusController(
        e2e_cluster,
        name="nexus-admit-follower",
        extra_args=[
            "--leader-elect",
            "--lease-namespace=default",
            f"--lease-name={LEASE}",
            "--lease-seconds=3",
            "--renew-deadline-seconds=2",
            "--lease-retry-seconds=1",
            "--degraded-after-seconds=5",
            "--leader-identity=follower",
        ],
    )
    try:
        e2e_cluster.apply([lease])
        e2e_cluster.apply([vap, binding])
        probe = {**lease, "spec": {**lease["spec"], "holderIdentity": "probe"}}

        def refused() -> bool:
            r = kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",  # the Lease was applied by another manager
                "--dry-run=server",
                "-f",
                "-",
                input=json.dumps(probe),
                check=False,
            )
            return r.returncode != 0 and "cannot be written" in r.stderr

        wait_for("the policy refusing Lease writes", refused, timeout=30)
        follower.start(wait=False)
        cond = wait_for(
            "the AdmissionCheck Active=False (NoLeader)",
            lambda: (c := _active(custom_objects)).get("reason") == "NoLeader" and c,
            timeout=90,
        )
        assert cond["status"] == "False"
        assert "no nexus-admit replica has led" in cond["message"]
        assert "dead-replica" in cond["message"]
        # the way back: the Lease can be taken again, the follower leads, Active=True
        kubectl("delete", "validatingadmissionpolicybinding", LEASE, check=False)
        wait_for(
            "the AdmissionCheck Active=True again",
            lambda: _active(custom_objects).get("status") == "True",
            timeout=90,
        )
    finally:
        follower.stop()
        for kind, name in (
            ("validatingadmissionpolicybinding", LEASE),
            ("validatingadmissionpolicy", LEASE),
        ):
            kubectl("delete", kind, name, "--ignore-not-found", check=False)
        kubectl("delete", "lease", LEASE, "-n", "default", "--ignore-not-found", check=False)
