"""Small helpers shared by the e2e tests (polling and Kueue object lookups)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import cluster as _cluster
from kubernetes import client

T = TypeVar("T")

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
GPU = "nvidia.com/gpu"

# what the chart's `webhook.gateMode: auto` picks on this plane: the gate policies where the
# apiserver serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (1.36 on), else
# the webhook (the oldest plane, 1.34)
AUTO_GATE_MODE = "policy" if _cluster.kubernetes_line() == "newest" else "webhook"


class WaitTimeout(AssertionError):
    pass


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
