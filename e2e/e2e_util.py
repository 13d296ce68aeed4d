"""Small helpers shared by the e2e tests (polling and Kueue object lookups)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import cluster as _cluster
import pytest
from kubernetes import client

from nexus_admit.kube import labels as L

T = TypeVar("T")

KUEUE_GROUP, KUEUE_VERSION = L.KUEUE_API_GROUP, L.KUEUE_API_VERSION

QUEUE_LABEL = L.KUEUE_QUEUE_NAME_LABEL
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
GPU = L.GPU_RESOURCE

# e2e/versions.env: which workload controllers are pinned (built and run)
VERSIONS = dict(
    line.split("=", 1)
    for line in (Path(__file__).resolve().parent / "versions.env").read_text().splitlines()
    if line and not line.startswith("#")
)


def require_controller(
    variable: str, controller: str, crd: str, custom_objects: client.CustomObjectsApi
) -> None:
    """Skip when the workload controller is not pinned or not asked for
    (NEXUS_E2E_CONTROLLERS); otherwise its CRD must be served."""
    if not VERSIONS.get(variable):
        pytest.skip(f"{variable} is empty in e2e/versions.env: the controller is not built")
    wanted = os.environ.get("NEXUS_E2E_CONTROLLERS")
    if wanted is not None and controller not in wanted.split(","):
        pytest.skip(f"NEXUS_E2E_CONTROLLERS={wanted!r} leaves {controller} out")
    ext = client.ApiextensionsV1Api(custom_objects.api_client)
    ext.read_custom_resource_definition(crd)  # 404 here: pinned but not installed


# what the chart's `webhook.gateMode: auto` picks on this plane: the gate policies where the
# apiserver serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (1.36 on), else
# the webhook (the oldest plane, 1.34)
AUTO_GATE_MODE = "policy" if _cluster.kubernetes_line() == "newest" else "webhook"


class WaitTimeout(AssertionError):
    pass


def kueue_object_gone(custom: client.CustomObjectsApi, plural: str, name: str) -> bool:
    """Whether the cluster-scoped Kueue object is absent (404); Kueue's finalizers keep a
    deleted ClusterQueue or AdmissionCheck while anything still uses it."""
    try:
        custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
    except client.ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def wait_for(
    what: str, fn: Callable[[], T | None], timeout: float = 60, interval: float = 0.5
) -> T:
    """Poll `fn` until it returns something truthy; fail the test with `what` otherwise."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last: Any = None
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            last_exc = None
            if last:
                print(f"[wait_for] {what}: {time.monotonic() - t0:.1f}s")
                return last
        except client.ApiException as e:  # transient API errors are retried
            last_exc = e
        time.sleep(interval)
    detail = f"; last error: {last_exc}" if last_exc else f"; last value: {last!r}"
    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def wait_fleet_clear(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, timeout: float = 120
) -> None:
    """Wait (best effort) until no pod of another test namespace is bound on the fleet and
    no reservation of one holds capacity. Earlier tests' namespaces are deleted in the
    background; a test that asserts where a gang lands (one rack) must be placed on the
    whole fleet, not on what their teardown has not freed yet. A namespace that does not
    go within `timeout` is not waited for again (some teardowns hang on a finalizer)."""
    left: dict[str, str] = {}

    def clear() -> bool:
        left.clear()
        for p in core.list_pod_for_all_namespaces().items:
            other = p.metadata.namespace
            if (other != ns and other.startswith("e2e-") and other not in _NOT_CLEARED
                    and p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")):
                left.setdefault(other, f"pod {p.metadata.name}")
        for r in custom.list_cluster_custom_object(
                L.API_GROUP, L.API_VERSION, "resourcereservations")["items"]:
            other = r["metadata"]["namespace"]
            if other != ns and other not in _NOT_CLEARED:
                left.setdefault(other, f"reservation {r['metadata']['name']}")
        return not left

    try:
        wait_for("earlier tests' pods and reservations off the fleet", clear, timeout=timeout)
    except WaitTimeout:
        _NOT_CLEARED.update(left)
        print(f"[wait_fleet_clear] still on the fleet, going on: {sorted(left.items())[:10]}")


_NOT_CLEARED: set[str] = set()


def condition(obj: dict[str, Any], ctype: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c.get("status")
    return None


def workloads(custom: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads")[
        "items"
    ]


def workload_owned_by(
    custom: client.CustomObjectsApi, namespace: str, owner_uid: str
) -> dict | None:
    for wl in workloads(custom, namespace):
        for ref in wl["metadata"].get("ownerReferences") or []:
            if ref.get("uid") == owner_uid:
                return wl
    return None


def pods_with_labels(core: client.CoreV1Api, namespace: str, selector: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(namespace, label_selector=selector).items


def all_running(pods: list[client.V1Pod], count: int) -> bool:
    return len(pods) == count and all(
        p.status.phase == "Running" and p.spec.node_name for p in pods
    )


MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPIJOBS = ("kubeflow.org", "v2beta1", "mpijobs")  # group, version, plural


def mpijob(
    name: str, launcher: dict[str, Any], worker: dict[str, Any], workers: int,
    labels: dict[str, str] | None = None, **spec: Any,
) -> dict[str, Any]:
    """An MPIJob of one launcher and `workers` workers from two pod specs; their first
    container runs `mpirun` (never run: KWOK fakes the kubelet)."""

    def replica(count: int, pod: dict[str, Any]) -> dict[str, Any]:
        containers = [{**pod["containers"][0], "command": ["mpirun", "hostname"]},
                      *pod["containers"][1:]]
        return {"replicas": count, "template": {"spec": {**pod, "containers": containers}}}

    return {
        "apiVersion": f"{MPIJOBS[0]}/{MPIJOBS[1]}",
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {**spec, "mpiReplicaSpecs": {"Launcher": replica(1, launcher),
                                             "Worker": replica(workers, worker)}},
    }


@contextlib.contextmanager
def mpijob_deleted_after(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, namespace: str, name: str
) -> Iterator[None]:
    """Delete the MPIJob at the end of the block and wait until its pods are gone, before
    the test's namespace is deleted.

    Why: the MPI operator's launcher Job has `podReplacementPolicy: Failed`, so the Job
    controller keeps the launcher pod's tracking finalizer until the pod is terminal, and
    KWOK deletes a pod without ever making it terminal, as a kubelet would. A namespace's
    deletion takes its pods first (Kubernetes' ordered namespace deletion), so the
    launcher would stay Terminating and the namespace with it, and the tests after it
    that wait for other namespaces to settle would fail. Deleted first, the MPIJob takes
    its Job with it, and the Job controller frees the pods of a Job that is gone."""
    try:
        yield
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                *MPIJOBS[:2], namespace, MPIJOBS[2], name, propagation_policy="Background")
        wait_for(f"MPIJob {name}'s pods gone", lambda: not core.list_namespaced_pod(
            namespace, label_selector=f"{MPI_JOB_NAME_LABEL}={name}").items, timeout=90)


def metric(nc: Any, name: str, labels: str = "") -> float:
    """The sum of a metric's samples on a controller's /metrics (a `NexusController`),
    those whose labels contain `labels` (e.g. 'answer="pinned"')."""
    total = 0.0
    for line in nc.metrics().splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total
